"""Message-bus routes served natively by a lean-server connection: the poll flow, parked polls, their ends."""

from __future__ import annotations

import enum
import logging
from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any

from ..http import BASE_HEADERS, STREAM_HEADERS, Client, ProtocolError
from ..http.flow import CallLookup, RequestHead, run_sync, serve
from ..http.wire import CHUNKED_BODY_REFUSED
from .state import ConnectionState

if TYPE_CHECKING:
    from .request import Request

log = logging.getLogger("shmbus.adapters.server")


class ParkedKind(enum.Enum):
    """What a connection's parked poll is waiting to send."""

    LONG = "long poll"
    STREAM = "stream"


def _enc_headers(headers: list[tuple[str, str]]) -> bytes:
    return b"".join(b"%s: %s\r\n" % (k.encode("latin-1"), v.encode("latin-1")) for k, v in headers)


_BASE_BLOCK = _enc_headers(BASE_HEADERS)
_STREAM_BLOCK = _enc_headers(STREAM_HEADERS) + b"transfer-encoding: chunked\r\n"
_INTERNAL_ERROR = b"Internal Server Error"
#: A ``long_polling_interval`` at least this long (seconds; the gem's default is 25) is ended by the server's
#: 1 s clock (:meth:`HttpConnection.tick`), within a second after it: no timer object and no heap entry per parked
#: poll, which is memory and CPU at tens of thousands of streams. Shorter intervals keep a precise timer.
COARSE_EXPIRY = 5.0


def _wake(c: Client) -> None:
    """The core's waker: the connection that parked ``c`` is its ``signal``."""
    c.signal.woken(c)


def _expire(conn: BusRoutes) -> None:
    conn.timer = None
    conn.expire()


class BusRoutes(ConnectionState):
    """The part of :class:`~.connection.HttpConnection` that serves message-bus routes without the ASGI bridge:
    it drives the sans-IO flow (:func:`shmbus.adapters.http.flow.serve`) and writes straight to the transport."""

    __slots__ = ()

    if TYPE_CHECKING:

        def _done(self, req: Request, keep: bool) -> None: ...

        def scope(self, req: Request) -> MutableMapping[str, Any]: ...

    def _respond(
        self, req: Request, status: int, headers: list[tuple[str, str]] | None, body: bytes, block: bytes | None = None
    ) -> None:
        srv = self.srv
        keep = req.keep and not srv.stopping
        conn = (
            b""
            if keep == (req.version == "1.1")
            else (b"connection: keep-alive\r\n" if keep else b"connection: close\r\n")
        )
        self.transport.write(
            b"%s%scontent-length: %d\r\n%s%s\r\n%s"
            % (
                srv.status_line(status),
                block if block is not None else _enc_headers(headers or []),
                len(body),
                conn,
                srv.date,
                body if req.method != "HEAD" else b"",
            )
        )
        self._done(req, keep)

    def _request_body(self, req: Request) -> bytes:
        """The flow's READ_BODY: the parser already buffered the body (or refused it)."""
        if req.too_large:
            raise ProtocolError(413, f"request body too large (limit {self.srv.options.max_body_size} bytes)")
        if req.chunked:
            raise ProtocolError(411, CHUNKED_BODY_REFUSED)
        return req.body[0] if len(req.body) == 1 else b"".join(req.body)

    def _bus(self, req: Request) -> None:
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
                scope = self.scope(req)
            return srv.lookup(step.fn, scope, *step.args)

        try:
            poll = run_sync(
                serve(srv.proto, head, waker=_wake, signal=self), lambda: self._request_body(req), call_lookup
            )
        except Exception as exc:
            log.error("shmbus server: error on %s %s", req.method, req.path, exc_info=exc)
            req.keep = False
            self._respond(req, 500, [("content-type", "text/plain; charset=utf-8")], _INTERNAL_ERROR)
            return
        if poll.mode == "immediate":
            r = poll.response
            assert r is not None
            if r.status in ProtocolError.UNREAD_BODY:
                req.keep = False
            self._respond(req, r.status, r.headers, r.body, _BASE_BLOCK if r.headers is BASE_HEADERS else None)
            return
        c = poll.client
        assert c is not None
        self.client = c
        req.headers = _EMPTY_HEADERS  # a parked request keeps only what its end needs (method, version, keep)
        req.body = []
        req.url = req.raw_path = req.query = b""
        req.path = ""
        if poll.mode == "long":
            self.kind = ParkedKind.LONG
            self.head = None if poll.headers is BASE_HEADERS else _enc_headers(poll.headers)
            if c.done or c.dropped:
                self.woken(c)
                return
        else:
            self.kind = ParkedKind.STREAM
            first = poll.first_chunk
            pending = srv.proto.stream_chunks(c) if c.pending and not c.done else None
            if pending:
                first += b"".join(pending)
            block = (
                _STREAM_BLOCK
                if poll.headers is STREAM_HEADERS
                else (_enc_headers(poll.headers) + b"transfer-encoding: chunked\r\n")
            )
            keep = b"" if req.keep and not srv.stopping else b"connection: close\r\n"
            self.transport.write(
                b"%s%s%s%s\r\n%x\r\n%s\r\n" % (srv.status_line(200), block, keep, srv.date, len(first), first)
            )
            if c.done or c.dropped:
                self.woken(c)
                return
        interval = srv.options.long_polling_interval
        if interval >= COARSE_EXPIRY:
            self.expires = srv.loop.time() + interval
        else:
            self.timer = srv.loop.call_later(interval, _expire, self)

    # ------------------------------------------------------------------ parked polls
    def woken(self, c: Client) -> None:
        """The core has something for ``c`` (or it must end); also after the transport resumes writing."""
        if self.client is not c:
            return
        if c.dropped:
            self._drop(c)
            return
        if self.kind is ParkedKind.LONG:
            if c.done:
                self._end_long(c)
            return
        if c.done:
            self._end_stream(c)
            return
        if not self.paused_w and c.pending:
            chunks = self.srv.proto.stream_chunks(c)
            if len(chunks) == 1:
                self.transport.write(self.srv.http_chunk(chunks[0]))
            elif chunks:
                data = b"".join(chunks)
                self.transport.write(b"%x\r\n%s\r\n" % (len(data), data))

    def expire(self) -> None:
        c = self.client
        if c is None:
            return
        if self.kind is ParkedKind.LONG:
            self._end_long(c)
        else:
            self._end_stream(c)

    def _unpark(self) -> Request | None:
        self.client = None
        self.kind = None
        self.expires = 0.0
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        return self.cur

    def _drop(self, c: Client) -> None:
        self._unpark()
        self.srv.proto.abandon(c)
        self.closing = True
        self.transport.abort()

    def _end_long(self, c: Client) -> None:
        req = self._unpark()
        body = self.srv.proto.long_poll_response(c)
        assert req is not None
        head = self.head
        self.head = None
        self._respond(req, 200, None, body, head if head is not None else _BASE_BLOCK)

    def _end_stream(self, c: Client) -> None:
        req = self._unpark()
        end = self.srv.proto.stream_end(c)
        if c.dropped:
            self.closing = True
            self.transport.abort()
            return
        data = b"".join(end)
        self.transport.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data) if data else b"0\r\n\r\n")
        assert req is not None
        self._done(req, req.keep)


_EMPTY_HEADERS: list[tuple[bytes, bytes]] = []
