"""A bridge backend in this process's memory: the kit's :class:`~.backend.Backend` with no server, as a test double.

Several buses of one process (each one "host": its own segment, election and relay) bridged through one
:class:`MemoryBackend` behave as hosts bridged through Redis or PostgreSQL, so an application can test what it does
across hosts without a server: ``Bus("a", engine=MemoryBridge(backend))`` and ``Bus("b",
engine=MemoryBridge(backend))``. The backend also plays the faults the relay's rules are about, on request: a trim
(:meth:`~MemoryBackend.trim`), a channel's message gone (:meth:`~MemoryBackend.expire`), a writer in flight (:meth:`~
MemoryBackend.begin`), another history (:meth:`~MemoryBackend.flush`), a forged notice (:meth:`~MemoryBackend.notify`),
a server down (``down``). It lives in this process only: other processes cannot reach it.

It writes the gem's lines and envelopes (:mod:`.wire`) and seals its notices like the real backends (:mod:`.seals`,
``sha256``). Ids are Redis's (every drawn id is a message: ``gone_upto`` is the newest) or, with
``sparse_ids=True``, PostgreSQL's (message ids are the global ids, a trim records what it deleted, a drawn id may
still be in flight: ``settle`` says whether the writers that may hold one ended).
"""

from __future__ import annotations

import bisect
import collections
import logging
import secrets
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from shmbus.channels import backend_name
from shmbus.errors import EngineError
from shmbus.segment import BridgeRecord

from .backend import Acknowledged, DoorbellRing, Page, Row
from .engine import BridgeEngine
from .keywords import RelayKeywords, relay_options
from .seals import NO_RING, mac
from .status import BridgeStatus
from .wire import encode_envelope, format_line, parse_id

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from shmbus.bus import Backlog
    from shmbus.engines import BacklogGap, Envelope
    from shmbus.host import BusHost
    from shmbus.segment import Segment

__all__ = ["MemoryBackend", "MemoryBackendError", "MemoryBridge", "MemoryDoorbell", "MemoryUnavailable"]

log = logging.getLogger("shmbus.memory")

#: ``wait(condition, timeout)``: how a doorbell waits for notices (a test passes one that advances a fake clock).
Wait = Callable[[threading.Condition, float], object]


class MemoryBackendError(EngineError):
    """The memory backend refused a call."""


class MemoryUnavailable(MemoryBackendError):
    """The memory backend is "down" (``down = True``): nothing was stored."""


def _random_history() -> int:
    return secrets.randbits(63) or 1


