"""The union of every announcing process's presence table, as one process assembles it (sans-IO, clock passed in).

Each announcing process (a "worker", named by a random id) publishes on :data:`PRESENCE_CHANNEL`: joins and
leaves in batches, a heartbeat, a snapshot when asked, a goodbye when it closes. A view applies them in channel
order. A worker that stays silent longer than ``expiry`` (killed -9, hung) is dropped with all its clients; a
message from a worker the view does not know makes the view ask that worker for a snapshot, so a view that
dropped a slow worker, or joined late, catches up.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["Member", "PresenceEvent", "UnionView"]


@dataclass(frozen=True)
class Member:
    """A client present on a channel: its client id, user id (None without ``user_id_lookup``), since when (wall
    clock, seconds since the epoch: its first poll at the process serving it) and the host serving it."""

    client_id: str
    user_id: Any
    since: float
    host: str


@dataclass(frozen=True)
class PresenceEvent:
    """``kind`` ``"join"``: ``member`` became present on ``channel``; ``"leave"``: it is no longer (on no worker)."""

    kind: Literal["join", "leave"]
    channel: str
    member: Member


class _Worker:
    __slots__ = ("entries", "host", "seen", "stale")

    def __init__(self, host: str, seen: float) -> None:
        self.host = host
        self.seen = seen
        self.entries: dict[tuple[str, str], tuple[Any, float]] = {}
        self.stale: set[tuple[str, str]] | None = None  # a snapshot under way: keys it has not repeated yet


class UnionView:
    """Present clients per channel over every worker heard from. ``apply`` and ``expire`` return the events they
    caused; ``wants_sync`` lists the workers whose snapshot this view should ask for."""

    def __init__(self, expiry: float = 6.0, max_entries: int = 1_000_000) -> None:
        self.expiry = expiry
        self.max_entries = max_entries
        self.dropped = 0
        self.size = 0
        self.workers: dict[str, _Worker] = {}
        #: channel -> client id -> worker id -> (user id, since)
        self.channels: dict[str, dict[str, dict[str, tuple[Any, float]]]] = {}
        self.wants_sync: list[str] = []

    def members(self, channel: str) -> list[Member]:
        """The clients present on ``channel``, earliest first."""
        out = []
        for cid, by_worker in self.channels.get(channel, {}).items():
            wid, (user, since) = min(by_worker.items(), key=lambda item: item[1][1])
            out.append(Member(cid, user, since, self.workers[wid].host))
        out.sort(key=lambda m: (m.since, m.client_id))
        return out

    def busiest(self, channels: int = 20, members: int = 10) -> list[dict[str, Any]]:
        """The ``channels`` channels with the most present clients (for the admin page): each with its count and
        its first ``members`` members as ``[client id, user id]``."""
        top = heapq.nsmallest(channels, self.channels.items(), key=lambda item: (-len(item[1]), item[0]))
        out = []
        for channel, clients in top:
            firsts = heapq.nsmallest(members, clients.items(), key=lambda item: min(s for _, s in item[1].values()))
            shown = [[cid, next(iter(by_worker.values()))[0]] for cid, by_worker in firsts]
            out.append({"channel": channel, "count": len(clients), "members": shown})
        return out

    def apply(self, msg: Any, now: float) -> list[PresenceEvent]:
        """Apply one message of the presence channel (anything malformed is ignored: the channel is the bus's own,
        but a view must not die of one bad record)."""
        if not isinstance(msg, dict) or not isinstance(msg.get("w"), str):
            return []
        wid, kind = msg["w"], msg.get("t")
        if kind == "bye":
            return self._drop(wid)
        worker = self.workers.get(wid)
        if worker is None:
            worker = self.workers[wid] = _Worker(str(msg.get("h", "")), now)
            if kind != "s" or not msg.get("first"):
                self.wants_sync.append(wid)
        worker.seen = now
        events: list[PresenceEvent] = []
        if kind == "d":
            for entry in _entries(msg.get("j")):
                self._add(wid, worker, entry, events)
            for key in _keys(msg.get("l")):
                self._remove(wid, worker, key, events)
        elif kind == "s":
            if msg.get("first"):
                worker.stale = set(worker.entries)
            for entry in _entries(msg.get("m")):
                if worker.stale is not None:
                    worker.stale.discard((entry[0], entry[1]))
                self._add(wid, worker, entry, events)
            if msg.get("last") and worker.stale is not None:
                for key in worker.stale:
                    self._remove(wid, worker, key, events)
                worker.stale = None
        return events

    def expire(self, now: float) -> list[PresenceEvent]:
        """Drop the workers silent for longer than ``expiry`` (and their clients)."""
        events: list[PresenceEvent] = []
        for wid in [w for w, worker in self.workers.items() if now - worker.seen > self.expiry]:
            events += self._drop(wid)
        return events

    def _drop(self, wid: str) -> list[PresenceEvent]:
        worker = self.workers.get(wid)
        events: list[PresenceEvent] = []
        if worker is not None:
            for key in list(worker.entries):
                self._remove(wid, worker, key, events)
            del self.workers[wid]
        return events

    def _add(self, wid: str, worker: _Worker, entry: list[Any], events: list[PresenceEvent]) -> None:
        channel, cid, user, since = entry
        key = (channel, cid)
        if key not in worker.entries:
            if self.size >= self.max_entries:
                self.dropped += 1
                return
            self.size += 1
        worker.entries[key] = (user, since)
        by_worker = self.channels.setdefault(channel, {}).setdefault(cid, {})
        if not by_worker:
            events.append(PresenceEvent("join", channel, Member(cid, user, since, worker.host)))
        by_worker[wid] = (user, since)

    def _remove(self, wid: str, worker: _Worker, key: tuple[str, str], events: list[PresenceEvent]) -> None:
        value = worker.entries.pop(key, None)
        if value is None:
            return
        self.size -= 1
        channel, cid = key
        clients = self.channels[channel]
        by_worker = clients[cid]
        del by_worker[wid]
        if not by_worker:
            del clients[cid]
            if not clients:
                del self.channels[channel]
            events.append(PresenceEvent("leave", channel, Member(cid, value[0], value[1], worker.host)))


def _entries(value: Any) -> Iterable[list[Any]]:
    if isinstance(value, list):
        for e in value:
            if (
                isinstance(e, list)
                and len(e) == 4
                and isinstance(e[0], str)
                and isinstance(e[1], str)
                and _number(e[3])
            ):
                yield e


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _keys(value: Any) -> Iterable[tuple[str, str]]:
    if isinstance(value, list):
        for e in value:
            if isinstance(e, list) and len(e) == 2 and isinstance(e[0], str) and isinstance(e[1], str):
                yield e[0], e[1]
