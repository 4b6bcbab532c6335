"""Message-bus routes served natively by the lean server (:class:`BusRoutes`, one per server) and a connection's
parked poll (:class:`ParkedPoll`): the sans-IO flow is driven here and bytes go straight to the transport."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import MutableMapping
from typing import Any, Protocol

from ..http import BASE_HEADERS, STREAM_HEADERS, ProtocolError, Waiter
from ..http.flow import CallLookup, RequestHead, request_flow, run_sync
from ..http.wire import CHUNKED_BODY_REFUSED
from .request import Request
from .server import Server

__all__ = ["COARSE_EXPIRY", "BusConnection", "BusRoutes", "ParkedPoll"]

log = logging.getLogger("shmbus.adapters.server")


def _enc_headers(headers: list[tuple[str, str]]) -> bytes:
    return b"".join(b"%s: %s\r\n" % (k.encode("latin-1"), v.encode("latin-1")) for k, v in headers)


_BASE_BLOCK = _enc_headers(BASE_HEADERS)
_STREAM_BLOCK = _enc_headers(STREAM_HEADERS) + b"transfer-encoding: chunked\r\n"
_INTERNAL_ERROR = b"Internal Server Error"
_EMPTY_HEADERS: list[tuple[bytes, bytes]] = []
#: A ``long_polling_interval`` at least this long (seconds; the gem's default is 25) is ended by the server's
#: 1 s clock (the connection's ``tick``, on the tick of its due list for that second), within a second after it:
#: no timer object and no heap entry per parked poll, which is memory and CPU at tens of thousands of streams.
#: Shorter intervals keep a precise timer.
COARSE_EXPIRY = 5.0


class BusConnection(Protocol):
    """What the routes need from a connection: its transport, its parked poll's slot, and the end of a request."""

    transport: Any
    parked: ParkedPoll | None

    @property
    def paused_w(self) -> bool: ...

    def done(self, req: Request, keep: bool) -> None:
        """``req`` is answered: the next request, an idle wait, or a close."""

    def scope(self, req: Request) -> MutableMapping[str, Any]:
        """The ASGI scope of ``req`` (the context the lookups get)."""

    def abort(self) -> None:
        """Close at once (a dropped client: nothing more is sent)."""

    def reschedule(self) -> None:
        """On the server's clock for exactly its earliest deadline (a parked poll's end, usually)."""


def _wake(w: Waiter) -> None:
    """The core's waker: ``w.signal`` is the connection, whose parked poll (once the flow has returned) is ``w``'s.

    A broadcast calls it once per stream, so the common case is here inline: a stream with chunks queued whose
    transport takes writes gets them written (what :meth:`ParkedPoll.woken` does, without its calls)."""
    conn = w.signal
    parked = conn.parked
    if parked is None:
        return
    if w.ending is None and not w.done and w.streaming and parked.waiter is w and not conn.paused_w:
        chunks = w.pending
        if chunks:
            # the server's registry is its loop's own (no lock): take the queue as Registry.take does
            w.pending = []
            w.bytes_pending = 0
            if len(chunks) == 1:
                conn.transport.write(parked.routes.srv.http_chunk(chunks[0]))
            else:
                data = b"".join(chunks)
                conn.transport.write(b"%x\r\n%s\r\n" % (len(data), data))
        return
    parked.woken(w)


class BusRoutes:
    """Answers message-bus requests of every connection of one server (no state per connection)."""

    __slots__ = ("srv",)

    def __init__(self, srv: Server) -> None:
        self.srv = srv

    def respond(
        self,
        conn: BusConnection,
        req: Request,
        status: int,
        headers: list[tuple[str, str]] | None,
        body: bytes,
        block: bytes | None = None,
    ) -> None:
        """Write a whole response (``block``: the headers already encoded) and end ``req``."""
        srv = self.srv
        keep = req.keep and not srv.stopping
        connection = (
            b""
            if keep == (req.version == "1.1")
            else (b"connection: keep-alive\r\n" if keep else b"connection: close\r\n")
        )
        conn.transport.write(
            b"%s%scontent-length: %d\r\n%s%s\r\n%s"
            % (
                srv.status_line(status),
                block if block is not None else _enc_headers(headers or []),
                len(body),
                connection,
                srv.date,
                body if req.method != "HEAD" else b"",
            )
        )
        conn.done(req, keep)

    def _request_body(self, req: Request) -> bytes:
        """The flow's READ_BODY: the parser already buffered the body (or refused it)."""
        if req.too_large:
            raise ProtocolError(413, f"request body too large (limit {self.srv.options.max_body_size} bytes)")
        if req.chunked:
            raise ProtocolError(411, CHUNKED_BODY_REFUSED)
        return req.body[0] if len(req.body) == 1 else b"".join(req.body)

    def answer(self, conn: BusConnection, req: Request) -> None:
        """Run ``req`` through the sans-IO flow: answer it now, or park it on ``conn``."""
        req.started = True
        srv = self.srv
        content_type = req.header(b"content-type")
        head = RequestHead(
            req.method,
            req.path,
            req.query.decode("latin-1"),
            content_type.decode("latin-1") if content_type is not None else None,
            dont_chunk=req.header(b"dont-chunk") is not None,
            http11=req.version == "1.1",
        )
        scope: MutableMapping[str, Any] | None = None

        def call_lookup(step: CallLookup) -> Any:
            nonlocal scope
            if scope is None:
                scope = conn.scope(req)
            return srv.lookup(step.fn, scope, *step.args)

        try:
            poll = run_sync(
                request_flow(srv.proto, head, waker=_wake, signal=conn),
                lambda: self._request_body(req),
                call_lookup,
            )
        except Exception as exc:
            log.error("shmbus server: error on %s %s", req.method, req.path, exc_info=exc)
            req.keep = False
            self.respond(conn, req, 500, [("content-type", "text/plain; charset=utf-8")], _INTERNAL_ERROR)
            return
        if poll.mode == "immediate":
            r = poll.response
            assert r is not None
            if r.status in ProtocolError.UNREAD_BODY:
                req.keep = False
            self.respond(conn, req, r.status, r.headers, r.body, _BASE_BLOCK if r.headers is BASE_HEADERS else None)
            return
        w = poll.waiter
        assert w is not None
        parked = conn.parked = ParkedPoll(self, conn, req, w)
        req.headers = _EMPTY_HEADERS  # a parked request keeps only what its end needs (method, version, keep)
        req.body = []
        req.url = req.raw_path = req.query = b""
        req.path = ""
        if poll.mode == "long":
            parked.head = None if poll.headers is BASE_HEADERS else _enc_headers(poll.headers)
        else:
            first = poll.first_chunk
            pending = srv.proto.stream_chunks(w) if w.pending and not w.done else None
            if pending:
                first += b"".join(pending)
            block = (
                _STREAM_BLOCK
                if poll.headers is STREAM_HEADERS
                else (_enc_headers(poll.headers) + b"transfer-encoding: chunked\r\n")
            )
            keep = b"" if req.keep and not srv.stopping else b"connection: close\r\n"
            conn.transport.write(
                b"%s%s%s%s\r\n%x\r\n%s\r\n" % (srv.status_line(200), block, keep, srv.date, len(first), first)
            )
        if w.done or w.dropped:
            parked.woken(w)
            return
        if w.streaming:
            w.write_now = parked.write_now
        interval = srv.options.long_polling_interval
        if interval >= COARSE_EXPIRY:
            parked.expires = srv.loop.time() + interval
            conn.reschedule()
        else:
            parked.timer = srv.loop.call_later(interval, parked.timer_fired)


