"""One waiting request (a long poll or a stream), its states, and the targeting rules that decide what it may see.

A waiter's place in its registry is one :class:`Stage`; :data:`MOVES` is every legal step between stages, in one
place, and :meth:`Waiter.move` the only code that changes the stage (anything else raises
:class:`~shmbus.errors.IllegalTransition`). The registry moves a waiter under its lock; a shell ends one through
the protocol (``MessageBusProtocol.end``), which takes the same lock.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from shmbus.bus import Bus
from shmbus.channels import GLOBAL_PREFIX
from shmbus.errors import IllegalTransition
from shmbus.message import Message

from .interning import intern_bounded
from .wire import encode_status

log = logging.getLogger("shmbus.adapters")


# ---------------------------------------------------------------------------------------------------- clients
class Ending(enum.Enum):
    """Why a waiting request ends before its messages or its interval."""

    #: the client went away, or stopped reading a stream (``max_stream_buffer``): nothing more is sent
    DROPPED = "dropped"
    #: the bus was reset: a status of 0 for every channel is the answer (the client re-reads the new epoch)
    RESET = "reset"
    #: a request of the same client id with a higher ``__seq`` is parked: the first chunk was the whole answer
    STALE = "stale"


class Stage(enum.IntEnum):
    """Where a waiting request is in its life: in the registry's index or not, delivered to or not, ending or not.

    (An ``IntEnum``, like :class:`Move`: the delivery path moves thousands of waiters a batch, and an int's hash and
    a list index cost less than an ``Enum``'s hash.)"""

    #: built, not in the index yet
    NEW = 0
    #: in the index while its backlog is read: live messages are held (``Waiter.held``), not delivered
    CAPTURING = 1
    #: the parked request of its client id: live messages are delivered to it
    PARKED = 2
    #: still parked (in the index) but must end now: its messages came, or an :class:`Ending`; the shell answers
    ENDING = 3
    #: out of the index without ending: answered at once (its backlog was the answer, or a newer request is parked)
    LEFT = 4
    #: out of the index and ended: nothing more is delivered to it
    ENDED = 5


class Move(enum.IntEnum):
    """The steps that change a waiter's :class:`Stage` (see :data:`MOVES`)."""

    CAPTURE = 0  # the registry indexes it before its backlog is read
    PARK = 1  # it becomes the parked request of its client id
    LEAVE = 2  # out of the index unparked: answered at once (immediate, refused, a failed backlog read)
    END = 3  # must end now (messages came, an Ending); ending an ended waiter changes nothing but its reason
    RELEASE = 4  # the registry lets an ending waiter go (out of the index)
    FINISH = 5  # the shell takes what is left: out of the index, ended


#: Every legal ``(stage, move) -> stage``; any other pair raises :class:`~shmbus.errors.IllegalTransition`.
MOVES: dict[tuple[Stage, Move], Stage] = {
    (Stage.NEW, Move.CAPTURE): Stage.CAPTURING,
    (Stage.CAPTURING, Move.PARK): Stage.PARKED,
    (Stage.CAPTURING, Move.LEAVE): Stage.LEFT,
    (Stage.PARKED, Move.END): Stage.ENDING,
    (Stage.ENDING, Move.END): Stage.ENDING,
    (Stage.LEFT, Move.END): Stage.ENDED,  # a refused stream: its first chunk is the whole answer
    (Stage.ENDED, Move.END): Stage.ENDED,
    (Stage.ENDING, Move.RELEASE): Stage.ENDED,
    (Stage.PARKED, Move.FINISH): Stage.ENDED,
    (Stage.ENDING, Move.FINISH): Stage.ENDED,
    (Stage.LEFT, Move.FINISH): Stage.ENDED,
    (Stage.ENDED, Move.FINISH): Stage.ENDED,  # finishing twice (a stream's end, then the shell's cleanup)
}

#: MOVES as a list per stage, indexed by move (None: illegal), for :meth:`Waiter.move`.
_NEXT: list[list[Stage | None]] = [[MOVES.get((stage, move)) for move in Move] for stage in Stage]

#: The stages of a waiter in the registry's index, of one counted as parked, and of one that must end.
INDEXED = frozenset({Stage.CAPTURING, Stage.PARKED, Stage.ENDING})
COUNTED = frozenset({Stage.PARKED, Stage.ENDING})
DONE = frozenset({Stage.ENDING, Stage.ENDED})


@dataclass
class Lookups:
    user_id: Any = None
    group_ids: frozenset[Any] = frozenset()
    site_id: str | None = None


class Waiter:
    """One request that waits for live messages (long poll or stream).

    ``last`` holds, per channel, the highest id this request has delivered or skipped; live messages at or
    below it are never sent. ``pending`` holds encoded pieces waiting for the shell to write: for a streaming
    client whole framed chunks, otherwise array items (joined into one array when the request ends).
    """

    __slots__ = (
        "bytes_pending",
        "channels",
        "client_id",
        "ending",
        "epoch",
        "group_ids",
        "held",
        "keys",
        "last",
        "pending",
        "seq",
        "signal",
        "site_id",
        "stage",
        "status_due",
        "streaming",
        "user_id",
        "waker",
        "write_now",
    )

    def __init__(
        self,
        client_id: str,
        seq: int,
        lookups: Lookups,
        channels: Iterable[str],
        streaming: bool,
        epoch: int,
        waker: Callable[[Waiter], Any] | None = None,
        signal: Any = None,
    ) -> None:
        self.client_id = client_id
        self.seq = seq
        self.user_id = lookups.user_id
        self.group_ids = lookups.group_ids
        self.site_id = lookups.site_id
        self.channels = tuple(channels)
        self.keys = tuple(
            _shared_key(None if ch.startswith(GLOBAL_PREFIX) else lookups.site_id, ch) for ch in self.channels
        )
        self.streaming = streaming
        self.epoch = epoch
        self.last: dict[str, int] = {}
        self.pending: list[bytes] = []
        self.bytes_pending = 0
        self.held: list[Message] | None = []
        self.status_due: set[str] | None = None
        self.stage = Stage.NEW  # changed by move() alone
        self.ending: Ending | None = None  # why it ends early, if it does
        #: called (on the registry's thread) when the client has something to send or must end
        self.waker = waker
        #: the shell's wake-up object (an Event, a Future, ...), for the waker's use
        self.signal = signal
        #: a stream the shell can write to at once (the lean server's, on the registry's own thread): a framed
        #: chunk for it with nothing queued before it is handed here (True: written) rather than queued and woken,
        #: which saves a broadcast the queue and the wake-up per stream; None: always queue and wake
        self.write_now: Callable[[bytes], bool] | None = None

    def move(self, move: Move) -> Stage:
        """Take ``move`` (:data:`MOVES`); the new stage. Call it under the registry's lock (or on its thread)."""
        stage = _NEXT[self.stage][move]
        if stage is None:
            raise IllegalTransition(f"waiter {self.client_id!r}: {move.name} is not a move from {self.stage.name}")
        self.stage = stage
        return stage

    @property
    def done(self) -> bool:
        """Must end now (a long poll got its messages, or an :class:`Ending`): the shell answers it."""
        return self.stage in DONE

    @property
    def dropped(self) -> bool:
        """The client went away or stopped reading: nothing more is sent to it."""
        return self.ending is Ending.DROPPED

    def end(self, ending: Ending | None = None) -> None:
        """End now, for ``ending`` if given (a dropped client stays dropped)."""
        self.move(Move.END)
        if ending is not None and self.ending is not Ending.DROPPED:
            self.ending = ending

    def allowed(self, msg: Message) -> bool:
        """message_bus's ``Client#allowed?`` targeting rules (client message filters are checked separately)."""
        if not msg.targeted:
            return True
        cids = msg.client_ids
        if cids and self.client_id not in cids:
            return False
        uids, gids = msg.user_ids, msg.group_ids
        if not uids and not gids:
            return True
        if uids and self.user_id is not None and self.user_id in uids:
            return True
        return bool(gids and self.group_ids and not self.group_ids.isdisjoint(gids))

    def status_entry(self) -> bytes | None:
        if self.ending is Ending.RESET:
            return encode_status(dict.fromkeys(self.channels, 0))
        if not self.status_due:
            return None
        return encode_status({ch: self.last.get(ch, 0) for ch in self.channels if ch in self.status_due})

    def __repr__(self) -> str:
        return f"Waiter({self.client_id!r}, seq={self.seq}, streaming={self.streaming}, {self.stage.name})"


_KEYS: dict[tuple[str | None, str], tuple[str | None, str]] = {}


def _shared_key(site: str | None, channel: str) -> tuple[str | None, str]:
    """One ``(site, channel)`` tuple object per index key (bounded): memory per parked client."""
    return _KEYS.get((site, channel)) or intern_bounded(_KEYS, (site, channel), 20_000)  # a hit costs no call


def filter_allows(bus: Bus, msg: Message) -> bool:
    """The bus's client message filters on ``msg``; a filter that raises withholds the message (logged)."""
    try:
        return bool(bus.allowed_by_filters(msg))
    except Exception:
        log.exception("shmbus: client message filter failed on %r; message withheld", msg.channel)
        return False
