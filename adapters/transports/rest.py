"""REST publish (guble's ``POST /api/message/<topic>``): ``POST <prefix><channel...>`` as an ASGI and a WSGI app.

Why: lets any process that speaks HTTP (a webhook, a shell script, another host) publish without linking shmbus,
and lets a web app expose publishing with its own authorisation. The body is the message: JSON when the content
type is ``application/json`` (or ``+json``), otherwise UTF-8 text (``text/*`` or no content type). Query
parameters: ``user_ids``, ``group_ids``, ``client_ids`` (comma separated and/or repeated; digits-only ids become
integers, as the middleware's lookups usually return them) and ``site_id``. The answer is
``{"channel": ..., "message_id": ...}``.

``authorize(environ_or_scope, channel) -> bool`` is mandatory (there is no allow-all default); ASGI accepts a
coroutine function too. Every refusal is a precise 4xx with a text reason: 404 (not under the prefix, when no
wrapped app), 405 (not POST), 400 (channel syntax, unknown/invalid query parameter, invalid JSON/UTF-8, a target
the bus refuses), 403 (not authorised; checked before the body is read), 413 (body over ``max_body_size`` or a
record the ring cannot hold), 415 (other content types), 503 (the bus is ``off()``).

``subscribe_allowed(info, channel)`` (the middleware's hook; ``info.request`` is the environ or scope, REST has no
other lookups): when given and it refuses the channel, the answer leaves ``message_id`` out, since the id would
tell a publisher who may not read the channel how many messages it holds.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from shmbus.bus import Bus
from shmbus.errors import InvalidChannel, InvalidMessage, PayloadTooLarge

from ..asgi_support import Receive, Scope, Send, fallback, maybe_await, read_body, relative_path, send_simple
from ..http import MAX_BODY_SIZE, MAX_CLIENT_ID_LENGTH, ProtocolError
from ..http.subscribe import RequestInfo, SubscribeAllowed, check_subscribe_allowed, verdict
from ..wsgi_support import Environ, StartResponse, start_simple
from .validation import check_client_channel

__all__ = ["AsgiRestPublish", "PublishRequest", "WsgiRestPublish", "parse_publish"]

JSON_TYPE = "application/json; charset=utf-8"
_TARGET_PARAMS = ("user_ids", "group_ids", "client_ids")
_MAX_TARGETS = 10_000


@dataclass
class PublishRequest:
    channel: str
    data: Any = None
    user_ids: list[Any] | None = None
    group_ids: list[Any] | None = None
    client_ids: list[str] | None = None
    site_id: str | None = None


def _norm_prefix(prefix: str) -> str:
    if not prefix.startswith("/") or not prefix.endswith("/"):
        raise ValueError(f"prefix must start and end with '/', got {prefix!r}")
    return prefix


def route(method: str, path: str, prefix: str) -> str | None:
    """The channel a path names (None when the path is not under ``prefix``); 405/400 as ProtocolError."""
    if not path.startswith(prefix):
        return None
    if method != "POST":
        raise ProtocolError(405, "use POST")
    rest = path[len(prefix) :]
    if not rest:
        raise ProtocolError(400, f"missing channel: POST {prefix}<channel>")
    return check_client_channel("/" + rest)


def _id_list(name: str, values: list[str]) -> list[Any]:
    out: list[Any] = []
    for v in values:
        for part in v.split(","):
            part = part.strip()
            if not part or len(part) > MAX_CLIENT_ID_LENGTH:
                raise ProtocolError(400, f"{name}: ids must be 1-{MAX_CLIENT_ID_LENGTH} characters")
            if name != "client_ids" and part.lstrip("-").isdigit() and len(part) < 19:
                out.append(int(part))
            else:
                out.append(part)
    if len(out) > _MAX_TARGETS:
        raise ProtocolError(400, f"{name}: at most {_MAX_TARGETS} ids")
    return out


def parse_publish(channel: str, query: str, content_type: str | None, body: bytes) -> PublishRequest:
    """Query and body of an authorised publish -> :class:`PublishRequest` (ProtocolError on bad input)."""
    try:
        params = parse_qs(query, keep_blank_values=True, errors="strict", max_num_fields=1000)
    except (UnicodeDecodeError, ValueError):
        raise ProtocolError(400, "malformed query string")
    unknown = sorted(set(params) - {*_TARGET_PARAMS, "site_id"})
    if unknown:
        raise ProtocolError(
            400, f"unknown query parameter(s) {unknown}; known: user_ids, group_ids, client_ids, site_id"
        )
    req = PublishRequest(channel)
    req.user_ids = _id_list("user_ids", params["user_ids"]) if "user_ids" in params else None
    req.group_ids = _id_list("group_ids", params["group_ids"]) if "group_ids" in params else None
    req.client_ids = _id_list("client_ids", params["client_ids"]) if "client_ids" in params else None
    if "site_id" in params:
        site = params["site_id"][-1]
        if not site:
            raise ProtocolError(400, "site_id must not be empty")
        req.site_id = site
    ctype = (content_type or "").split(";")[0].strip().lower()
    if ctype == "application/json" or ctype.endswith("+json"):
        try:
            req.data = json.loads(body)
        except ValueError as exc:
            raise ProtocolError(400, f"invalid JSON body: {exc}"[:200])
        except RecursionError:
            raise ProtocolError(400, "invalid JSON body: nested too deeply")
    elif not ctype or ctype.startswith("text/"):
        try:
            req.data = body.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError(400, "text body is not valid UTF-8")
    else:
        raise ProtocolError(415, "unsupported content type (use application/json or text/plain)")
    return req


def publish(bus: Bus, req: PublishRequest, show_id: bool = True) -> bytes:
    """Publish and return the JSON answer (without the message id unless ``show_id``); bus refusals become
    4xx/503."""
    mid = publish_or_refuse(
        bus,
        req.channel,
        req.data,
        user_ids=req.user_ids,
        group_ids=req.group_ids,
        client_ids=req.client_ids,
        site_id=req.site_id,
    )
    return json.dumps({"channel": req.channel, "message_id": mid} if show_id else {"channel": req.channel}).encode()


def publish_or_refuse(bus: Bus, channel: str, data: Any, **options: Any) -> int:
    """``bus.publish`` for an HTTP client: the bus's refusals become a ProtocolError (413 too large, 400 bad
    channel or message, 503 when the bus is off), never a 500."""
    try:
        mid = bus.publish(channel, data, **options)
    except PayloadTooLarge as exc:
        raise ProtocolError(413, str(exc))
    except (InvalidMessage, InvalidChannel, TypeError, ValueError) as exc:
        raise ProtocolError(400, str(exc)[:300])
    if mid is None:
        raise ProtocolError(503, "the bus is off (publishing disabled)")
    return mid


def _check_authorize(authorize: Any) -> None:
    if authorize is None or not callable(authorize):
        raise TypeError(
            "authorize(environ_or_scope, channel) -> bool is required: REST publishing has no allow-all default"
        )


def _length(value: Any, limit: int) -> None:
    if value in (None, ""):
        return
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise ProtocolError(400, "invalid Content-Length")
    if n < 0:
        raise ProtocolError(400, "invalid Content-Length")
    if n > limit:
        raise ProtocolError(413, f"request body too large (limit {limit} bytes)")


class _RestPublish:
    """The shells' shared part: options, and every step between the I/O (route, authorisation, body, answer)."""

    def __init__(
        self,
        app: Callable[..., Any] | None = None,
        *,
        bus: Bus,
        authorize: Callable[[Any, str], Any],
        prefix: str = "/message/",
        max_body_size: int = MAX_BODY_SIZE,
        subscribe_allowed: SubscribeAllowed | None = None,
    ) -> None:
        _check_authorize(authorize)
        check_subscribe_allowed(subscribe_allowed)
        self.subscribe_allowed = subscribe_allowed
        self.app = app
        self.bus = bus
        self.authorize = authorize
        self.prefix = _norm_prefix(prefix)
        self.max_body_size = max_body_size

    def channel(self, method: str, path: str) -> str | None:
        """The channel to publish on (None: not ours); 405/400 as ProtocolError."""
        return route(method, path, self.prefix)

    def check_authorized(self, allowed: Any, channel: str) -> None:
        if not allowed:
            raise ProtocolError(403, f"not authorised to publish on {channel[:80]!r}")

    def check_length(self, content_length: str | None) -> None:
        """A declared Content-Length over ``max_body_size`` is refused before the body is read."""
        _length(content_length, self.max_body_size)

    def check_size(self, size: int) -> None:
        if size > self.max_body_size:
            raise ProtocolError(413, f"request body too large (limit {self.max_body_size} bytes)")

    def answer(
        self,
        channel: str,
        query: str,
        content_type: str | None,
        body: bytes,
        headers: dict[str, str],
        show_id: bool = True,
    ) -> bytes:
        """Parse the authorised request and publish: the JSON answer (ProtocolError on refusal), with the new
        message's id when ``show_id`` (the caller may read the channel). ``headers`` (lower-case names) are for
        subclasses: this protocol takes everything from the query and the body."""
        return publish(self.bus, parse_publish(channel, query, content_type, body), show_id)


