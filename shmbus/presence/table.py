"""One process's presence table (sans-IO, clock passed in): the clients this process serves, per channel.

Why a lease and no disconnect hook: every shell ends a held poll on its own terms (a write, a timeout, a peer
seen closing or not), but every poll *starts* in the one flow (:mod:`shmbus.adapters.http.flow`). A client is
present while its lease runs: each poll renews it for ``lease`` seconds (the long-polling interval, the longest
a poll is held or a polling client waits between polls, plus a grace). A tab that closes is gone at most one lease
after its last poll began, whatever the shell; nothing has to see the socket close.

Joins and leaves are kept as pending changes until :meth:`LocalTable.take_changes` (the hub publishes them in
batches); a join and its leave within one batch cancel out.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

__all__ = ["Entry", "Key", "LocalTable", "user_value"]

_FOREVER = float("inf")

#: ``(channel, client_id)``
Key = tuple[str, str]
#: ``[channel, client_id, user_id, since]``: one present client as it travels on the presence channel
Entry = list[Any]


def user_value(user_id: Any) -> Any:
    """``user_id`` as the presence channel carries it: None, a bool, int, float or str as is; anything else as its
    ``str`` (an app's user object must not make the batch unencodable)."""
    if user_id is None or isinstance(user_id, (str, int, float)):
        return user_id
    return str(user_id)


class LocalTable:
    """Present clients of one process with their leases, bounded by ``max_entries`` (new entries beyond it are
    counted in ``dropped``, never stored: a flood of client ids costs no memory).

    Entries live in one :class:`OrderedDict` per lease length, oldest renewal first, so expiry pops from the front
    and never scans the live ones.
    """

    def __init__(self, max_entries: int = 100_000) -> None:
        self.max_entries = max_entries
        self.dropped = 0
        self._lock = threading.Lock()
        #: lease -> key -> [user_id, since (wall clock), expires (monotonic)]
        self._buckets: dict[float, OrderedDict[Key, list[Any]]] = {}
        self._lease_of: dict[Key, float] = {}
        self._holds: dict[Key, int] = {}  # open connections (SSE, WebSocket) per key: no lease runs out
        self._joined: dict[Key, Entry] = {}
        self._left: set[Key] = set()

    def __len__(self) -> int:
        return len(self._lease_of)

    def touch(
        self, client_id: str, user_id: Any, channels: Iterable[str], lease: float, now: float, wall: float
    ) -> None:
        """A poll of ``client_id`` on ``channels`` began at ``now`` (monotonic; ``wall``: the wall clock)."""
        user = user_value(user_id)
        wall = round(wall, 3)  # ms: every announcement carries it, and 17 digits of it cost 10,000 joins 50 KB
        with self._lock:
            bucket = self._buckets.get(lease)
            if bucket is None:
                bucket = self._buckets[lease] = OrderedDict()
            expires = now + lease
            for channel in channels:
                key = (channel, client_id)
                if key in self._holds:
                    continue
                old_lease = self._lease_of.get(key)
                if old_lease is not None:
                    row = self._buckets[old_lease].pop(key) if old_lease != lease else bucket[key]
                    row[2] = expires
                    if old_lease != lease:
                        bucket[key] = row
                        self._lease_of[key] = lease
                    else:
                        bucket.move_to_end(key)
                    continue
                if len(self._lease_of) >= self.max_entries:
                    self.dropped += 1
                    continue
                bucket[key] = [user, wall, expires]
                self._lease_of[key] = lease
                self._left.discard(key)
                self._joined[key] = [channel, client_id, user, wall]

    def hold(self, client_id: str, user_id: Any, channels: Iterable[str], now: float, wall: float) -> list[str]:
        """A connection of ``client_id`` subscribed ``channels``: present until :meth:`release` (counted per
        connection). Returns the channels it holds (those over ``max_entries`` are not)."""
        held = []
        for channel in channels:
            self.touch(client_id, user_id, (channel,), _FOREVER, now, wall)
            key = (channel, client_id)
            with self._lock:
                if key in self._lease_of:
                    self._holds[key] = self._holds.get(key, 0) + 1
                    held.append(channel)
        return held

    def release(self, client_id: str, channels: Iterable[str], grace: float, now: float) -> None:
        """A connection of ``client_id`` let go of ``channels`` (held by :meth:`hold`): once no connection holds
        one, it stays present ``grace`` seconds more."""
        with self._lock:
            for channel in channels:
                key = (channel, client_id)
                count = self._holds.get(key, 0) - 1
                if count > 0:
                    self._holds[key] = count
                    continue
                if self._holds.pop(key, None) is None:
                    continue
                row = self._buckets[self._lease_of[key]].pop(key)
                row[2] = now + grace
                bucket = self._buckets.get(grace)
                if bucket is None:
                    bucket = self._buckets[grace] = OrderedDict()
                bucket[key] = row
                self._lease_of[key] = grace

    def sweep(self, now: float) -> int:
        """Expire the leases run out by ``now``; their leaves become pending. Returns how many expired."""
        expired = 0
        with self._lock:
            for bucket in self._buckets.values():
                while bucket:
                    key, row = next(iter(bucket.items()))
                    if row[2] > now:
                        break
                    del bucket[key]
                    del self._lease_of[key]
                    expired += 1
                    if self._joined.pop(key, None) is None:
                        self._left.add(key)
        return expired

    def take_changes(self) -> tuple[list[Entry], list[list[str]]]:
        """The joins and leaves since the last call (and forget them)."""
        with self._lock:
            joined, self._joined = list(self._joined.values()), {}
            left, self._left = [list(k) for k in self._left], set()
        return joined, left

    def snapshot(self) -> list[Entry]:
        """Every present entry, as the presence channel carries them."""
        with self._lock:
            return [[k[0], k[1], row[0], row[1]] for b in self._buckets.values() for k, row in b.items()]
