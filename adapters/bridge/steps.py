"""What the relay machine (:mod:`.machine`) is made of besides its rules: what it waits for (:class:`Step`: the
answer to the one action it gave; the events each step takes are :data:`.machine.RelayMachine.TABLE`), what it knows
of its bridge (:class:`RelayConfig`) and what it reads of the segment (:class:`SegmentView`)."""

from __future__ import annotations

import enum
from typing import Protocol

from shmbus.errors import IllegalTransition

__all__ = ["OUTSIDE", "IllegalEvent", "RelayConfig", "SegmentView", "Step"]


class SegmentView(Protocol):
    """What the machine reads of the segment (shared memory: no I/O, no side effect)."""

    def global_id(self) -> int: ...
    def history_id(self) -> int: ...


class IllegalEvent(IllegalTransition):
    """An event the machine's step does not take: a fault in the driver or the rules, never the backend's."""


class RelayConfig:
    """What the machine knows of its bridge: the bus's name, the backend's traits, the intervals."""

    def __init__(
        self,
        bus_name: str,
        *,
        sparse_ids: bool,
        seal_hash: str,
        errors: tuple[type[BaseException], ...],
        unreachable: tuple[type[BaseException], ...],
        election_interval: float,
        reconnect_max: float,
        trim_interval: float = 0.0,
        landing_wait: float = 0.0,
    ) -> None:
        self.bus_name = bus_name
        self.sparse_ids = sparse_ids
        self.seal_hash = seal_hash
        self.quiet_errors = (*errors, OSError, ValueError)  # failures worth a line, not a traceback
        self.unreachable = unreachable
        self.election_interval = election_interval
        self.reconnect_max = reconnect_max
        self.trim_interval = trim_interval
        self.landing_wait = landing_wait  # how long a trimmed message may wait for its publisher on this host


class Step(enum.Enum):
    """The machine's steps; each value names the action whose answer it waits for."""

    IDLE = "nothing: not started"  # start() gives the first action
    ELECTING = "take_election"  # -> ElectionTaken | Halted
    STANDING = "a pause before the next try"  # PauseFor -> Done
    FLUSH_ELECTED = "flush_metrics, then connect"
    OPENING = "open_doorbell"  # -> Done | Halted
    NAMING = "name_history"  # -> HistoryNamed
    CONFIRMING = "confirm_history"  # -> Confirmed
    RESETTING = "reset_bus"  # -> BusReset
    RECORDING = "record_history"  # -> Done
    READING = "read"  # -> PageRead | Halted
    JOINING = "ask_gone, for a brand-new segment"  # -> GoneUpto
    GAP = "ask_gone, for a gap in the page"  # -> GoneUpto
    TAIL = "ask_gone, after a short page"  # -> GoneUpto
    STORING = "store_rows"  # -> Stored
    BREAKING = "break_chains, then go on"  # -> Done
    BREAKING_TAIL = "break_chains, then finish the catch-up"  # -> Done
    SETTLING = "settle"  # -> Settled
    LANDING = "wait_landed"  # -> Landed
    FINISHING = "ask_newest"  # -> Newest
    FLUSH_CAUGHT_UP = "flush_metrics, then follow the doorbell"
    RINGING = "wait_ring"  # -> Rang | Halted
    KEEPING = "keep_alive"  # -> Done
    MAINTAINING = "maintain"  # -> Done
    FLUSH_PUMP = "flush_metrics, then wait again"
    FLUSH_FAILED = "flush_metrics, then back off"
    BACKING_OFF = "a pause before reconnecting"  # PauseFor -> Done
    CLOSING = "close_doorbell, then connect again"  # -> Done
    RELEASING = "release_election"  # -> Released
    FLUSH_RELEASED = "flush_metrics, then stand again"
    ENDED = "nothing: stopped"  # the driver's loop ends


#: The steps outside a session (the process does not hold the election, or is releasing it): a failure there is
#: the election loop's ("election/relay error", try again later), anywhere else the relay's (it reconnects).
OUTSIDE = frozenset({Step.IDLE, Step.ELECTING, Step.STANDING, Step.RELEASING, Step.FLUSH_RELEASED, Step.ENDED})
