"""The ASGI types and small helpers of the whole adapters tree: the middleware (:mod:`.asgi`), the transports, the
admin, metrics and push apps, and the test and benchmark apps (:func:`lifespan` is the one lifespan stub for an
app with nothing to start). One home, so an app answers a plain response, matches its route and hands on what is
not its own the same way everywhere."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from .http.wire import ProtocolError

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


async def maybe_await(value: Any) -> Any:
    """``value``, awaited first when it is awaitable (lookups may be plain or coroutine functions)."""
    if inspect.isawaitable(value):
        return await value
    return value


async def lifespan(receive: Receive, send: Send, on_startup: Callable[[], Any] | None = None) -> None:
    """Complete the ASGI lifespan protocol for an app that has nothing to start or stop (``on_startup()`` is
    called at startup, for an app that wants to know)."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            if on_startup is not None:
                on_startup()
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def until_disconnect(receive: Receive) -> None:
    """Return once the client is gone (``http.disconnect``, or the server's ``receive`` failed)."""
    try:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
    except Exception:  # the server's receive failed: treat as gone
        return


# ---------------------------------------------------------------------------------------------------- requests
def relative_path(scope: Scope) -> str:
    """The path below ``root_path`` (as the middleware matches routes)."""
    path: str = scope.get("path") or "/"
    root = scope.get("root_path") or ""
    if root and path.startswith(root):
        path = path[len(root) :] or "/"
    return path


def header(scope: Scope, name: bytes) -> bytes | None:
    """The first request header called ``name`` (lower case), or None."""
    for k, v in scope.get("headers") or ():
        if k.lower() == name:
            return bytes(v)
    return None


async def read_body(receive: Receive, check_size: Callable[[int], None]) -> bytes:
    """The whole request body. ``check_size(bytes so far)`` raises to refuse it (a 413) as soon as it is too
    large, before the rest is read; a client that goes before the end is a ProtocolError(400)."""
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ProtocolError(400, "client disconnected before the body was complete")
        chunk = message.get("body", b"")
        size += len(chunk)
        check_size(size)
        parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)


# ---------------------------------------------------------------------------------------------------- responses
def encode_headers(headers: Iterable[tuple[str, str]], length: int | None = None) -> list[tuple[bytes, bytes]]:
    """``(name, value)`` strings as ASGI's latin-1 bytes, with ``content-length: length`` last when given."""
    out = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]
    if length is not None:
        out.append((b"content-length", str(length).encode()))
    return out


async def send_response(send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    """A whole response: its start (``headers`` as given, in that order) and its one body message."""
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def send_whole(send: Send, status: int, headers: Iterable[tuple[str, str]], body: bytes) -> None:
    """A whole response with ``(name, value)`` string headers, ``content-length`` last."""
    await send_response(send, status, encode_headers(headers, len(body)), body)


async def send_simple(
    send: Send,
    status: int,
    body: bytes,
    content_type: str = "text/plain; charset=utf-8",
    extra: Iterable[tuple[bytes, bytes]] = (),
) -> None:
    """A plain response: ``content-type``, ``content-length``, then the ``extra`` headers."""
    headers = [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode()), *extra]
    await send_response(send, status, headers, body)


async def fallback(app: Callable[..., Any] | None, scope: Scope, receive: Receive, send: Send) -> None:
    """Hand a request that is not ours to the wrapped app (or answer 404 / complete the lifespan)."""
    if app is not None:
        await app(scope, receive, send)
    elif scope["type"] == "lifespan":
        await lifespan(receive, send)
    elif scope["type"] == "http":
        await send_simple(send, 404, b"not found")
    elif scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1000})
