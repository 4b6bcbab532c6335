"""The push REST app (ASGI :class:`PushApp`, WSGI :class:`PushWSGIApp`): a signed-in browser registers its devices.

Routes under ``prefix`` (default ``/push/``); bodies and answers are JSON:

* ``GET key`` -> ``{"publicKey": ...}``: the VAPID ``applicationServerKey`` for ``pushManager.subscribe``.
* ``POST subscriptions`` ``{"subscription": <PushSubscription.toJSON()>, "topics": ["/chat/1", ...]}`` -> 201:
  register (or move) this device for the user ``user_id_lookup`` names; topics are guble-style prefixes, each a
  pushing channel, and under ``/user/`` only the user's own space. A user has at most ``max_devices`` (20)
  devices: a new one beyond that is 409 (each device is stored, pushed to and, on its own push service, given
  worker threads: no user may multiply that without bound).
* ``GET subscriptions`` -> ``{"subscriptions": [{"endpoint", "topics", "created"}]}``: the user's own devices.
* ``DELETE subscriptions`` ``{"endpoint": ...}`` -> ``{"removed": true|false}``: only the user's own.
* ``GET message?channel=<c>&id=<message id>`` -> the message's push payload with its data: what a service worker
  fetches after a *fetch notice* (a message too large to push); 404 unless this user may receive it.

No user (``user_id_lookup`` returns None) is 403 everywhere but ``key``. ``POST`` and ``DELETE`` need
``Content-Type: application/json`` (415 otherwise): no cross-site form can send it, which keeps another site from
registering its endpoint for a signed-in user. Bad input is a 4xx with a reason; the
store's failures are 503. Lookups are the middleware's (``user_id_lookup``, ``group_ids_lookup``,
``site_id_lookup``), called with the scope or environ.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qs

from shmbus.errors import ShmbusError

from ..asgi_support import Receive, Scope, Send, fallback, read_body, relative_path, send_simple
from ..http import ProtocolError
from ..transports.identity import Identity, LookupOptions
from ..wsgi_support import Environ, StartResponse, start_whole
from .addresses import endpoint_port
from .connector import PushConnector
from .options import message_options
from .subscriptions import default_endpoint_allowed, may_receive, parse_registration

__all__ = ["PushApp", "PushWSGIApp"]

JSON_TYPE = "application/json; charset=utf-8"
MAX_BODY = 16 * 1024
_METHODS = {"key": ("GET",), "subscriptions": ("GET", "POST", "DELETE"), "message": ("GET",)}
Answer = tuple[int, bytes]


def _json(status: int, value: Any) -> Answer:
    return status, json.dumps(value, separators=(",", ":")).encode()


class _PushRoutes:
    """Both shells' logic, sans-IO: route a request, then answer it from its identity and body."""

    def __init__(
        self,
        app: Callable[..., Any] | None = None,
        *,
        connector: PushConnector,
        prefix: str = "/push/",
        allow_endpoint: Callable[[str], bool] = default_endpoint_allowed,
        user_id_lookup: Callable[[Any], Any] | None = None,
        group_ids_lookup: Callable[[Any], Any] | None = None,
        site_id_lookup: Callable[[Any], Any] | None = None,
        max_devices: int = 20,
    ) -> None:
        if not prefix.startswith("/") or not prefix.endswith("/"):
            raise ValueError(f"prefix must start and end with '/', got {prefix!r}")
        if user_id_lookup is None:
            raise TypeError("user_id_lookup is required: push subscriptions belong to a signed-in user")
        self.app = app
        self.connector = connector
        self.prefix = prefix
        self.allow_endpoint = allow_endpoint
        self.max_devices = max_devices
        self.lookups = LookupOptions(user_id_lookup, group_ids_lookup, site_id_lookup)

    def route(self, method: str, path: str) -> str | None:
        """The route name (None: not ours); 404/405 as ProtocolError."""
        if not path.startswith(self.prefix):
            return None
        name = path[len(self.prefix) :]
        if name not in _METHODS:
            raise ProtocolError(404, f"no such push route; known: {', '.join(_METHODS)}")
        if method not in _METHODS[name]:
            raise ProtocolError(405, f"use {' or '.join(_METHODS[name])}")
        return name

    def answer(self, name: str, method: str, query: str, body: bytes, who: Identity) -> Answer:
        """Everything after the lookups (runs in a thread under ASGI: the store blocks)."""
        if name == "key":
            return _json(200, {"publicKey": self.connector.vapid.public_key})
        user = who.lookups.user_id
        if user is None:
            raise ProtocolError(403, "sign in first: push subscriptions belong to a user")
        store = self.connector.store
        try:
            if name == "message":
                return self._message(query, who)
            if method == "GET":
                subs = [{"endpoint": r.endpoint, "topics": list(r.topics), "created": r.created}
                        for r in store.of_user(user)]  # fmt: skip
                return _json(200, {"subscriptions": subs})
            data = _parse_json(body)
            if method == "DELETE":
                endpoint = data.get("endpoint") if isinstance(data, dict) else None
                if not isinstance(endpoint, str):
                    raise ProtocolError(400, 'body must be {"endpoint": "<the subscription endpoint>"}')
                return _json(200, {"removed": store.remove(endpoint, user)})
            reg = parse_registration(
                data, user, who.lookups.site_id, self.connector.pushes, self.allow_endpoint, time.time()
            )
            self._check_port(reg.endpoint)
            mine = store.of_user(user)
            if len(mine) >= self.max_devices and all(r.endpoint != reg.endpoint for r in mine):
                raise ProtocolError(409, f"{len(mine)} devices registered (at most {self.max_devices}); remove one")
            store.add(reg)
            return _json(201, {"endpoint": reg.endpoint, "topics": list(reg.topics)})
        except ProtocolError:
            raise
        except (ShmbusError, OSError, RuntimeError, ValueError) as exc:
            raise ProtocolError(503, f"push store unavailable: {type(exc).__name__}") from exc
        except Exception as exc:  # psycopg's errors and the like: the store, not the request
            if type(exc).__module__.startswith("psycopg"):
                raise ProtocolError(503, f"push store unavailable: {type(exc).__name__}") from exc
            raise

    def _check_port(self, endpoint: str) -> None:
        """Refuse at registration what the sender would refuse at every push (``allow_ports``): the user learns
        it now, with the reason, not as pushes that never arrive."""
        ports, port = self.connector.lane_options.allow_ports, endpoint_port(endpoint)
        if ports is not None and port not in ports:
            shown = ", ".join(map(str, sorted(ports)))
            raise ProtocolError(403, f"subscription.endpoint's port {port} is not allowed (allow_ports: {shown})")

    def _message(self, query: str, who: Identity) -> Answer:
        params = parse_qs(query, max_num_fields=10)
        channel = (params.get("channel") or [""])[-1]
        raw_id = (params.get("id") or [""])[-1]
        if not channel.startswith("/") or not raw_id.isdigit() or len(raw_id) > 18:
            raise ProtocolError(400, "use ?channel=<channel>&id=<message id>")
        mid = int(raw_id)
        if not self.connector.pushes(channel) or mid < 1:
            raise ProtocolError(404, "no such message")
        bus = self.connector.bus
        lk = who.lookups
        try:
            found = [m for m in bus.backlog(channel, mid - 1, lk.site_id or "", limit=1) if m.message_id == mid]
        except ShmbusError as exc:
            raise ProtocolError(400, str(exc)[:200]) from None
        if not found or not may_receive(found[0], lk.user_id, lk.site_id, lambda: lk.group_ids, bus):
            raise ProtocolError(404, "no such message")  # the same answer: no way to probe for others' messages
        msg = found[0]
        data = message_options(msg, self.connector.default_options)[1]
        return 200, json.dumps({"channel": msg.channel, "message_id": msg.message_id, "global_id": msg.global_id,
                                "data": data}, separators=(",", ":"), default=str).encode()  # fmt: skip


