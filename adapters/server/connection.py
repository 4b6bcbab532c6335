"""One client connection of the lean server: reading, parsing, pipelining, deadlines and closing."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any

from .asgi_bridge import Cycle, ResponsePhase
from .bus_routes import BusRoutes, ParkedKind
from .limits import FEED_STEP, MAX_BUFFERED
from .parser import Parser, ParserError, ParserUpgrade
from .request import ParserCallbacks, Request

if TYPE_CHECKING:
    from ..http import Client
    from .serve import Server

log = logging.getLogger("shmbus.adapters.server")

_EMPTY_HEADERS: list[tuple[bytes, bytes]] = []


class HttpConnection(ParserCallbacks, BusRoutes, asyncio.Protocol):
    """One client connection; also the parked-poll state (``client``, ``timer``) when a poll waits."""

    __slots__ = ()

    def __init__(self, srv: Server) -> None:
        self.srv = srv
        self.transport: Any = None
        self.parser: Any = None
        self.req: Request | None = None  # being parsed
        self.cur: Request | None = None  # being answered
        self.queue: list[Request] | None = None  # parsed, waiting for cur to finish
        self.client: Client | None = None
        self.kind: ParkedKind | None = None
        self.head: bytes | None = None  # a parked long poll's response head (None: the common one)
        self.timer: asyncio.TimerHandle | None = None
        self.expires = 0.0  # a parked poll's end (loop time), enforced by tick() for long intervals
        self.idle = 0.0  # when the connection became idle (0: busy); the server's clock sweeps idle ones
        self.cycle: Cycle | None = None
        self.drain_fut: asyncio.Future[None] | None = None
        self.paused_r = False
        self.paused_w = False
        self.pumping = False
        self.closing = False
        self.buffered = 0
        self.inbox = bytearray()  # pipelined input held (not parsed) while a request is answered
        self.feeding = False
        self.deadline = 0.0  # when the request being read must be complete (0: none); the tick enforces it
        self.phase = "request head"  # what the deadline waits for
        self.linger_until = 0.0  # a lingering close ends then at the latest
        self.eof = False  # the client half-closed: answer what it sent, then close

    # ------------------------------------------------------------------ asyncio.Protocol
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.parser = Parser(self)
        srv = self.srv
        srv.connections.add(self)
        if srv.stopping:
            transport.close()
            self.closing = True
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

    def _must_hold(self) -> bool:
        """Stop parsing: a request is being answered (its body read) and another one is already queued."""
        cur = self.cur
        return cur is not None and cur.complete and bool(self.queue)

    def _feed(self, data: bytes | bytearray) -> None:
        """Parse ``data`` piece by piece, holding what follows once a request waits behind the current one."""
        self.feeding = True
        pos, n = 0, len(data)
        try:
            while pos < n and not self.closing:
                if self._must_hold():
                    self.inbox += data[pos:]
                    self.deadline = 0.0  # we stopped reading it: its clock restarts when we resume
                    break
                self.parser.feed_data(data[pos : pos + FEED_STEP] if n > FEED_STEP else data)
                pos += FEED_STEP
        except ParserUpgrade:
            # no upgrades: the request was handed over as plain HTTP; nothing after it is read
            if self.req is not None or self.cur is None:
                self.fail(400, "upgrade not supported")
            else:
                self.cur.keep = False
                self.closing = True
        except ParserError as exc:
            if not self.closing:
                if "head too large" in str(exc):
                    self.fail(431, "request head too large")
                else:
                    self.fail(400, f"malformed request ({exc})" if str(exc) else "malformed request")
        finally:
            self.feeding = False
        self._update_reading()

    def _feed_inbox(self) -> None:
        """Parse held input now that the current request is done (called when nothing is being fed)."""
        if not self.inbox or self.feeding or self.closing:
            return
        data, self.inbox = bytes(self.inbox), bytearray()
        if self.req is not None:  # its clock stopped while we held its bytes
            self._restart_deadline(self.req)
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
            if self.req is not None and not self.deadline:  # its clock runs again from now
                self._restart_deadline(self.req)

    def _restart_deadline(self, req: Request) -> None:
        limits = self.srv.limits
        if req.head_done:
            self._arm_deadline(limits.body_timeout, "request body")
        else:
            self._arm_deadline(limits.header_timeout, "request head")

    def _arm_deadline(self, seconds: float, phase: str) -> None:
        self.deadline = self.srv.now + seconds
        self.phase = phase

    def tick(self, now: float, idle_cutoff: float) -> None:
        """The server's clock, once a second: parked polls' ends, idle keep-alive, head and body deadlines,
        lingering closes."""
        if self.closing:
            if self.linger_until and now >= self.linger_until:
                self.linger_until = 0.0
                self.transport.abort()  # the client neither read the response nor closed: enough
            return
        if self.expires and now >= self.expires:  # a parked poll's long_polling_interval (see COARSE_EXPIRY)
            self.expires = 0.0
            self.expire()
            return
        if self.idle:
            self.idle_expired(idle_cutoff)
        elif self.deadline and now >= self.deadline:
            self.deadline = 0.0
            self.fail(408, f"{self.phase} not received within {self._limit_for(self.phase):g} s")

    def _limit_for(self, phase: str) -> float:
        limits = self.srv.limits
        return limits.body_timeout if phase == "request body" else limits.header_timeout

    def eof_received(self) -> bool | None:
        if self.closing or self.client is not None:
            return None  # closing anyway, or a parked poll whose client went away: unregister it at once
        if self.cur is None and self.req is None and not self.queue and not self.inbox:
            return None  # idle: close
        if self.cur is None and not self.queue and not self.inbox and self.req is not None:
            self.eof = True
            self.fail(400, "the client closed its side in the middle of a request")  # it can never complete
            return True  # the lingering close ends the connection
        self.eof = True  # half-closed after sending a request: answer what it sent, then close
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.srv.connections.discard(self)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        c = self.client
        if c is not None:
            self.client = None
            self.srv.proto.abandon(c)
        if self.cycle is not None:
            self.cycle.lost()
        self._release_drain()

    def pause_writing(self) -> None:
        self.paused_w = True

    def resume_writing(self) -> None:
        self.paused_w = False
        self._release_drain()
        c = self.client
        if c is not None and self.kind is ParkedKind.STREAM:
            self.woken(c)

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
                self._bus(req)
            elif req.complete:
                self._bus(req)
            elif req.expect_continue:
                self.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            return
        srv = self.srv
        if srv.app is None:
            req.started = True
            self._respond(req, 404, [("content-type", "text/plain")], b"not found")
            return
        cycle = req.cycle = self.cycle = Cycle(self, req)
        req.started = True
        cycle.task = srv.loop.create_task(cycle.run(srv.app, self.scope(req)))

    def _done(self, req: Request, keep: bool) -> None:
        """``req`` is answered: next request, idle wait, or close."""
        if self.cur is req:
            self.cur = None
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
        if self.cur is None and self.req is None and not self.queue and not self.inbox and not self.closing:
            if self.eof:
                self._linger_close()
            else:
                self._arm_idle()

    def _arm_idle(self) -> None:
        if not self.idle:
            self.idle = self.srv.now  # no timer per request: the server's 1 s tick closes expired idle ones

    def idle_expired(self, cutoff: float) -> None:
        if (
            self.idle
            and self.idle <= cutoff
            and self.cur is None
            and self.req is None
            and not self.queue
            and not self.closing
        ):
            self.closing = True
            self.transport.close()

    def body_taken(self) -> None:
        """The bridge consumed buffered body bytes: reading may resume."""
        self.buffered = 0
        self._update_reading()

    def cycle_done(self, cycle: Cycle, keep: bool) -> None:
        if self.cycle is cycle:
            self.cycle = None
        cycle.req.cycle = None
        if not self.closing:
            self._done(cycle.req, keep)

    def write(self, data: bytes) -> None:
        if not self.transport.is_closing():
            self.transport.write(data)

    async def drain(self) -> None:
        """Wait until the transport accepts more (bridge ``send`` under flow control)."""
        if not self.paused_w or self.transport.is_closing():
            return
        fut = self.drain_fut
        if fut is None:
            fut = self.drain_fut = self.srv.loop.create_future()
        await fut

    def _release_drain(self) -> None:
        fut = self.drain_fut
        if fut is not None:
            self.drain_fut = None
            if not fut.done():
                fut.set_result(None)

    def fail(self, status: int, reason: str) -> None:
        """A request we cannot parse or accept: answer (unless another response is under way) and close."""
        if self.closing:
            return
        self.req = None
        cur, cycle = self.cur, self.cycle
        answer = cur is None or cur.refused is not None or (not cur.started and cycle is None)
        if cycle is not None and cycle.phase is ResponsePhase.NOT_STARTED:
            answer = True
            cycle.phase = ResponsePhase.STARTED  # the app's own response, if it still sends one, is discarded
            cycle.lost()
        if self.client is not None:  # a parked poll: unregister it
            c, self.client = self.client, None
            self.srv.proto.abandon(c)
            answer = False  # its response head is already out (a stream) or it is mid-wait: just close
        if answer:
            body = reason.encode()
            self.transport.write(
                b"%scontent-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\n"
                b"connection: close\r\n%s\r\n%s" % (self.srv.status_line(status), len(body), self.srv.date, body)
            )
        self._linger_close()

    def _linger_close(self) -> None:
        """Close after the response: shut the write side, drain (discard) input until the client closes or
        ``linger`` passes. Closing with unread input would make the kernel send a reset, which can destroy the
        response before the client reads it."""
        self.closing = True
        self.deadline = 0.0
        self.inbox = bytearray()
        t = self.transport
        if t.is_closing():
            return
        if self.eof:  # the client already closed its side: nothing left to drain
            t.close()
            return
        if self.paused_r:
            self.paused_r = False
            t.resume_reading()
        try:
            if not t.can_write_eof():
                raise OSError("no half-close")
            t.write_eof()
        except (OSError, RuntimeError, NotImplementedError):
            t.close()
            return
        self.linger_until = self.srv.now + self.srv.limits.linger

    def scope(self, req: Request) -> MutableMapping[str, Any]:
        """The ASGI scope of ``req`` (for the bridge, and for the middleware's lookups)."""
        t = self.transport
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": req.version,
            "server": t.get_extra_info("sockname"),
            "client": t.get_extra_info("peername"),
            "scheme": "http",
            "method": req.method,
            "root_path": "",
            "path": req.path,
            "raw_path": req.raw_path,
            "query_string": req.query,
            "headers": req.headers,
        }
        if self.srv.state is not None:
            scope["state"] = dict(self.srv.state)
        return scope
