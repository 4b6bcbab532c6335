"""The relay: the one process per host that copies the backend's history into the segment, for every backend.

The rules, written once (in :class:`~.machine.RelayMachine`, which does no I/O; :class:`Relay` here is its driver):

* **The backend is the truth, notices are doorbells.** A notice only says "read": the relay stores what
  :meth:`Backend.read_after` returns after its position, in id order. A stale, repeated or forged notice costs at
  most one read that finds nothing; it can neither store, duplicate nor reset anything. The one shortcut: a line
  the backend's own publish code *sealed* (:mod:`.seals`) for the history the segment records, and whose id is
  the very next after the position, is the backend's word already and is stored without the read.
* **Loss is counted.** Ids the backend no longer holds when the relay reads past them (trimmed or expired before
  this host read them; a writer that outlived the backend's timeout) are added to ``relay_lost`` and logged, and
  every channel's next message starts a new chain (``Segment.break_chains``), so a backlog read across the loss
  reports ``gap=True`` (or is completed from the backend) instead of silently skipping.
* **A reset only for another history.** The backend names its history (:meth:`Backend.history_id`); the segment
  records the one it holds. Only a different name, confirmed by :meth:`Backend.history_continues` on a message
  of the segment read first, empties the bus. Ids compared at different moments never decide it, so a local
  publisher landing its own message cannot make the segment look ahead.
* **A host's own messages are its publisher's.** A message trimmed from its channel in the backend before the
  relay read it may be one a publisher of this host is landing (:mod:`.landing`): the relay waits for it, bounded
  by ``landing_wait`` and once per catch-up when it does not come, before counting it lost.
* **No duplicate window.** The position is the only memory: a read starts after ``max(position, segment's id)``
  and the segment skips ids it holds, so nothing is stored twice and nothing newer is ever taken for "already
  stored" (a reset sets the position back to 0 with the bus).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from shmbus.channels import split_backend_name
from shmbus.engines import Envelope
from shmbus.errors import PayloadTooLarge

from .backend import Backend, Doorbell, Row
from .election import RelayElection
from .events import (
    DONE,
    HALTED,
    HALTING,
    Action,
    BusReset,
    Confirmed,
    ConfirmHistory,
    ElectionTaken,
    Event,
    Failed,
    GoneUpto,
    HistoryNamed,
    Landed,
    Maintain,
    Newest,
    PageRead,
    PauseFor,
    Rang,
    Read,
    RecordHistory,
    Refusal,
    Released,
    Settled,
    Simple,
    Stored,
    StoreRows,
    WaitLanded,
    WaitRing,
)
from .landing import wait_until_held
from .machine import RelayMachine
from .status import BridgeStatus
from .steps import RelayConfig
from .wire import decode_envelope

if TYPE_CHECKING:
    from shmbus.host import BusHost

__all__ = ["Relay"]


class _Segment:
    """The bus's segment as the machine reads it (``bus.segment`` each time: it is re-armed after fork)."""

    def __init__(self, bus: BusHost) -> None:
        self.bus = bus

    def global_id(self) -> int:
        return self.bus.segment.global_id()

    def history_id(self) -> int:
        return self.bus.segment.history_id()