def _allow(status: int) -> list[tuple[str, str]]:
    return [("allow", "POST")] if status == 405 else []


class AsgiRestPublish(_RestPublish):
    """ASGI app: ``POST <prefix><channel>``; other paths go to ``app`` (or 404)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await fallback(self.app, scope, receive, send)
            return
        try:
            channel = self.channel(scope.get("method", "GET"), relative_path(scope))
        except ProtocolError as exc:
            extra = [(k.encode(), v.encode()) for k, v in _allow(exc.status)]
            await send_simple(send, exc.status, exc.reason.encode(), extra=extra)
            return
        if channel is None:
            await fallback(self.app, scope, receive, send)
            return
        try:
            self.check_authorized(await maybe_await(self.authorize(scope, channel)), channel)
            headers = {k.lower(): v for k, v in scope.get("headers") or ()}
            cl = headers.get(b"content-length")
            self.check_length(cl.decode("latin-1") if cl is not None else None)
            body = await read_body(receive, self.check_size)
            ctype = headers.get(b"content-type")
            hook = self.subscribe_allowed
            answer = self.answer(
                channel,
                scope.get("query_string", b"").decode("latin-1"),
                ctype.decode("latin-1") if ctype is not None else None,
                body,
                {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in headers.items()},
                hook is None or verdict(await maybe_await(hook(RequestInfo(scope), channel))),
            )
        except ProtocolError as exc:
            await send_simple(send, exc.status, exc.reason.encode())
            return
        await send_simple(send, 200, answer, JSON_TYPE)


class WsgiRestPublish(_RestPublish):
    """WSGI app: ``POST <prefix><channel>`` (PATH_INFO, below SCRIPT_NAME); other paths go to ``app`` (or 404)."""

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        try:
            try:
                path = environ.get("PATH_INFO", "").encode("latin-1").decode("utf-8")
            except (UnicodeEncodeError, UnicodeDecodeError):
                raise ProtocolError(400, "request path is not valid UTF-8")
            channel = self.channel(environ.get("REQUEST_METHOD", "GET"), path)
            if channel is None:
                if self.app is not None:
                    response: Iterable[bytes] = self.app(environ, start_response)
                    return response
                raise ProtocolError(404, "not found")
            self.check_authorized(self.authorize(environ, channel), channel)
            self.check_length(environ.get("CONTENT_LENGTH"))
            body = self._body(environ)
            headers = {k[5:].replace("_", "-").lower(): str(v) for k, v in environ.items() if k.startswith("HTTP_")}
            hook = self.subscribe_allowed
            show_id = hook is None or verdict(hook(RequestInfo(environ), channel))
            answer = self.answer(
                channel, environ.get("QUERY_STRING", ""), environ.get("CONTENT_TYPE"), body, headers, show_id
            )
            return start_simple(start_response, 200, answer, JSON_TYPE)
        except ProtocolError as exc:
            return start_simple(start_response, exc.status, exc.reason.encode(), extra=_allow(exc.status))

    def _body(self, environ: Environ) -> bytes:
        stream = environ.get("wsgi.input")
        if stream is None:
            return b""
        cl = environ.get("CONTENT_LENGTH")
        # unknown length (chunked): read at most one byte over the limit
        data = stream.read(int(cl)) if cl else stream.read(self.max_body_size + 1)
        self.check_size(len(data))
        return bytes(data)