class MemoryBackend:
    """A history in memory (see the module doc). ``calls`` counts each relay call by name (a test may count the
    reads a notice cost); ``maintained`` lists each ``maintain`` call's ``(position, active)``."""

    kind = "memory"
    seal_hash = "sha256"
    errors: tuple[type[BaseException], ...] = (MemoryBackendError,)
    unreachable: tuple[type[BaseException], ...] = (MemoryUnavailable,)

    def __init__(
        self, name: str = "memory", *, sparse_ids: bool = False, sealed: bool = True, wait: Wait | None = None
    ) -> None:
        self.url = f"memory://{name}"
        self.sparse_ids = sparse_ids
        self.cond = threading.Condition()
        self.wait: Wait = wait or (lambda cond, timeout: cond.wait(timeout))
        self.history = _random_history()  #: the history's identity (0: the backend cannot name it now)
        self.key: bytes | None = secrets.token_bytes(32) if sealed else None  #: the seal key (None: no seals)
        self.down = False  #: every call raises :class:`MemoryUnavailable`
        self.rows: dict[int, Row] = {}  #: global id -> message (value None: the id existed, its message is gone)
        self._ids: list[int] = []  # the keys of ``rows``, ascending
        self.newest = 0  #: the newest id drawn
        self.trimmed = 0  #: the newest id a trim deleted
        self.in_flight: set[int] = set()  #: ids drawn whose writer has not ended (sparse ids only)
        self.on_settle: Callable[[], object] | None = None  #: called as the relay starts waiting for writers
        self.calls: collections.Counter[str] = collections.Counter()
        self.maintained: list[tuple[int, dict[str, int]]] = []
        self.bells: list[MemoryDoorbell] = []
        self._channel_ids: dict[str, int] = {}
        self._gone = 0  # what the last read says is gone (Redis: every id up to the newest drawn before it)

    # ------------------------------------------------------------------ the faults a test plays
    def begin(self) -> int:
        """Draw the next id for a writer that has not committed yet (sparse ids: a hole until :meth:`commit`)."""
        with self.cond:
            self.newest += 1
            self.in_flight.add(self.newest)
            return self.newest

    def commit(self, gid: int, chan: str, envelope: bytes) -> None:
        """The writer of ``gid`` (from :meth:`begin`) commits ``envelope`` on backend channel ``chan`` (no notice:
        the relay finds it on its next read)."""
        with self.cond:
            self.in_flight.discard(gid)
            self._put(Row(gid, gid, chan, envelope))

    def rollback(self, gid: int) -> None:
        """The writer of ``gid`` rolled back: the id never was a message."""
        with self.cond:
            self.in_flight.discard(gid)

    def trim(self, upto: int) -> None:
        """Delete every message up to id ``upto`` (a host that had not read them lost them)."""
        with self.cond:
            cut = bisect.bisect_right(self._ids, upto)
            for gid in self._ids[:cut]:
                del self.rows[gid]
            del self._ids[:cut]
            self.trimmed = max(self.trimmed, upto)

    def expire(self, gid: int) -> None:
        """Message ``gid`` is gone from its channel while its id is still known (Redis's channel trim)."""
        with self.cond:
            row = self.rows.get(gid)
            if row is not None:
                self.rows[gid] = row._replace(value=None)

    def flush(self) -> None:
        """Replace the history (a FLUSHDB, a TRUNCATE ... RESTART IDENTITY): no message, ids from 1, a new name."""
        with self.cond:
            self.rows.clear()
            self._ids.clear()
            self._channel_ids.clear()
            self.newest = self.trimmed = self._gone = 0
            self.history = _random_history()

    def notify(self, *lines: bytes, seals: dict[int, tuple[int, bytes]] | None = None) -> None:
        """Ring every open doorbell with ``lines`` and ``seals`` (anyone may notify: stale, repeated, forged)."""
        with self.cond:
            for bell in self.bells:
                bell.lines.extend(lines)
                bell.seals.update(seals or {})
            self.cond.notify_all()

    # ------------------------------------------------------------------ Backend
    def record(self) -> BridgeRecord:
        return BridgeRecord(self.kind, self.url, False, {})

    def check(self, bus: BusHost) -> None:
        return None

    def publish(self, bus: BusHost, envelopes: list[Envelope]) -> Acknowledged:
        with self.cond:
            self._up()
            ids: list[tuple[int, int]] = []
            lines: list[bytes] = []
            for env in envelopes:
                chan = backend_name(env.channel, env.site_id)
                value = encode_envelope(bus.codec, env.payload, env.meta)
                self.newest += 1
                gid = self.newest
                cid = gid if self.sparse_ids else self._channel_ids.get(chan, 0) + 1
                self._channel_ids[chan] = cid
                self._put(Row(gid, cid, chan, value))
                ids.append((gid, cid))
                lines.append(format_line(gid, cid, chan, value))
            seals = {}
            if self.key is not None and self.history and lines:
                seals[ids[0][0]] = (ids[-1][0], mac(self.seal_hash, self.key, self.history, lines))
            self.notify(*lines, seals=seals)
            return Acknowledged(ids, self.history)

    def open_doorbell(self) -> MemoryDoorbell:
        with self.cond:
            self._call("open_doorbell")
            bell = MemoryDoorbell(self)
            self.bells.append(bell)
            return bell

    def seal_key(self) -> bytes | None:
        return self.key

    def history_id(self) -> int:
        with self.cond:
            self._call("history_id")
            return self.history

    def history_continues(self, seg: Segment, changed: bool, mark: int) -> bool:
        """Another identity is another history; an unchanged one (an older segment) is the same unless the ids
        went back below the mark."""
        with self.cond:
            self._call("history_continues")
            return not changed and self.newest >= mark

    def read_after(self, after: int, limit: int) -> Page:
        """Up to ``limit`` messages after ``after``; what is gone is read with them (as Redis's script does)."""
        with self.cond:
            self._call("read_after")
            start = bisect.bisect_right(self._ids, after)
            self._gone = self.newest
            return Page(self.history, [self.rows[gid] for gid in self._ids[start : start + limit]])

    def gone_upto(self) -> int:
        """Sparse ids: what trims deleted. Else every id up to the newest drawn when the last read ran that it did
        not return (an id drawn since may be on its way: a later read finds it)."""
        with self.cond:
            self._call("gone_upto")
            return self.trimmed if self.sparse_ids else self._gone

    def settle(self, stop: threading.Event) -> bool:
        """A writer still in flight once :attr:`on_settle` returned counts as having outlived the timeout."""
        self._call("settle")
        if self.on_settle is not None:
            self.on_settle()
        with self.cond:
            return not self.in_flight

    def newest_id(self) -> int:
        return self.newest

    def maintain(self, bus: BusHost, position: int, active: dict[str, int]) -> None:
        self._call("maintain")
        self.maintained.append((position, dict(active)))

    def fill_backlog(self, bus: BusHost, gap: BacklogGap) -> Backlog | None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"url": self.url, "history": self.history}

    def after_fork(self) -> None:
        self.bells = []

    def close(self) -> None:
        return None

    def _put(self, row: Row) -> None:
        if row.global_id not in self.rows:
            bisect.insort(self._ids, row.global_id)
        self.rows[row.global_id] = row

    def _up(self) -> None:
        if self.down:
            raise MemoryUnavailable(f"{self.url} is down")

    def _call(self, name: str) -> None:
        self.calls[name] += 1
        self._up()


