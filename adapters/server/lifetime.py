"""What decides a lean-server connection's end (:class:`ConnectionLifetime`, the base of
:class:`~.connection.HttpConnection`): the server's clock (head and body deadlines, idle keep-alive, a lingering
close's end, a parked poll's expiry) and the ends themselves (a refused request, an abort, a lingering close,
shutdown).

A connection's life is one :class:`ConnState`; :data:`CONNECTION_MOVES` is every legal change, in one place, and
:meth:`ConnectionLifetime._move` the only code that makes one (anything else raises
:class:`~shmbus.errors.IllegalTransition`). What a deadline waits for is an :class:`Awaiting`.
"""

from __future__ import annotations

import enum
from typing import Any

from shmbus.errors import IllegalTransition

from .asgi_bridge import Cycle, ResponsePhase
from .bus_routes import ParkedPoll
from .reader import RequestReader
from .request import Request
from .server import Server

__all__ = ["CONNECTION_MOVES", "Awaiting", "ConnState", "ConnectionLifetime"]


class ConnState(enum.Enum):
    """Where a connection is in its life."""

    #: reading requests and answering them
    OPEN = "open"
    #: the client closed its side after sending a request: answer what it sent, then close
    HALF_CLOSED = "half-closed"
    #: the client asked for an upgrade: the current request is answered, nothing after it is read
    FINISHING = "finishing"
    #: answered: our write side is shut and input is drained (discarded) until the client closes or ``linger`` ends
    LINGERING = "lingering"
    #: the transport is closed or aborted
    CLOSED = "closed"


#: Every legal change of state, from -> to (staying in a state is always legal: closing twice, say).
CONNECTION_MOVES: dict[ConnState, frozenset[ConnState]] = {
    ConnState.OPEN: frozenset({ConnState.HALF_CLOSED, ConnState.FINISHING, ConnState.LINGERING, ConnState.CLOSED}),
    ConnState.HALF_CLOSED: frozenset({ConnState.CLOSED}),  # nothing to drain: a half-closed client is closed at once
    ConnState.FINISHING: frozenset({ConnState.LINGERING, ConnState.CLOSED}),
    ConnState.LINGERING: frozenset({ConnState.CLOSED}),  # (lingering again restarts its clock)
    ConnState.CLOSED: frozenset(),
}
assert set(CONNECTION_MOVES) == set(ConnState)


class Awaiting(enum.Enum):
    """What a connection's deadline waits for (its value is how the 408 answer names it)."""

    HEAD = "request head"
    BODY = "request body"


