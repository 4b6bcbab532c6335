"""ASGI shell of the message_bus protocol: ``MessageBusMiddleware(app=None, *, bus=None, **options)``.

Wrap any ASGI app (``app=None`` answers 404 outside the bus routes and completes the lifespan protocol)::

    from shmbus import Bus
    from shmbus.adapters.asgi import MessageBusMiddleware

    bus = Bus("myapp", create=True)
    app = MessageBusMiddleware(starlette_or_falcon_asgi_app, bus=bus,
                               user_id_lookup=lambda scope: scope.get("user_id"))

Options are those of :class:`shmbus.adapters.http.Options` (times in seconds). Lookups receive the ASGI
scope and may be plain functions or coroutine functions. ``scope['message_bus.channels']`` (and
``'message_bus.seq'``) set by an outer middleware replace the request body. Routes are matched on the path
relative to ``root_path``.

Waiting costs no thread: a parked request is its own coroutine plus one future, one ``call_later`` timer and
one task awaiting ``receive()`` (so a client that disconnects is unregistered at once). The bus listener thread
queues each batch for the event loop, with at most one ``loop.call_soon_threadsafe`` pending: batches that
arrive before the loop runs are delivered together. Delivery then runs on the loop (:mod:`.fanout`), encodes each
channel's messages once for all recipients and wakes only the clients concerned, many in slices of about a
millisecond so that a message to a few clients overtakes a broadcast under way. Backlog reads are synchronous
shared-memory reads (microseconds) done on the loop. A streaming client that stops reading (the server's
``send`` blocks on flow control) is dropped once ``max_stream_buffer`` bytes are queued for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from shmbus.bus import Bus
from shmbus.message import Message

from .asgi_support import (
    Receive,
    Scope,
    Send,
    encode_headers,
    lifespan,
    maybe_await,
    send_response,
    send_whole,
    until_disconnect,
)
from .fanout import LoopFanout as _LoopFanout
from .http import MessageBusProtocol, Options, Poll, ProtocolError, Waiter
from .http.flow import Flow, ReadBody, RequestHead, advance, request_flow
from .http.options import bus_or_default
from .http.waiter import Ending
from .http.wire import CHUNKED_BODY_REFUSED
from .looptap import LoopTap

__all__ = ["MessageBusMiddleware"]


class _Wait:
    """Per parked request: the future the coroutine awaits and the task to cancel if the client is dropped."""

    __slots__ = ("expired", "fut", "sending", "task")

    def __init__(self, fut: asyncio.Future[None], task: asyncio.Task[Any] | None) -> None:
        self.fut = fut
        self.task = task
        self.sending = False
        self.expired = False


def _wake(c: Waiter) -> None:
    w: _Wait = c.signal
    if c.dropped and w.sending and w.task is not None:
        w.task.cancel()  # stuck in send() to a client that does not read
        return
    if not w.fut.done():
        w.fut.set_result(None)


def _expire(c: Waiter) -> None:
    w: _Wait = c.signal
    w.expired = True
    if not w.fut.done():
        w.fut.set_result(None)


def _queue_batch(fanout: _LoopFanout, msgs: list[Message]) -> None:
    """Listener thread: queue the batch for a loop with waiting clients (merged until the loop runs)."""
    if fanout.proto.registry.index:  # nobody waits on this loop: skip the hop
        fanout.add(msgs)


class MessageBusMiddleware:
    """ASGI middleware serving ``<base_route>message-bus/...`` from a :class:`shmbus.Bus`.

    ``bus`` defaults to :func:`shmbus.default_bus`. State is per process and per event loop; the bus is tapped
    on the first poll.
    """

    def __init__(self, app: Callable[..., Any] | None = None, *, bus: Bus | None = None, **options: Any) -> None:
        self.app = app
        self.bus = bus = bus_or_default(bus)
        self.options = Options.from_kwargs(options)
        self._loops: LoopTap[_LoopFanout] = LoopTap(
            bus, lambda loop: _LoopFanout(self.bus, self.options, loop), _queue_batch, self.options.batch_window
        )

    # ------------------------------------------------------------------ plumbing
    def _fanout(self) -> _LoopFanout:
        return self._loops.get()

    def protocol(self) -> MessageBusProtocol:
        """The protocol of the running loop (for tests and introspection)."""
        return self._fanout().proto

    def close(self) -> None:
        self._loops.close()

    # ------------------------------------------------------------------ ASGI
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if self.app is not None:
                await self.app(scope, receive, send)
            elif scope["type"] == "lifespan":
                await lifespan(receive, send)
            return
        path = scope["path"]
        root = scope.get("root_path") or ""
        if root and path.startswith(root):
            path = path[len(root) :]
        if not path.startswith(self.options.prefix):
            if self.app is None:
                await send_whole(send, 404, [("content-type", "text/plain")], b"not found")
            else:
                await self.app(scope, receive, send)
            return
        await self._handle(scope, receive, send, path)

    async def _read_body(self, receive: Receive, headers: dict[bytes, bytes]) -> bytes:
        limit = self.options.max_body_size
        if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
            raise ProtocolError(411, CHUNKED_BODY_REFUSED)
        cl = headers.get(b"content-length")
        if cl is not None:
            try:
                n = int(cl)
            except ValueError:
                raise ProtocolError(400, "invalid Content-Length")
            if n > limit:
                raise ProtocolError(413, f"request body too large (limit {limit} bytes)")
        parts: list[bytes] = []
        size = 0
        # A body that never ends (a stalled client) must not hold the request forever: one timer for the whole
        # body (cheaper than wait_for, which makes a task per receive()) cancels this task at the deadline.
        task = asyncio.current_task()
        expired = [False]

        def expire() -> None:
            expired[0] = True
            if task is not None:
                task.cancel()

        timer = asyncio.get_running_loop().call_later(self.options.body_timeout, expire)
        try:
            return await self._receive_body(receive, limit, parts, size)
        except asyncio.CancelledError:
            if expired[0]:
                raise ProtocolError(408, f"request body not received within {self.options.body_timeout:g} s")
            raise
        finally:
            timer.cancel()

    @staticmethod
    async def _receive_body(receive: Receive, limit: int, parts: list[bytes], size: int) -> bytes:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _Disconnected()
            chunk = message.get("body", b"")
            if chunk:
                size += len(chunk)
                if size > limit:
                    raise ProtocolError(413, f"request body too large (limit {limit} bytes)")
                parts.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(parts)

    async def _run(self, flow: Flow, scope: Scope, receive: Receive, headers: dict[bytes, bytes]) -> Poll:
        """Drive the sans-IO flow: read the body, await the lookups (plain or coroutine functions)."""
        step = advance(flow)
        while not isinstance(step, Poll):
            try:
                if isinstance(step, ReadBody):
                    value = await self._read_body(receive, headers)
                else:
                    value = await maybe_await(step.fn(scope, *step.args))
            except _Disconnected:
                flow.close()
                raise
            except Exception as exc:
                step = advance(flow, error=exc)
            else:
                step = advance(flow, value)
        return step

    async def _handle(self, scope: Scope, receive: Receive, send: Send, path: str) -> None:
        opts = self.options
        headers = dict(scope.get("headers") or ())
        content_type = headers.get(b"content-type")
        head = RequestHead(
            scope.get("method", "GET"),
            path,
            scope.get("query_string", b"").decode("latin-1"),
            content_type.decode("latin-1") if content_type is not None else None,
            dont_chunk=b"dont-chunk" in headers,
            http11=scope.get("http_version", "1.1") not in ("1.0", "0.9"),
            override=scope.get("message_bus.channels"),
            override_seq=scope.get("message_bus.seq"),
        )
        fanout = self._fanout()
        proto = fanout.proto
        loop = fanout.loop
        wait = _Wait(loop.create_future(), asyncio.current_task())
        try:
            poll = await self._run(request_flow(proto, head, waker=_wake, signal=wait), scope, receive, headers)
        except _Disconnected:
            return
        if poll.mode == "immediate":
            assert poll.response is not None
            resp = poll.response
            await send_whole(send, resp.status, resp.headers, resp.body)
            return
        c = poll.waiter
        assert c is not None
        timer = loop.call_later(opts.long_polling_interval, _expire, c)
        receiver = asyncio.ensure_future(until_disconnect(receive))
        receiver.add_done_callback(lambda _t: _disconnected(c))
        try:
            if poll.mode == "long":
                while not c.done and not c.dropped and not wait.expired:
                    await wait.fut
                    wait.fut = loop.create_future()
                if c.dropped:
                    proto.abandon(c)
                    return
                body = proto.long_poll_response(c)
                await send_response(send, 200, encode_headers(poll.headers, len(body)), body)
                return
            await send({"type": "http.response.start", "status": 200, "headers": encode_headers(poll.headers)})
            wait.sending = True
            await send({"type": "http.response.body", "body": poll.first_chunk, "more_body": True})
            wait.sending = False
            while not c.done and not c.dropped and not wait.expired:
                await wait.fut
                wait.fut = loop.create_future()
                chunks = proto.stream_chunks(c)
                if chunks and not c.dropped:
                    wait.sending = True
                    await send(
                        {
                            "type": "http.response.body",
                            "more_body": True,
                            "body": chunks[0] if len(chunks) == 1 else b"".join(chunks),
                        }
                    )
                    wait.sending = False
            if c.dropped:
                proto.abandon(c)
                return
            end = proto.stream_end(c)
            await send({"type": "http.response.body", "body": b"".join(end), "more_body": False})
        except asyncio.CancelledError:
            proto.abandon(c)
            if c.dropped:
                return  # we cancelled ourselves: the client stopped reading
            raise
        finally:
            timer.cancel()
            if not receiver.done():
                receiver.cancel()
            proto.abandon(c)


class _Disconnected(Exception):
    pass


def _disconnected(c: Waiter) -> None:
    if not c.done:
        c.end(Ending.DROPPED)
        w: _Wait = c.signal
        if not w.fut.done():
            w.fut.set_result(None)