class MemoryDoorbell:
    """One relay's doorbell on a :class:`MemoryBackend`: the lines and seals published since its last ring."""

    def __init__(self, backend: MemoryBackend) -> None:
        self.backend = backend
        self.lines: list[bytes] = []
        self.seals: dict[int, tuple[int, bytes]] = {}
        self.closed = False

    def ring(self, timeout: float) -> DoorbellRing:
        backend = self.backend
        with backend.cond:
            if not self.lines and not self.seals and not self.closed:
                backend.wait(backend.cond, timeout)
            if self.closed:
                raise MemoryUnavailable("the doorbell was closed")
            backend._up()
            lines, seals = self.lines, self.seals
            self.lines, self.seals = [], {}
        if not lines and not seals:
            return NO_RING
        ids = [parse_id(line.partition(b"|")[0]) for line in lines]
        return DoorbellRing(max([g for g in ids if g is not None], default=0), lines, seals)

    def keepalive(self) -> None:
        self.backend._call("keepalive")

    def close(self) -> None:
        backend = self.backend
        with backend.cond:
            self.closed = True
            if self in backend.bells:
                backend.bells.remove(self)
            backend.cond.notify_all()


class MemoryBridge(BridgeEngine):
    """An engine bridged through ``backend`` (a new :class:`MemoryBackend` if none): every bus of this process built
    with the same backend is one host of one bridged bus. Takes the other bridges' relay keywords (``relay``,
    ``election_interval``, ``reconnect_max``, ``local_wait``, ``autostart``)."""

    def __init__(self, backend: MemoryBackend | None = None, **relay: Unpack[RelayKeywords]) -> None:
        self.memory = backend if backend is not None else MemoryBackend()
        super().__init__(self.memory, BridgeStatus("memory", self.memory.url, log), log, relay_options(relay))

    def __repr__(self) -> str:
        return f"MemoryBridge({self.memory.url!r})"