class Relay:
    """Runs the election and, while this process holds it, the relay (one thread per process): the thread performs
    the actions of its :class:`~.machine.RelayMachine` (``machine``) and hands each outcome back. ``pause``: how
    the thread waits (default: on ``stop``; a test gives a fake clock's)."""

    def __init__(
        self,
        bus: BusHost,
        backend: Backend,
        status: BridgeStatus,
        election: RelayElection,
        log: logging.Logger,
        *,
        election_interval: float,
        reconnect_max: float,
        trim_interval: float = 0.0,
        landing_wait: float = 0.0,
        pause: Callable[[float], object] | None = None,
    ) -> None:
        self.bus = bus
        self.backend = backend
        self.status = status
        self.election = election
        self.log = log
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        self.pause = pause  #: how the thread waits (None: on ``stop``); a test gives a fake clock's
        self._bell: Doorbell | None = None
        config = RelayConfig(
            bus.name,
            sparse_ids=backend.sparse_ids,
            seal_hash=backend.seal_hash,
            errors=backend.errors,
            unreachable=backend.unreachable,
            election_interval=election_interval,
            reconnect_max=reconnect_max,
            trim_interval=trim_interval,
            landing_wait=landing_wait,
        )
        self.machine = RelayMachine(config, status, _Segment(bus), log)
        self.pending: Action | None = None  #: the action the machine asked for and the thread performs next
        self._simple: dict[str, Callable[[], Event]] = {
            "take_election": lambda: ElectionTaken(self.election.try_take()),
            "release_election": self._release,
            "flush_metrics": self._flush_metrics,
            "open_doorbell": self._open,
            "close_doorbell": self._close_bell,
            "name_history": lambda: HistoryNamed(self.backend.history_id(), self.backend.newest_id()),
            "reset_bus": self._reset,
            "ask_gone": lambda: GoneUpto(self.backend.gone_upto()),
            "settle": lambda: Settled(self.backend.settle(self.stop)),
            "break_chains": self._break_chains,
            "ask_newest": lambda: Newest(self.backend.newest_id()),
            "keep_alive": self._keepalive,
        }
        #: how each kind of action is performed
        self._perform: dict[type, Callable[[Any], Event]] = {
            Simple: lambda action: self._simple[action.what](),
            StoreRows: lambda action: self._store(action.rows),
            WaitRing: self._wait_ring,
            WaitLanded: self._wait_landed,
            Read: lambda action: PageRead(self.backend.read_after(action.after, action.limit)),
            PauseFor: self._pause_for,
            ConfirmHistory: lambda action: Confirmed(
                self.backend.history_continues(self.bus.segment, action.changed, action.mark)
            ),
            RecordHistory: self._record_history,
            Maintain: self._maintain,
        }

    # ------------------------------------------------------------------ thread
    def start(self) -> None:
        self.stop = threading.Event()
        t = threading.Thread(target=self.run, name=f"shmbus-{self.status.kind}-relay-{self.bus.name}", daemon=True)
        self.thread = t
        t.start()

    def run(self) -> None:
        """The thread: perform what the machine asks until it stops (told to, by :meth:`close`)."""
        self.pending = self.machine.start()
        while self.pending is not None:
            self.advance()

    def advance(self) -> Action | None:
        """Perform the pending action, hand its outcome to the machine; the next action (None: stopped). A test
        calls this itself, one action at a time."""
        action = self.pending
        if action is None:
            raise RuntimeError("the relay is not running (call run(), or pending = machine.start())")
        kind = type(action)
        try:
            if (kind is WaitRing or kind is Read or (kind is Simple and action in HALTING)) and self.stop.is_set():
                event: Event = HALTED  # a loop's head, and the relay was told to stop
            else:
                event = self._perform[kind](action)
        except Exception as exc:
            event = Failed(exc, self.stop.is_set())
        try:
            self.pending = self.machine.handle(event)
        except Exception as exc:  # a fault in the rules (an illegal move, say): as any relay error, it reconnects
            self.pending = self.machine.handle(Failed(exc, self.stop.is_set()))
        return self.pending

    def after_fork(self) -> None:
        """In a forked child: the parent's thread is gone and its doorbell is the parent's (closing our copy would
        shut the parent's socket down), so forget both."""
        self.thread = None
        self._bell = None
        self.pending = None
        self.machine.after_fork()

    def close(self, join: bool) -> None:
        self.stop.set()
        bell = self._bell
        if bell is not None:
            try:
                bell.close()  # wakes the relay out of its wait at once
            except Exception:
                pass
        t = self.thread
        if join and t is not None and t is not threading.current_thread():
            t.join(10)
        self.thread = None

    # ------------------------------------------------------------------ the actions
    def perform(self, action: Action) -> Event:
        """Do what ``action`` asks (the I/O); the event that answers it (:mod:`.events`)."""
        return self._perform[type(action)](action)

    def _wait_ring(self, action: WaitRing) -> Rang:
        ring = self._doorbell().ring(action.timeout)
        return Rang(ring, self.backend.seal_key() if ring.seals else None)

    def _wait_landed(self, action: WaitLanded) -> Landed:
        """Wait until the segment holds the id (its publisher landed it), the time is up, the bus was reset or the
        relay is told to stop. Timed on the relay's clock (a test's fake one moves with ``pause``)."""
        seg, clock = self.bus.segment, self.status.relay.clock
        return Landed(
            wait_until_held(seg, action.global_id, action.timeout, clock=clock, sleep=self.pause, stop=self.stop)
        )

    def _pause_for(self, action: PauseFor) -> Event:
        if self.pause is not None:
            self.pause(action.seconds)
        else:
            self.stop.wait(action.seconds)
        return DONE

    def _record_history(self, action: RecordHistory) -> Event:
        self.bus.segment.set_history_id(action.history)
        return DONE

    def _maintain(self, action: Maintain) -> Event:
        self.backend.maintain(self.bus, action.position, action.active)
        return DONE

    def _doorbell(self) -> Doorbell:
        bell = self._bell
        if bell is None:
            raise RuntimeError("the relay's doorbell is not open")
        return bell

    def _release(self) -> Released:
        self.election.release()
        return Released(self.stop.is_set())

    def _flush_metrics(self) -> Event:
        """Write this process's figures now: a process that relays may have no listener thread to do it."""
        try:
            self.bus.metrics.flush()
        except Exception:
            self.log.debug("shmbus: metrics flush from the relay failed", exc_info=True)
        return DONE

    def _open(self) -> Event:
        self._bell = self.backend.open_doorbell()
        return DONE

    def _close_bell(self) -> Event:
        bell, self._bell = self._bell, None
        if bell is not None:
            try:
                bell.close()
            except Exception:
                pass
        return DONE

    def _reset(self) -> BusReset:
        self.bus.reset()
        return BusReset(self.backend.newest_id())

    def _break_chains(self) -> Event:
        self.bus.segment.break_chains()
        return DONE

    def _keepalive(self) -> Event:
        self._doorbell().keepalive()
        return DONE

    def _store(self, rows: list[Row]) -> Stored:
        """Store ``rows`` in order, the backend's ids imposed (0 from the segment: already there, its publisher on
        this host stored it); stop at the first the segment refuses or that fails."""
        bus = self.bus
        codec, size, age = bus.codec, bus.max_backlog_size, bus.max_backlog_age
        done = relayed = 0
        for row in rows:
            try:
                value = row.value
                if value is None:
                    raise ValueError("the row carries no message")  # the machine sends none: it counts them lost
                channel, site = split_backend_name(row.channel)
                payload, meta = decode_envelope(codec, value)
                env = Envelope(channel, site, payload, meta, size, age)
                stored = bus.store(env, global_id=row.global_id, message_id=row.message_id, timestamp=time.time())
            except PayloadTooLarge as exc:  # published on a host with a larger ring: this one cannot hold it
                return Stored(done, relayed, Refusal("too_large", exc))
            except (ValueError, UnicodeDecodeError, TypeError) as exc:
                return Stored(done, relayed, Refusal("unstorable", exc))
            except Exception as exc:  # an error of the segment itself: the next read tries it again
                return Stored(done, relayed, failed=Failed(exc, self.stop.is_set()))
            done += 1
            if stored:
                relayed += 1
        return Stored(done, relayed)
