"""The relay as a state machine with no I/O (sans-IO, like h11's ``Connection``): events in, actions out.

:class:`RelayMachine` holds every rule of the relay (the module doc of :mod:`.relay` lists them) and its state; a
driver (:class:`~.relay.Relay`, a thread) performs each action it returns against the election, the backend, the
doorbell and the segment, and hands the outcome back as an event (:mod:`.events`). The machine reads two inputs
itself, both without side effects: the segment's newest id and recorded history (a :class:`SegmentView`) and the
clock (``status.relay.clock``), so tests drive it with a memory backend and a fake clock, no server, no sleep.

It answers one action at a time. What it waits for is its :class:`Step`; :data:`RelayMachine.TABLE` is every
event each step takes, in one place: any other event raises :class:`IllegalEvent`, except :class:`~.events.Failed`,
legal in every step (any action may fail). The reported state (standby, connecting, relaying, reconnecting, off)
moves only as :data:`.lifecycle.MOVES` allows.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, ClassVar

from .catchup import PAGE, CatchUpRules
from .events import (
    CLOSE_DOORBELL,
    FLUSH_METRICS,
    KEEP_ALIVE,
    OPEN_DOORBELL,
    RELEASE_ELECTION,
    TAKE_ELECTION,
    Action,
    BusReset,
    Confirmed,
    Done,
    ElectionTaken,
    Event,
    Failed,
    GoneUpto,
    Halted,
    HistoryNamed,
    Landed,
    Maintain,
    Newest,
    PageRead,
    PauseFor,
    Rang,
    Released,
    Settled,
    Stored,
    WaitRing,
)
from .history import CatchUpFor, HistoryFor
from .losses import LossBook
from .seals import Sealer
from .status import BridgeStatus
from .steps import OUTSIDE, IllegalEvent, RelayConfig, SegmentView, Step

__all__ = ["PAGE", "IllegalEvent", "RelayConfig", "RelayMachine", "SegmentView", "Step"]

RING_WAIT = 0.25  # seconds of one doorbell wait (the pump's beat)
BACKOFF_FIRST = 0.05  # seconds before the first reconnect
HISTORY_CHECK_INTERVAL = 1.0  # seconds between history checks while relaying (one small backend call each)
STALE_CHECK_INTERVAL = 0.1  # at most this often, a notice below the position triggers a history check at once
IDLE_CHECK = 5.0  # seconds without notices before the doorbell's keepalive and a read (writes without a notice)
METRICS_INTERVAL = 1.0  # the relay flushes the process's metrics itself (a process may relay without a listener)
WAIT_RING = WaitRing(RING_WAIT)


class RelayMachine(CatchUpRules):
    """The relay's rules and state for one bridge in one process (see the module doc). ``status``: what the bridge
    reports (the relay's state is ``status.relay``); ``view``: the segment; ``log``: the bridge's logger."""

    #: Every event each step takes (``Failed``: every step). The handler returns the next action (None: stop).
    TABLE: ClassVar[dict[tuple[Step, type], Callable[[RelayMachine, Any], Action | None]]] = {}

    def __init__(self, config: RelayConfig, status: BridgeStatus, view: SegmentView, log: logging.Logger) -> None:
        self.config = config
        self.status = status
        self.relay = status.relay
        self.view = view
        self.log = log
        self.losses = LossBook(status, log)
        self.step = Step.IDLE
        self.backoff = BACKOFF_FIRST
        self.marked_unreachable = False  # the publish state says unreachable because of the relay
        self.named = False  # the backend named its history at the last check
        self.joining = False  # a brand-new segment: its first read says what the host was never owed
        self.mark = 0  # the segment's newest id when the backend's history was last confirmed (see history.py)
        self.active: dict[str, int] = {}  # channel -> newest id stored since the last maintain
        self.sealer: Sealer | None = None  # verifies seals for the last key and history seen
        self._now = 0.0  # the clock when the last ring came
        self._idle_since = self._next_history = self._next_stale = self._next_trim = self._next_metrics = 0.0
        self.clear_session()

    # ------------------------------------------------------------------ driving
    def start(self) -> Action:
        """The first action of a (re)started relay thread: stand for election."""
        self.step = Step.ELECTING
        return TAKE_ELECTION

    def handle(self, event: Event) -> Action | None:
        """Take ``event``, the answer to the last action; the next action (None: the relay has stopped)."""
        if type(event) is Failed:
            return self._failed(event)
        handler = self.TABLE.get((self.step, type(event)))
        if handler is None:
            raise IllegalEvent(f"the relay machine took {type(event).__name__} while waiting for {self.step.value}")
        return handler(self, event)

    def after_fork(self) -> None:
        """In a forked child: nothing of the parent's relay is this process's."""
        self.step = Step.IDLE
        self.active = {}
        self.mark = 0
        self.named = self.marked_unreachable = self.joining = False
        self.losses.after_fork()
        self.clear_session()

    def now(self) -> float:
        return self.relay.clock()

    def tick(self) -> None:
        """The relay made a step (a doorbell wait, a page, a connection): it is not stalled."""
        self.relay.step(self.relay.clock())

    # ------------------------------------------------------------------ the election
    def _taken(self, event: ElectionTaken) -> Action:
        if not event.won:
            return self._stand()
        self.relay.holding = True
        self.status.takeovers += 1
        self.status.set_relay_state("connecting")
        self.step = Step.FLUSH_ELECTED
        return FLUSH_METRICS

    def _stand(self, _: Done | None = None) -> Action:
        self.step = Step.STANDING
        return PauseFor(self.config.election_interval)

    def _stood(self, _: Done) -> Action:
        self.step = Step.ELECTING
        return TAKE_ELECTION

    def _ended(self, _: Halted) -> None:
        self.step = Step.ENDED
        return None

    def _release(self, _: Any = None) -> Action:
        self.clear_session()
        self.step = Step.RELEASING
        return RELEASE_ELECTION

    def _released(self, event: Released) -> Action:
        self.relay.holding = False
        if not event.stopping:
            self.status.set_relay_state("standby")
        self.step = Step.FLUSH_RELEASED
        return FLUSH_METRICS

    def _failed(self, event: Failed) -> Action | None:
        if self.step is Step.ENDED:
            raise IllegalEvent("the relay machine took Failed after it stopped")
        if self.step not in OUTSIDE:
            return self.session_failed(event)
        if event.stopping:
            self.step = Step.ENDED
            return None
        self.log.error("shmbus %s bridge: election/relay error (retrying)", self.status.kind, exc_info=event.error)
        self.status.set_relay_state("standby", event.error)
        return self._stand()

    # ------------------------------------------------------------------ a session: connect, catch up, follow
    def _connect(self, _: Done | None = None) -> Action:
        """The relay loop's head: open the doorbell first, so nothing published after the catch-up read goes
        unnoticed; then check the history and catch up."""
        self.tick()
        self.step = Step.OPENING
        return OPEN_DOORBELL

    def _opened(self, _: Done) -> Action:
        return self.check_history("start")

    def history_checked(self, reset: bool, purpose: HistoryFor) -> Action:
        """Where a history check goes on (its ``purpose``): start, stale, periodic (a page's: :mod:`.catchup`)."""
        if purpose == "start":
            return self.catch_up("start")
        if purpose == "stale":
            return self.catch_up("top") if reset else self._pump_history()
        if purpose == "periodic":
            return self.catch_up("history") if reset else self._pump_idle()
        return self.page_history_checked(reset)

    def caught_up(self, purpose: CatchUpFor) -> Action:
        """Where a catch-up goes on (its ``purpose``): the session's first, or one of the pump's."""
        if purpose == "start":
            self.status.set_relay_state("relaying")
            if self.marked_unreachable and self.status.state == "unreachable":
                self.status.set_state("ok")  # the relay's own failure said so; it is reachable again
            self.marked_unreachable = False
            self.step = Step.FLUSH_CAUGHT_UP
            return FLUSH_METRICS
        if purpose == "top":
            return self._pump_history()
        if purpose == "history":
            return self._pump_idle()
        return self._pump_trim()

    def session_failed(self, event: Failed) -> Action:
        """Any action of a session failed: back off (doubling, capped) and connect again."""
        self.clear_session()
        if event.stopping:
            self.step = Step.CLOSING
            return CLOSE_DOORBELL
        exc = event.error
        if not isinstance(exc, self.config.quiet_errors):
            self.log.error("shmbus %s bridge: relay error", self.status.kind, exc_info=exc)
        if isinstance(exc, self.config.unreachable) and self.status.state in ("ok", "unknown"):
            self.status.set_state("unreachable", exc)  # health() must not say ok while it is down
            self.marked_unreachable = True
        self.status.set_relay_state("reconnecting", exc)
        self.step = Step.FLUSH_FAILED
        return FLUSH_METRICS

    def _back_off(self, _: Done) -> Action:
        wait, self.backoff = self.backoff, min(self.backoff * 2, self.config.reconnect_max)
        self.step = Step.BACKING_OFF
        return PauseFor(wait)

    def _close(self, _: Done | Halted) -> Action:
        """Close the doorbell (after the backoff, or when told to stop: the relay loop's head then ends it)."""
        self.step = Step.CLOSING
        return CLOSE_DOORBELL

    # ------------------------------------------------------------------ the pump: one doorbell wait at a time
    def _follow(self, _: Done) -> Action:
        """Caught up: follow the doorbell (the timers start now)."""
        self.backoff = BACKOFF_FIRST
        now = self.now()
        self._idle_since = self._next_stale = now
        self._next_history = now + HISTORY_CHECK_INTERVAL
        self._next_trim = now + self.config.trim_interval
        self._next_metrics = now + METRICS_INTERVAL
        return self._wait()

    def _wait(self, _: Done | None = None) -> Action:
        self.step = Step.RINGING
        return WAIT_RING

    def _rang(self, event: Rang) -> Action:
        self.tick()
        now = self._now = self.now()
        ring = event.ring
        if ring.top:
            self._idle_since = now
            relay = self.relay
            # publishers land only right after the segment's newest: every id up to it is settled
            relay.position = max(relay.position, self.view.global_id())
            if ring.top > relay.position:
                return self.store_sealed(ring, event.seal_key)  # else stale, repeated, landed or forged: nothing
            if ring.top < relay.position and now >= self._next_stale:
                # An id below the position may be a new history's (a FLUSHDB, a TRUNCATE ... RESTART IDENTITY):
                # look now, not at the next periodic check, so the bus is reset before that history reaches this
                # position and a publisher here lands one of its ids in the old epoch.
                self._next_stale = now + STALE_CHECK_INTERVAL
                self._next_history = now + HISTORY_CHECK_INTERVAL
                return self.check_history("stale")
        return self._pump_history()

    def _pump_history(self) -> Action:
        if self._now >= self._next_history:
            self._next_history = self._now + HISTORY_CHECK_INTERVAL
            return self.check_history("periodic")
        return self._pump_idle()

    def _pump_idle(self) -> Action:
        if self._now - self._idle_since > IDLE_CHECK:
            self._idle_since = self._now
            self.step = Step.KEEPING
            return KEEP_ALIVE
        return self._pump_trim()

    def _kept_alive(self, _: Done) -> Action:
        return self.catch_up("idle")  # rows written without a notice (a connection lost between insert and notify)

    def _pump_trim(self) -> Action:
        trim = self.config.trim_interval
        if trim > 0 and self._now >= self._next_trim:
            self._next_trim = self._now + trim
            active, self.active = self.active, {}
            self.step = Step.MAINTAINING
            return Maintain(self.relay.position, active)
        return self._pump_metrics()

    def _pump_metrics(self, _: Done | None = None) -> Action:
        if self._now >= self._next_metrics:
            self._next_metrics = self._now + METRICS_INTERVAL
            self.step = Step.FLUSH_PUMP
            return FLUSH_METRICS
        return self._wait()


_T = RelayMachine.TABLE
_T.update(
    {
        (Step.ELECTING, ElectionTaken): RelayMachine._taken,
        (Step.ELECTING, Halted): RelayMachine._ended,
        (Step.STANDING, Done): RelayMachine._stood,
        (Step.FLUSH_ELECTED, Done): RelayMachine._connect,
        (Step.OPENING, Done): RelayMachine._opened,
        (Step.OPENING, Halted): RelayMachine._release,
        (Step.NAMING, HistoryNamed): RelayMachine.history_named,
        (Step.CONFIRMING, Confirmed): RelayMachine.history_confirmed,
        (Step.RESETTING, BusReset): RelayMachine.bus_reset,
        (Step.RECORDING, Done): RelayMachine.history_recorded,
        (Step.READING, PageRead): RelayMachine.page_read,
        (Step.READING, Halted): RelayMachine.finish_catch_up,
        (Step.JOINING, GoneUpto): RelayMachine.joined,
        (Step.GAP, GoneUpto): RelayMachine.gap_gone,
        (Step.TAIL, GoneUpto): RelayMachine.tail_gone,
        (Step.STORING, Stored): RelayMachine.stored,
        (Step.BREAKING, Done): RelayMachine.go_on_storing,
        (Step.BREAKING_TAIL, Done): RelayMachine.finish_catch_up,
        (Step.SETTLING, Settled): RelayMachine.settled,
        (Step.LANDING, Landed): RelayMachine.landed,
        (Step.FINISHING, Newest): RelayMachine.newest,
        (Step.FLUSH_CAUGHT_UP, Done): RelayMachine._follow,
        (Step.RINGING, Rang): RelayMachine._rang,
        (Step.RINGING, Halted): RelayMachine._close,
        (Step.KEEPING, Done): RelayMachine._kept_alive,
        (Step.MAINTAINING, Done): RelayMachine._pump_metrics,
        (Step.FLUSH_PUMP, Done): RelayMachine._wait,
        (Step.FLUSH_FAILED, Done): RelayMachine._back_off,
        (Step.BACKING_OFF, Done): RelayMachine._close,
        (Step.CLOSING, Done): RelayMachine._connect,
        (Step.RELEASING, Released): RelayMachine._released,
        (Step.FLUSH_RELEASED, Done): RelayMachine._stand,
    }
)
