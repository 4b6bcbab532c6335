"""The written interface between the bridge kit and a backend (Redis, PostgreSQL): what differs between them.

Everything else (the relay election, the catch-up and its loss accounting, the history check and reset, landing a
host's own writes, status and metrics, fork) is the kit's, written once (:mod:`.relay`, :mod:`.engine`). A backend
only moves bytes: it publishes envelopes and says which ids they got, reads its own history after an id, names
that history, and rings a doorbell when something may be new. **Notices are doorbells, never data**: the kit stores
only what :meth:`Backend.read_after` returned, or a line the backend's own publish code sealed with a key only the
bus's writers hold (:mod:`.seals`), so a stale, repeated or forged notice can at most cost one read.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from .rows import DoorbellRing, Row

if TYPE_CHECKING:
    from shmbus.bus import Backlog
    from shmbus.engines import BacklogGap, Envelope
    from shmbus.host import BusHost
    from shmbus.segment import BridgeRecord, Segment

__all__ = ["Acknowledged", "Backend", "Doorbell", "Page", "DoorbellRing", "Row"]


class Acknowledged(NamedTuple):
    """What a publish got from the backend: each message's ``(global id, message id)``, and the identity of the
    history the backend wrote them into, as its publish code read it in the same atomic step (None: this backend
    does not say; -1: the batch straddled two histories). A publisher lands its messages on this host only when
    that identity is the one the segment recorded (:mod:`.landing`)."""

    ids: list[tuple[int, int]]
    history: int | None


class Page(NamedTuple):
    """What one history read returned: the messages and the identity of the history they belong to (read with
    them, so a history replaced between two reads is noticed before its messages are stored; 0: unknown)."""

    history: int
    rows: list[Row]


class Doorbell(Protocol):
    """A backend's notification connection (SUBSCRIBE, LISTEN), opened before the catch-up read so nothing published
    after that read goes unnoticed."""

    def ring(self, timeout: float) -> DoorbellRing:
        """Wait up to ``timeout`` s for notices: what they brought. Its ``top`` is a hint only (whether to read);
        only lines whose seal verifies may be stored without a read (:mod:`.seals`). Raises the backend's
        connection errors (the relay reconnects)."""
        ...

    def keepalive(self) -> None:
        """Called after 5 s without notices: prove the connection is alive (PING, SELECT 1), or raise."""
        ...

    def close(self) -> None:
        """Drop the connection (also called from another thread to wake :meth:`ring`)."""
        ...


class Backend(Protocol):
    """The backend-specific half of a bridge. Methods marked *relay* run on the relay thread only."""

    #: ``"redis"`` or ``"postgres"``: recorded in the segment, with :meth:`record`.
    kind: str
    #: message ids are the global ids (a channel's ids have gaps): the segment is marked so (PostgreSQL).
    sparse_ids: bool
    #: exceptions that mean "the backend is unreachable or refused": the relay reconnects without a traceback.
    errors: tuple[type[BaseException], ...]
    #: those of them that mean "unreachable" (refused, reset, timed out): the relay's failure then makes
    #: ``health()`` say so even when nothing is being published.
    unreachable: tuple[type[BaseException], ...]

    def record(self) -> BridgeRecord:
        """What the segment records: the kind, the URL without its password, whether one is needed, and the options
        that decide where messages go (so a process attaching the bus can build the same engine)."""
        ...

    def check(self, bus: BusHost) -> None:
        """Refuse a bus this backend cannot serve (ValueError), when attached."""
        ...

    def publish(self, bus: BusHost, envelopes: list[Envelope]) -> Acknowledged:
        """Store ``envelopes`` in the backend, in order, in as few round trips as it can; their ``(global id,
        message id)`` and the history they went into. Raises the bridge's typed errors (``...Unavailable`` within
        the backend's timeout, ``...ReadOnly``, ``...BridgeError``); the kit has checked every size beforehand."""
        ...

    def open_doorbell(self) -> Doorbell:
        """*relay*: connect the notification side (checking the server may serve a relay at all)."""
        ...

    #: the hash the backend seals notices with: ``"sha1"`` (Redis Lua) or ``"sha256"`` (PostgreSQL).
    seal_hash: str

    def seal_key(self) -> bytes | None:
        """*relay*: the key the bus's writers seal notices with, as last read (None: none, or this process may not
        read it: every notice is then a doorbell only)."""
        ...

    def history_id(self) -> int:
        """*relay*: the identity of the backend's history, a 63-bit number (0: unknown now): it changes when the
        history is replaced (FLUSHDB, a restart without persistence, TRUNCATE, a recreated table), never with
        publishes, so comparing it with the segment's needs no ordering against local publishers."""
        ...

    def history_continues(self, seg: Segment, changed: bool, mark: int) -> bool:
        """*relay*: does the backend still hold the history whose messages ``seg`` holds? ``changed``: the identity
        differs from the one the segment recorded (False: the segment recorded none: an older segment). ``mark``:
        the id of a message the segment held when that history was last confirmed: compare that fixed message
        with the backend, never two moving ids."""
        ...

    def read_after(self, after: int, limit: int) -> Page:
        """*relay*: up to ``limit`` messages with global ids above ``after``, ascending, and the identity of the
        history they belong to: the backend's history is the only source the kit stores from."""
        ...

    def gone_upto(self) -> int:
        """*relay*: ids at or below this one that :meth:`read_after` did not return will never appear (trimmed,
        expired; on Redis every id up to the newest): the kit counts the ones this host never stored as lost."""
        ...

    def settle(self, stop: threading.Event) -> bool:
        """*relay*: a missing id above :meth:`gone_upto` may still be written (a transaction in flight): wait until
        every writer that may hold one has ended. False if one outlived the backend's timeout (those ids then
        count as lost); backends whose ids appear in order return True at once."""
        ...

    def newest_id(self) -> int:
        """*relay*: the newest global id the backend holds, as last read (for the relay's lag)."""
        ...

    def maintain(self, bus: BusHost, position: int, active: dict[str, int]) -> None:
        """*relay*, every ``trim_interval``: the backend's housekeeping (PostgreSQL runs the gem's trims; ``active``:
        channel -> newest id stored since the previous call)."""
        ...

    def fill_backlog(self, bus: BusHost, gap: BacklogGap) -> Backlog | None:
        """Complete a channel backlog the segment no longer holds (``Engine.backlog``); None: nothing better."""
        ...

    def describe(self) -> dict[str, Any]:
        """The backend's own fields of ``health()`` (its URL without password, channel names, server role)."""
        ...

    def after_fork(self) -> None:
        """In a forked child: forget the parent's connections without closing them."""
        ...

    def close(self) -> None:
        """Close this process's connections."""
        ...