class ParkedPoll:
    """A connection's waiting poll (long or stream): woken by the core, ended by its interval or its client.

    It exists only while a poll waits, so a connection between requests carries none of this."""

    __slots__ = ("conn", "expires", "head", "req", "routes", "timer", "waiter")

    def __init__(self, routes: BusRoutes, conn: BusConnection, req: Request, waiter: Waiter) -> None:
        self.routes = routes
        self.conn = conn
        self.req = req
        self.waiter: Waiter | None = waiter  # None once it has ended
        self.head: bytes | None = None  # a long poll's response head (None: the common one)
        self.timer: asyncio.TimerHandle | None = None  # its interval, when shorter than COARSE_EXPIRY
        self.expires = 0.0  # its end (loop time; 0: none): the server's 1 s clock ends it

    def woken(self, w: Waiter) -> None:
        """The core has something for ``w`` (or it must end); also after the transport resumes writing."""
        if self.waiter is not w:
            return
        if w.dropped:
            self._unpark()
            self.routes.srv.proto.abandon(w)
            self.conn.abort()
            return
        if not w.streaming:
            if w.done:
                self._end_long(w)
            return
        if w.done:
            self._end_stream(w)
            return
        if not self.conn.paused_w and w.pending:
            srv = self.routes.srv
            chunks = srv.proto.stream_chunks(w)
            if len(chunks) == 1:
                self.conn.transport.write(srv.http_chunk(chunks[0]))
            elif chunks:
                data = b"".join(chunks)
                self.conn.transport.write(b"%x\r\n%s\r\n" % (len(data), data))

    def write_now(self, piece: bytes) -> bool:
        """The registry's direct write of a framed chunk to this parked stream (``Waiter.write_now``): done unless
        the poll has ended or the transport asked us to stop writing (then it is queued and woken as usual)."""
        if self.waiter is None or self.conn.paused_w:
            return False
        self.conn.transport.write(self.routes.srv.http_chunk(piece))
        return True

    def timer_fired(self) -> None:
        self.timer = None
        self.expire()

    def expire(self) -> None:
        """Its interval passed (or the server stops): answer it with what it has."""
        w = self.waiter
        if w is None:
            return
        if w.streaming:
            self._end_stream(w)
        else:
            self._end_long(w)

    def abandon(self) -> None:
        """Its client went away (or the connection fails): unregister it, write nothing."""
        w = self.waiter
        self._unpark()
        if w is not None:
            self.routes.srv.proto.abandon(w)

    def _unpark(self) -> None:
        if self.waiter is not None:
            self.waiter.write_now = None
        self.waiter = None
        self.expires = 0.0
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.conn.parked is self:
            self.conn.parked = None

    def _end_long(self, w: Waiter) -> None:
        conn = self.conn
        req = self.req
        self._unpark()
        body = self.routes.srv.proto.long_poll_response(w)
        head = self.head
        self.routes.respond(conn, req, 200, None, body, head if head is not None else _BASE_BLOCK)

    def _end_stream(self, w: Waiter) -> None:
        conn = self.conn
        req = self.req
        self._unpark()
        end = self.routes.srv.proto.stream_end(w)
        if w.dropped:
            conn.abort()
            return
        data = b"".join(end)
        conn.transport.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data) if data else b"0\r\n\r\n")
        conn.done(req, req.keep)
