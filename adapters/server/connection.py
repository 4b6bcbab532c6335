"""One client connection of the lean server (:class:`HttpConnection`): reading, pipelining, the request flow (its
deadlines and closing: :mod:`.lifetime`).

It owns its parts and talks to each through a small interface: a :class:`~.reader.RequestReader` (the parser's
callbacks, reporting as :class:`~.reader.ReaderOwner`), the server's :class:`~.bus_routes.BusRoutes` (which may
leave a :class:`~.bus_routes.ParkedPoll` in ``parked``), and for other routes one ASGI
:class:`~.asgi_bridge.Cycle` at a time (which sees it as a :class:`~.asgi_bridge.BridgeConnection`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import MutableMapping
from typing import Any

from .asgi_bridge import Cycle
from .bus_routes import BusRoutes, ParkedPoll
from .lifetime import Awaiting, ConnectionLifetime, ConnState
from .limits import FEED_STEP, MAX_BUFFERED
from .reader import RequestReader
from .request import Request, asgi_scope
from .server import NEVER, Server

log = logging.getLogger("shmbus.adapters.server")

_EMPTY_HEADERS: list[tuple[bytes, bytes]] = []


class HttpConnection(ConnectionLifetime, asyncio.Protocol):
    """One client connection: the asyncio protocol, the queue of pipelined requests and the timers' state (its
    deadlines and ends: :class:`~.lifetime.ConnectionLifetime`)."""

    __slots__ = ("buffered", "feeding", "paused_w", "pumping", "routes")  # and ConnectionLifetime's

    def __init__(self, srv: Server, routes: BusRoutes) -> None:
        self.srv = srv
        self.routes = routes
        self.transport: Any = None
        self.reader = RequestReader(srv, self)
        self.cur: Request | None = None  # being answered
        self.queue: list[Request] | None = None  # parsed, waiting for cur to finish
        self.parked: ParkedPoll | None = None  # cur, when it is a poll waiting for messages
        self.cycle: Cycle | None = None  # cur, when the wrapped ASGI app answers it
        self.idle = 0.0  # when the connection became idle (0: busy); the server's clock sweeps idle ones
        self.paused_r = False
        self.paused_w = False
        self.pumping = False
        self.state = ConnState.OPEN  # changed by _move alone (the table: lifetime.CONNECTION_MOVES)
        self.buffered = 0  # body bytes of a bridged request not yet taken by the app
        self.inbox = bytearray()  # pipelined input held (not parsed) while a request is answered
        self.feeding = False
        self.deadline = 0.0  # when the request being read must be complete (0: none); the tick enforces it
        self.awaiting = Awaiting.HEAD  # what the deadline waits for
        self.linger_until = 0.0  # a lingering close ends then at the latest
        self.due = NEVER  # the second of the server's clock that visits it next (Server.visit_at)

    # ------------------------------------------------------------------ asyncio.Protocol
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        srv = self.srv
        srv.connections.add(self)
        if srv.stopping:
            self._close()
            return
        if len(srv.connections) > srv.limits.max_connections:
            log.warning(
                "shmbus server: %d connections (max_connections): refusing one with 503", len(srv.connections) - 1
            )
            self.fail(503, f"server busy: more than {srv.limits.max_connections} connections to this worker")
            return
        self._arm_idle()

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return  # answered with an error (or closing): drain and discard
        if self.inbox or self._must_hold():
            self.inbox += data
            self._update_reading()
            if not self.feeding and not self._must_hold():
                self._feed_inbox()
            return
        self._feed(data)

    def eof_received(self) -> bool | None:
        if self.closing or self.parked is not None:
            return None  # closing anyway, or a parked poll whose client went away: unregister it at once
        if self.cur is None and not self.queue and not self.inbox:
            if self.reader.req is None:
                return None  # idle: close
            self._move(ConnState.HALF_CLOSED)
            self.fail(400, "the client closed its side in the middle of a request")  # it can never complete
            return True  # the lingering close ends the connection
        self._move(ConnState.HALF_CLOSED)  # after sending a request: answer what it sent, then close
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self._move(ConnState.CLOSED)
        self.srv.connections.discard(self)
        self.srv.forget(self)
        if self.parked is not None:
            self.parked.abandon()
        if self.cycle is not None:
            self.cycle.lost()

    def pause_writing(self) -> None:
        self.paused_w = True

    def resume_writing(self) -> None:
        self.paused_w = False
        if self.cycle is not None:
            self.cycle.writable()
        parked = self.parked
        if parked is not None and parked.waiter is not None and parked.waiter.streaming:
            parked.woken(parked.waiter)

    # ------------------------------------------------------------------ input: parse, hold, pause
    def _must_hold(self) -> bool:
        """Stop parsing: a request is being answered (its body read) and another one is already queued."""
        cur = self.cur
        return cur is not None and cur.complete and bool(self.queue)

    def _feed(self, data: bytes | bytearray) -> None:
        """Parse ``data`` piece by piece, holding what follows once a request waits behind the current one."""
        self.feeding = True
        pos, n = 0, len(data)
        feed = self.reader.feed
        try:
            while pos < n and not self.closing:
                if self._must_hold():
                    self.inbox += data[pos:]
                    self.deadline = 0.0  # we stopped reading it: its clock restarts when we resume
                    break
                if not feed(data[pos : pos + FEED_STEP] if n > FEED_STEP else data):
                    break
                pos += FEED_STEP
        finally:
            self.feeding = False
        self._update_reading()

    def _feed_inbox(self) -> None:
        """Parse held input now that the current request is done (called when nothing is being fed)."""
        if not self.inbox or self.feeding or self.closing:
            return
        data, self.inbox = bytes(self.inbox), bytearray()
        if self.reader.req is not None:  # its clock stopped while we held its bytes
            self._arm_deadline(Awaiting.BODY if self.reader.req.head_done else Awaiting.HEAD)
        self._feed(data)

    def _update_reading(self) -> None:
        """Pause reading while held input or an unread bridged body is over its limit; resume below it."""
        if self.closing:
            return
        want = len(self.inbox) >= self.srv.limits.max_pipeline_bytes or self.buffered > MAX_BUFFERED
        if want and not self.paused_r:
            self.paused_r = True
            self.transport.pause_reading()
            self.deadline = 0.0  # we stopped reading: the client is not late (an app reading slowly is not)
        elif not want and self.paused_r:
            self.paused_r = False
            self.transport.resume_reading()
            req = self.reader.req
            if req is not None and not self.deadline:  # its clock runs again from now
                self._arm_deadline(Awaiting.BODY if req.head_done else Awaiting.HEAD)

    # ------------------------------------------------------------------ the reader's events (ReaderOwner)
    def message_begun(self) -> None:
        self.idle = 0.0
        self._arm_deadline(Awaiting.HEAD)

    def head_ready(self, req: Request) -> None:
        self._arm_deadline(Awaiting.BODY)
        if self.queue is None:
            self.queue = [req]
        else:
            self.queue.append(req)
        self._pump()

    def upgraded(self) -> None:  # served as plain HTTP; nothing after it is read
        if self.reader.req is not None or self.cur is None:
            self.fail(400, "upgrade not supported")
        else:
            self.cur.keep = False
            if self.cycle is not None:  # the app's answer to it, under way: it ends the connection too
                self.cycle.keep = False
            if self.state is ConnState.OPEN:  # (a half-closed client sends nothing more anyway)
                self._move(ConnState.FINISHING)

    def body_buffered(self, req: Request, nbytes: int) -> None:
        self.buffered += nbytes
        if self.buffered > MAX_BUFFERED and not self.paused_r:
            self._update_reading()
        if req.cycle is not None:
            req.cycle.notify()

    def message_complete(self, req: Request) -> None:
        self.deadline = 0.0
        if req is self.cur:
            if req.bus:
                if not req.started:
                    self.routes.answer(self, req)
            elif req.cycle is not None:
                req.cycle.notify()
        if self.cur is None and self.reader.req is None and not self.queue:  # nothing answered, read or waiting
            self._arm_idle()

    # ------------------------------------------------------------------ request flow
    def _pump(self) -> None:
        """Start queued requests one at a time (a request answered synchronously lets the next one start)."""
        if self.pumping:
            return
        self.pumping = True
        try:
            q = self.queue
            while self.cur is None and q and not self.closing:
                self._start(q.pop(0))
        finally:
            self.pumping = False
        if self.queue is not None and not self.queue:
            self.queue = None

    def _start(self, req: Request) -> None:
        self.cur = req
        if req.refused is not None:
            self.fail(*req.refused)
            return
        if req.bus:
            if req.too_large or req.chunked:
                req.keep = False  # the body is not read: the connection cannot be reused
                self.routes.answer(self, req)
            elif req.complete:
                self.routes.answer(self, req)
            elif req.expect_continue:
                self.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            return
        srv = self.srv
        if srv.app is None:
            req.started = True
            self.routes.respond(self, req, 404, [("content-type", "text/plain")], b"not found")
            return
        cycle = req.cycle = self.cycle = Cycle(self, req)
        req.started = True
        cycle.task = srv.loop.create_task(cycle.run(srv.app, self.scope(req)))

    def done(self, req: Request, keep: bool) -> None:
        """``req`` is answered: next request, idle wait, or close."""
        if self.cur is req:
            self.cur = None
        req.answered = True
        req.headers = _EMPTY_HEADERS
        req.body = []
        srv = self.srv
        srv.requests += 1
        if srv.max_requests and srv.requests >= srv.max_requests and srv.on_max_requests is not None:
            cb, srv.on_max_requests = srv.on_max_requests, None
            srv.loop.call_soon(cb)
        if not keep or srv.stopping:
            self._linger_close()
            return
        self.buffered = 0
        self._pump()
        if not self._must_hold():
            self._feed_inbox()  # what was held while this one was answered (the next request's body, too)
        self._update_reading()
        if self.cur is None and self.reader.req is None and not self.queue and not self.inbox and not self.closing:
            if self.eof:
                self._linger_close()
            else:
                self._arm_idle()

    # ------------------------------------------------------------------ the bridge's needs (BridgeConnection)
    def body_taken(self) -> None:
        """The bridge consumed buffered body bytes: reading may resume."""
        self.buffered = 0
        self._update_reading()

    def cycle_done(self, cycle: Cycle, keep: bool) -> None:
        if self.cycle is cycle:
            self.cycle = None
        cycle.req.cycle = None
        if self.state not in (ConnState.LINGERING, ConnState.CLOSED):  # (finishing: its answer ends the connection)
            self.done(cycle.req, keep)

    def write(self, data: bytes) -> None:
        if not self.transport.is_closing():
            self.transport.write(data)

    def write_paused(self) -> bool:
        return self.paused_w and not self.transport.is_closing()

    def scope(self, req: Request) -> MutableMapping[str, Any]:
        """The ASGI scope of ``req`` (for the bridge, and for the middleware's lookups)."""
        return asgi_scope(req, self.transport, self.srv.state)