class ConnectionLifetime:
    """The deadlines and ends of one connection; :class:`~.connection.HttpConnection` sets the state below."""

    __slots__ = (
        "awaiting",
        "cur",
        "cycle",
        "deadline",
        "due",
        "idle",
        "inbox",
        "linger_until",
        "parked",
        "paused_r",
        "queue",
        "reader",
        "srv",
        "state",
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
    state: ConnState
    paused_r: bool
    inbox: bytearray
    deadline: float
    awaiting: Awaiting
    linger_until: float
    due: float

    # ------------------------------------------------------------------ the state
    def _move(self, to: ConnState) -> None:
        """Change state to ``to`` (:data:`CONNECTION_MOVES`); an illegal change raises and changes nothing."""
        now = self.state
        if to is not now and to not in CONNECTION_MOVES[now]:
            raise IllegalTransition(f"connection: {now.value} -> {to.value} is not a legal move")
        self.state = to

    @property
    def closing(self) -> bool:
        """Nothing more is read (input is discarded) and no new request starts (finishing, lingering, closed)."""
        state = self.state  # (asked on every read: identity, not an Enum's hash)
        return state is not ConnState.OPEN and state is not ConnState.HALF_CLOSED

    @property
    def eof(self) -> bool:
        """The client half-closed: answer what it sent, then close."""
        return self.state is ConnState.HALF_CLOSED

    def _close(self) -> None:
        self._move(ConnState.CLOSED)
        self.transport.close()

    # ------------------------------------------------------------------ the clock: deadlines, idle, linger
    def _deadline_limit(self) -> float:
        limits = self.srv.limits
        return limits.body_timeout if self.awaiting is Awaiting.BODY else limits.header_timeout

    def _arm_deadline(self, awaiting: Awaiting) -> None:
        srv = self.srv
        limits = srv.limits  # (no call to _deadline_limit: twice per request)
        self.awaiting = awaiting
        when = self.deadline = srv.now + (limits.body_timeout if awaiting is Awaiting.BODY else limits.header_timeout)
        if when < self.due:  # (inline: an earlier visit, usually idle's, finds a later deadline anyway)
            srv.visit_at(self, when)

    def wake_at(self, when: float) -> None:
        """The server's clock must visit this connection by ``when`` (a deadline just set)."""
        if when < self.due:
            self.srv.visit_at(self, when)

    def reschedule(self) -> None:
        """On the clock for exactly its earliest deadline, later than the one it waits for too (a parked poll:
        its connection would otherwise be visited for the deadlines of the request that is now parked)."""
        self.srv.visit_exactly(self, self._next_due())

    def tick(self, now: float, idle_cutoff: float) -> None:
        """The server's clock, when a deadline may have come (see :meth:`Server._tick`): parked polls' ends, idle
        keep-alive, head and body deadlines, lingering closes. Then it asks for the earliest deadline left."""
        self._due_now(now, idle_cutoff)
        if self.state is not ConnState.CLOSED:
            when = self._next_due()
            if when and when < self.due:
                self.srv.visit_at(self, when)

    def _next_due(self) -> float:
        """The earliest deadline :meth:`_due_now` checks (0: none)."""
        state = self.state  # (not the closing property: a visit's cost is most of the clock's)
        if state is ConnState.CLOSED:
            return 0.0
        if state is not ConnState.OPEN and state is not ConnState.HALF_CLOSED:  # closing
            return self.linger_until
        parked = self.parked
        when = parked.expires if parked is not None else 0.0
        mine = self.idle + self.srv.keepalive if self.idle else self.deadline
        return mine if mine and (not when or mine < when) else when

    def _due_now(self, now: float, idle_cutoff: float) -> None:
        if self.closing:
            if self.linger_until and now >= self.linger_until:
                self.linger_until = 0.0
                self._move(ConnState.CLOSED)
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
            self.fail(408, f"{self.awaiting.value} not received within {self._deadline_limit():g} s")

    def _arm_idle(self) -> None:
        if not self.idle:
            srv = self.srv
            idle = self.idle = srv.now  # no timer per request: the server's 1 s tick closes expired idle ones
            when = idle + srv.keepalive
            if when < self.due:
                srv.visit_at(self, when)

    def _idle_expired(self, cutoff: float) -> None:
        if self.idle <= cutoff and self.cur is None and self.reader.req is None and not self.queue and not self.closing:
            self._close()

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
        self._move(ConnState.CLOSED)
        self.transport.abort()

    def _linger_close(self) -> None:
        """Close after the response: shut the write side, drain (discard) input until the client closes or
        ``linger`` passes. Closing with unread input would make the kernel send a reset, which can destroy the
        response before the client reads it."""
        self.deadline = 0.0
        self.inbox = bytearray()
        t = self.transport
        if t.is_closing():
            self._move(ConnState.CLOSED)
            return
        if self.eof:  # the client already closed its side: nothing left to drain
            self._close()
            return
        if self.paused_r:
            self.paused_r = False
            t.resume_reading()
        try:
            if not t.can_write_eof():
                raise OSError("no half-close")
            t.write_eof()
        except (OSError, RuntimeError, NotImplementedError):
            self._close()
            return
        self._move(ConnState.LINGERING)
        self.linger_until = self.srv.now + self.srv.limits.linger
        self.wake_at(self.linger_until)

    def stop(self) -> None:
        """Shutdown begins: a parked poll is answered now (its client re-polls elsewhere); idle: close."""
        if self.parked is not None:
            self.parked.expire()
        elif self.cur is None and self.reader.req is None and not self.closing:
            self._close()

    @property
    def responding(self) -> bool:
        return self.cycle is not None

    def close_now(self) -> None:
        if self.cycle is not None and self.cycle.task is not None:
            self.cycle.task.cancel()
        self._close()