def _parse_json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        raise ProtocolError(400, "body must be JSON") from None


def _check_json_type(method: str, content_type: str | None) -> None:
    """Changes need ``Content-Type: application/json``: a type no cross-site form can send, so a browser asks the
    server first (CORS) and another site cannot register its own endpoint for a signed-in user (CSRF)."""
    if method in ("POST", "DELETE"):
        ctype = (content_type or "").split(";")[0].strip().lower()
        if ctype != "application/json":
            raise ProtocolError(415, "send the body as Content-Type: application/json")


def _content_length(value: Any) -> None:
    if value in (None, ""):
        return
    if not str(value).isdigit():
        raise ProtocolError(400, "invalid Content-Length")
    _check_size(int(value))


def _check_size(size: int) -> None:
    if size > MAX_BODY:
        raise ProtocolError(413, f"body over {MAX_BODY} bytes")


class PushApp(_PushRoutes):
    """ASGI: the push routes under ``prefix``; anything else goes to ``app`` (or 404)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await fallback(self.app, scope, receive, send)
            return
        method = scope.get("method", "GET")
        try:
            name = self.route(method, relative_path(scope))
            if name is None:
                await fallback(self.app, scope, receive, send)
                return
            headers = {k.lower(): v for k, v in scope.get("headers") or ()}
            cl = headers.get(b"content-length")
            _content_length(cl.decode("latin-1") if cl is not None else None)
            ctype = headers.get(b"content-type")
            _check_json_type(method, ctype.decode("latin-1") if ctype is not None else None)
            body = await read_body(receive, _check_size) if method in ("POST", "DELETE") else b""
            who = await self.lookups.identity(scope, {})
            query = scope.get("query_string", b"").decode("latin-1")
            status, out = await asyncio.to_thread(self.answer, name, method, query, body, who)
        except ProtocolError as exc:
            await send_simple(send, exc.status, exc.reason.encode())
            return
        await send_simple(send, status, out, JSON_TYPE, [(b"cache-control", b"no-store")])


class PushWSGIApp(_PushRoutes):
    """WSGI twin of :class:`PushApp` (lookups get the environ and must be plain functions)."""

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD", "GET")
        try:
            try:
                path = environ.get("PATH_INFO", "").encode("latin-1").decode("utf-8")
            except (UnicodeEncodeError, UnicodeDecodeError):
                raise ProtocolError(400, "request path is not valid UTF-8") from None
            name = self.route(method, path)
            if name is None:
                if self.app is not None:
                    result: Iterable[bytes] = self.app(environ, start_response)
                    return result
                raise ProtocolError(404, "not found")
            _content_length(environ.get("CONTENT_LENGTH"))
            _check_json_type(method, environ.get("CONTENT_TYPE"))
            body = b""
            if method in ("POST", "DELETE") and environ.get("wsgi.input") is not None:
                body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0) or MAX_BODY + 1)
                if len(body) > MAX_BODY:
                    raise ProtocolError(413, f"body over {MAX_BODY} bytes")
            who = self.lookups.identity_sync(environ, {})
            status, out = self.answer(name, method, environ.get("QUERY_STRING", ""), body, who)
            headers = [("content-type", JSON_TYPE), ("cache-control", "no-store")]
        except ProtocolError as exc:
            status, out, headers = exc.status, exc.reason.encode(), [("content-type", "text/plain; charset=utf-8")]
        return start_whole(start_response, status, headers, out)
