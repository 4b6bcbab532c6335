"""The relay machine's vocabulary (:mod:`.machine`): the actions it asks its driver for, one at a time, and the
events the driver answers with. Plain tuples: the machine does no I/O, the driver (:mod:`.relay`) does nothing else.

Each action names the event that answers it; an action marked ``halts`` is a loop's head: the driver first looks
whether the relay was told to stop, and answers :data:`HALTED` instead of performing it.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from .backend import DoorbellRing, Page, Row

__all__ = [
    "ASK_GONE",
    "ASK_NEWEST",
    "BREAK_CHAINS",
    "CLOSE_DOORBELL",
    "DONE",
    "FLUSH_METRICS",
    "HALTED",
    "KEEP_ALIVE",
    "NAME_HISTORY",
    "OPEN_DOORBELL",
    "RELEASE_ELECTION",
    "RESET_BUS",
    "SETTLE",
    "TAKE_ELECTION",
    "Action",
    "BusReset",
    "Confirmed",
    "ConfirmHistory",
    "Done",
    "ElectionTaken",
    "Event",
    "Failed",
    "GoneUpto",
    "Halted",
    "HistoryNamed",
    "Landed",
    "Maintain",
    "Newest",
    "PageRead",
    "PauseFor",
    "Rang",
    "Read",
    "RecordHistory",
    "Refusal",
    "Released",
    "Settled",
    "Simple",
    "Stored",
    "StoreRows",
    "WaitLanded",
    "WaitRing",
]


# ---------------------------------------------------------------------------------------------------- actions
class Simple(NamedTuple):
    """An action with no argument (the constants below): ``what`` names it."""

    what: Literal[
        "take_election",
        "release_election",
        "flush_metrics",
        "open_doorbell",
        "close_doorbell",
        "name_history",
        "reset_bus",
        "ask_gone",
        "settle",
        "break_chains",
        "ask_newest",
        "keep_alive",
    ]


TAKE_ELECTION = Simple("take_election")  #: halts; ``election.try_take()`` -> :class:`ElectionTaken`
RELEASE_ELECTION = Simple("release_election")  #: ``election.release()`` -> :class:`Released`
FLUSH_METRICS = Simple("flush_metrics")  #: this process's metrics (a relay may have no listener) -> :data:`DONE`
OPEN_DOORBELL = Simple("open_doorbell")  #: halts; ``backend.open_doorbell()`` -> :data:`DONE`
CLOSE_DOORBELL = Simple("close_doorbell")  #: close it (never fails) -> :data:`DONE`
NAME_HISTORY = Simple("name_history")  #: ``backend.history_id()`` -> :class:`HistoryNamed`
RESET_BUS = Simple("reset_bus")  #: ``bus.reset()`` (another history) -> :class:`BusReset`
ASK_GONE = Simple("ask_gone")  #: ``backend.gone_upto()`` -> :class:`GoneUpto`
SETTLE = Simple("settle")  #: ``backend.settle()``: wait for writers that may hold a missing id -> :class:`Settled`
BREAK_CHAINS = Simple("break_chains")  #: ``segment.break_chains()`` (a loss on sparse ids) -> :data:`DONE`
ASK_NEWEST = Simple("ask_newest")  #: ``backend.newest_id()`` -> :class:`Newest`
KEEP_ALIVE = Simple("keep_alive")  #: ``doorbell.keepalive()`` -> :data:`DONE`

#: The simple actions that are a loop's head (see the module doc).
HALTING = frozenset({TAKE_ELECTION, OPEN_DOORBELL})


class PauseFor(NamedTuple):
    """Wait ``seconds`` (cut short when told to stop) -> :data:`DONE`."""

    seconds: float


class ConfirmHistory(NamedTuple):
    """``backend.history_continues(segment, changed, mark)`` -> :class:`Confirmed`."""

    changed: bool
    mark: int


class RecordHistory(NamedTuple):
    """``segment.set_history_id(history)`` -> :data:`DONE`."""

    history: int


class Read(NamedTuple):
    """Halts; ``backend.read_after(after, limit)`` -> :class:`PageRead`."""

    after: int
    limit: int


class StoreRows(NamedTuple):
    """Store ``rows`` in the segment, in order (the segment skips ids it holds); the driver stops after the first
    row it could not store -> :class:`Stored`."""

    rows: list[Row]


class WaitRing(NamedTuple):
    """Halts; ``doorbell.ring(timeout)`` -> :class:`Rang`."""

    timeout: float


class WaitLanded(NamedTuple):
    """Wait up to ``timeout`` s (cut short when told to stop) for the segment to hold ``global_id``: a message the
    backend trimmed before the relay read it, which a publisher of this host may still be landing ->
    :class:`Landed`."""

    global_id: int
    timeout: float


class Maintain(NamedTuple):
    """``backend.maintain(bus, position, active)`` (the backend's trims) -> :data:`DONE`."""

    position: int
    active: dict[str, int]


Action = Simple | PauseFor | ConfirmHistory | RecordHistory | Read | StoreRows | WaitRing | WaitLanded | Maintain


# ---------------------------------------------------------------------------------------------------- events
class Done(NamedTuple):
    """An action that returns nothing was performed."""


class Halted(NamedTuple):
    """The relay was told to stop: the driver performed nothing."""


DONE = Done()
HALTED = Halted()


class Failed(NamedTuple):
    """Performing the action raised ``error``; ``stopping``: the relay had been told to stop by then."""

    error: BaseException
    stopping: bool


class ElectionTaken(NamedTuple):
    won: bool  #: this process took the host's relay lock


class Released(NamedTuple):
    stopping: bool  #: the relay had been told to stop


class HistoryNamed(NamedTuple):
    current: int  #: the backend's history identity (0: it cannot say now)
    backend_newest: int  #: ``backend.newest_id()`` right after


class Confirmed(NamedTuple):
    continues: bool  #: the backend still holds the history whose messages the segment holds


class BusReset(NamedTuple):
    backend_newest: int  #: ``backend.newest_id()`` right after the reset


class PageRead(NamedTuple):
    page: Page


class GoneUpto(NamedTuple):
    upto: int


class Settled(NamedTuple):
    ok: bool  #: False: a writer outlived the backend's timeout (the ids it may hold count as lost)


class Landed(NamedTuple):
    ok: bool  #: the segment holds the id now (its publisher landed it); False: the wait ran out


class Refusal(NamedTuple):
    """Why the segment did not take a row: ``too_large`` for this host's ring (a loss, with its reason), or
    ``unstorable`` (it does not decode: skipped and counted)."""

    why: Literal["too_large", "unstorable"]
    error: Exception


class Stored(NamedTuple):
    """The first ``done`` rows of a :class:`StoreRows` went in (``relayed`` of them new: the others were there);
    then the next row was refused (``refused``), or storing it failed (``failed``), or there was none."""

    done: int
    relayed: int
    refused: Refusal | None = None
    failed: Failed | None = None


class Newest(NamedTuple):
    newest: int


class Rang(NamedTuple):
    """What one wait on the doorbell brought, and the backend's seal key as last read (when it brought seals)."""

    ring: DoorbellRing
    seal_key: bytes | None


Event = (
    Done
    | Halted
    | Failed
    | ElectionTaken
    | Released
    | HistoryNamed
    | Confirmed
    | BusReset
    | PageRead
    | GoneUpto
    | Settled
    | Landed
    | Stored
    | Newest
    | Rang
)
