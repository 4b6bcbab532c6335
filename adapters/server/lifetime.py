"""What decides a lean-server connection's end (:class:`ConnectionLifetime`, the base of
:class:`~.connection.HttpConnection`): the server's clock (head and body deadlines, idle keep-alive, a lingering
close's end, a parked poll's expiry) and the ends themselves (a refused request, an abort, a lingering close,
shutdown)."""

from __future__ import annotations

from typing import Any

from .asgi_bridge import Cycle, ResponsePhase
from .bus_routes import ParkedPoll
from .reader import RequestReader
from .request import Request
from .server import Server

__all__ = ["ConnectionLifetime"]


class ConnectionLifetime:
    """The deadlines and ends of one connection; :class:`~.connection.HttpConnection` sets the state below."""

    __slots__ = (
        "closing",
        "cur",
        "cycle",
        "deadline",
        "eof",
        "idle",
        "inbox",
        "linger_until",
        "parked",
        "paused_r",
        "phase",
        "queue",
        "reader",
        "srv",
        "transport",
    )

    srv: Server
    transport: Any
    reader: RequestReader
    cur: Request | None
    queue: list[Request] | None
    parked: ParkedPoll | None
    cycle: Cycle | None
    idle: float
    closing: bool
    paused_r: bool
    inbox: bytearray
    deadline: float
    phase: str
    linger_until: float
    eof: bool

    # ------------------------------------------------------------------ the clock: deadlines, idle, linger
    def _deadline_limit(self) -> float:
        limits = self.srv.limits
        return limits.body_timeout if self.phase == "request body" else limits.header_timeout

    def _arm_deadline(self, phase: str) -> None:
        limits = self.srv.limits  # (no call to _deadline_limit: twice per request)
        self.phase = phase
        self.deadline = self.srv.now + (limits.body_timeout if phase == "request body" else limits.header_timeout)

    def tick(self, now: float, idle_cutoff: float) -> None:
        """The server's clock, once a second: parked polls' ends, idle keep-alive, head and body deadlines,
        lingering closes."""
        if self.closing:
            if self.linger_until and now >= self.linger_until:
                self.linger_until = 0.0
                self.transport.abort()  # the client neither read the response nor closed: enough
            return
        parked = self.parked
        if parked is not None and parked.expires and now >= parked.expires:  # see COARSE_EXPIRY
            parked.expires = 0.0
            parked.expire()
            return
        if self.idle:
            self._idle_expired(idle_cutoff)
        elif self.deadline and now >= self.deadline:
            self.deadline = 0.0
            self.fail(408, f"{self.phase} not received within {self._deadline_limit():g} s")

    def _arm_idle(self) -> None:
        if not self.idle:
            self.idle = self.srv.now  # no timer per request: the server's 1 s tick closes expired idle ones

    def _idle_expired(self, cutoff: float) -> None:
        if self.idle <= cutoff and self.cur is None and self.reader.req is None and not self.queue and not self.closing:
            self.closing = True
            self.transport.close()

    # ------------------------------------------------------------------ ends: errors, closes, shutdown
    def fail(self, status: int, reason: str) -> None:
        """A request we cannot parse or accept: answer (unless another response is under way) and close."""
        if self.closing:
            return
        self.reader.req = None
        cur, cycle = self.cur, self.cycle
        answer = cur is None or cur.refused is not None or (not cur.started and cycle is None)
        if cycle is not None and cycle.phase is ResponsePhase.NOT_STARTED:
            answer = True
            cycle.phase = ResponsePhase.STARTED  # the app's own response, if it still sends one, is discarded
            cycle.lost()
        if self.parked is not None:  # a parked poll: unregister it
            self.parked.abandon()
            answer = False  # its response head is already out (a stream) or it is mid-wait: just close
        if answer:
            self.transport.write(self.srv.error_response(status, reason))
        self._linger_close()

    def abort(self) -> None:
        self.closing = True
        self.transport.abort()

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

    def stop(self) -> None:
        """Shutdown begins: a parked poll is answered now (its client re-polls elsewhere); idle: close."""
        if self.parked is not None:
            self.parked.expire()
        elif self.cur is None and self.reader.req is None and not self.closing:
            self.closing = True
            self.transport.close()

    @property
    def responding(self) -> bool:
        return self.cycle is not None

    def close_now(self) -> None:
        if self.cycle is not None and self.cycle.task is not None:
            self.cycle.task.cancel()
        self.closing = True
        self.transport.close()
