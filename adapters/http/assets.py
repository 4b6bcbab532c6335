"""The browser client, served by the middleware so a page needs no copying and no npm.

``GET <base_route>message-bus/assets/message-bus.js`` is the npm package ``message-bus-client``'s
``assets/message-bus.js`` (vendored unchanged in ``static/`` with its MIT license), and
``.../assets/message-bus-ajax.js`` is shmbus's own XMLHttpRequest adapter for it: the npm client needs jQuery or
an adapter in ``MessageBus.ajax``, and the gem's adapter is not on npm. An XMLHttpRequest (not ``fetch``) because
the client reads a streamed reply through the request object's ``onprogress`` and ``responseText``. Loaded from
this route, the adapter also sets ``MessageBus.baseUrl`` to the route's base, so an app under
``base_route="/app/"`` needs no configuration either. ``.../assets/message-bus-shared.js`` is shmbus's client with
the npm client's API whose tabs share one poll per browser (a SharedWorker, else a leader tab: see
docs/shared-worker.md). ``serve_assets=False`` turns the route off.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from .wire import ProtocolError, Response

__all__ = ["ASSETS", "NPM_CLIENT", "SHARED_CLIENT", "asset_response"]

STATIC = Path(__file__).resolve().parent / "static"
#: The npm client and its adapter, loaded in this order by a page.
NPM_CLIENT = ("message-bus.js", "message-bus-ajax.js")
#: The client whose tabs share one poll (a page loads it alone; it is its own SharedWorker script too).
SHARED_CLIENT = "message-bus-shared.js"
#: Served file names (under ``<prefix>assets/``).
ASSETS = (*NPM_CLIENT, SHARED_CLIENT)
_HEADERS = [
    ("content-type", "text/javascript; charset=utf-8"),
    ("cache-control", "public, max-age=3600"),
    ("x-content-type-options", "nosniff"),
]


@lru_cache(maxsize=len(ASSETS))
def _read(name: str) -> bytes:
    return (STATIC / name).read_bytes()


def asset_response(method: str, name: str) -> Response:
    """The response to ``method`` on ``<prefix>assets/<name>``: the file, 404 for an unknown name, 405 unless
    GET or HEAD (the shell sends no body for HEAD)."""
    if name not in ASSETS:
        raise ProtocolError(404, f"no such asset; served: {', '.join(ASSETS)}")
    if method not in ("GET", "HEAD"):
        raise ProtocolError(405, "assets are read with GET")
    return Response(200, list(_HEADERS), _read(name))
