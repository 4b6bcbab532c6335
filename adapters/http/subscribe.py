"""Subscribe authorisation, one rule for every transport: ``subscribe_allowed(info, channel) -> bool``.

Why: targeting (a message's ``user_ids``/``group_ids``/``client_ids``) decides who may see one message; nothing
decided who may read a channel at all, its backlog and its ids included. The app's hook answers that. It is asked
once per channel per request (a poll) or per connection (SSE, WebSocket, guble: the verdict is kept for the
connection's life), with a :class:`RequestInfo`: the request and what the middleware's lookups already returned
for it, so the hook needs no second session lookup. A refused channel delivers nothing: no message, no backlog,
no last id, no ``/__status`` entry. How a client is told depends on its transport
(docs/protocol.md, "Subscribe authorisation"): on a poll the channel is left out of the answer and named in the
:data:`REFUSED_HEADER`; SSE, WebSocket, guble and REST: docs/transports.md.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from .waiter import Lookups

__all__ = [
    "REFUSED_HEADER",
    "RequestInfo",
    "SubscribeAllowed",
    "ask",
    "check_subscribe_allowed",
    "refused_header",
    "request_info",
    "verdict",
]

#: The poll answer's header naming the channels the hook refused (comma separated, each percent-encoded). The
#: gem's clients ignore it and keep waiting; it is there for a developer reading the network panel.
REFUSED_HEADER = "shmbus-refused-channels"


@dataclass(frozen=True)
class RequestInfo:
    """Who asks to read a channel: the request (the WSGI environ or ASGI scope; under Django the ``HttpRequest``)
    and what the lookups returned for it (None/empty where a transport or app has no such lookup)."""

    request: Any
    client_id: str | None = None
    user_id: Any = None
    group_ids: frozenset[Any] = frozenset()
    site_id: str | None = None


#: ``subscribe_allowed(info, channel)``: true lets the request read ``channel``; on ASGI it may be a coroutine
#: function. It may raise: a poll then fails as when a lookup raises.
SubscribeAllowed = Callable[[RequestInfo, str], Any]


def check_subscribe_allowed(hook: Any) -> None:
    """Refuse a hook that cannot be called, at construction rather than at the first request."""
    if hook is not None and not callable(hook):
        raise TypeError(f"subscribe_allowed must be callable (info, channel) -> bool, got {hook!r}")


def request_info(request: Any, client_id: str | None, lookups: Lookups) -> RequestInfo:
    """The hook's :class:`RequestInfo` (the flow calls it as a lookup step, so ``request`` is the shell's own)."""
    return RequestInfo(request, client_id, lookups.user_id, lookups.group_ids, lookups.site_id)


def ask(_request: Any, hook: SubscribeAllowed, info: RequestInfo, channel: str) -> Any:
    """One question to the hook, as a lookup step (the shell awaits the answer where it can)."""
    return hook(info, channel)


def verdict(value: Any) -> bool:
    """The hook's answer as a verdict. An awaitable here was never awaited (a WSGI shell, or a plain function that
    returned a coroutine): it must not count as true, so it is an error, never a silent yes."""
    if inspect.isawaitable(value):
        if inspect.iscoroutine(value):
            value.close()
        raise TypeError("subscribe_allowed returned an awaitable where none can be awaited: make it a plain function")
    return bool(value)


def refused_header(channels: Iterable[str]) -> tuple[str, str]:
    """:data:`REFUSED_HEADER` naming ``channels`` (percent-encoded: names may hold commas and any character)."""
    return REFUSED_HEADER, ",".join(quote(ch, safe="/") for ch in channels)
