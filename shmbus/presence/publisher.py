"""What one hub publishes on the view channels (``/__presence/<channel>``, :mod:`.browser`), within bounds.

Why bounds here: a snapshot is asked for by any client that polls a view with ``-1``, so a client (or many client
ids) asking in a loop must not turn into unbounded ring writes or memory. Requests are kept once per (channel,
client id), at most :data:`MAX_PENDING` (more are dropped and counted), and answered at most
:data:`MEMBERS_PER_TICK` members' worth per tick (the rest wait for the next). A publish that fails (a record too
large for a small ring, an unencodable user id) is logged and dropped: the presence thread never dies of one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from ..errors import BusDestroyed, PayloadTooLarge
from .browser import VIEW_BACKLOG, change_messages, snapshot_message, view_channel
from .view import Member, PresenceEvent

__all__ = ["MAX_PENDING", "MEMBERS_PER_TICK", "ViewPublisher"]

log = logging.getLogger("shmbus.presence")

#: Snapshot requests one process keeps waiting at most.
MAX_PENDING = 10_000
#: Snapshot members one process publishes per tick at most (about 100 bytes each: ~2 MB/s at 0.25 s ticks).
MEMBERS_PER_TICK = 5_000
#: Members (joins plus leaves) per ``change`` message.
CHANGE_BATCH = 200


class ViewPublisher:
    """The view channels' side of one hub (called on the hub's thread only, except :meth:`ask`)."""

    def __init__(self, bus: Any) -> None:
        self.bus = bus
        self.pending: dict[tuple[str, str], None] = {}  # (channel, client id), oldest first
        self.dropped = 0
        self.failed = 0
        self._lock = threading.Lock()

    def ask(self, channel: str, client_id: str) -> None:
        """``client_id`` wants the current list of ``channel`` (kept once; dropped past :data:`MAX_PENDING`)."""
        with self._lock:
            if (channel, client_id) in self.pending:
                return
            if len(self.pending) >= MAX_PENDING:
                self.dropped += 1
                return
            self.pending[(channel, client_id)] = None

    def changes(self, events: list[PresenceEvent]) -> None:
        """Publish ``events`` as ``change`` messages, one or more per channel."""
        for channel, data in change_messages(events).items():
            joins, leaves = data["join"], data["leave"]
            for i in range(0, max(len(joins), len(leaves)), CHANGE_BATCH):
                part = {**data, "join": joins[i : i + CHANGE_BATCH], "leave": leaves[i : i + CHANGE_BATCH]}
                self._publish(channel, part, None)

    def snapshots(self, members_of: Callable[[str], list[Member]]) -> None:
        """Answer the waiting requests, oldest first, up to :data:`MEMBERS_PER_TICK` members."""
        budget = MEMBERS_PER_TICK
        while budget > 0:
            with self._lock:
                if not self.pending:
                    return
                key = next(iter(self.pending))
                del self.pending[key]
            channel, client_id = key
            data = snapshot_message(channel, members_of(channel))
            budget -= max(len(data["members"]), 1)
            self._publish(channel, data, [client_id])

    def _publish(self, channel: str, data: dict[str, Any], client_ids: list[str] | None) -> None:
        try:
            self.bus.publish(view_channel(channel), data, client_ids=client_ids, max_backlog_size=VIEW_BACKLOG)
        except BusDestroyed:
            raise
        except PayloadTooLarge:
            if data["type"] == "snapshot" and len(data["members"]) > 1:  # halved: it says how many it left out
                half = len(data["members"]) // 2
                cut = {
                    **data,
                    "members": data["members"][:half],
                    "truncated": data["truncated"] + len(data["members"]) - half,
                }
                self._publish(channel, cut, client_ids)
            elif data["type"] == "change" and len(data["join"]) + len(data["leave"]) > 1:  # in two parts
                items = [("join", m) for m in data["join"]] + [("leave", m) for m in data["leave"]]
                half = len(items) // 2
                for part in (items[:half], items[half:]):
                    split = {"join": [m for k, m in part if k == "join"], "leave": [m for k, m in part if k == "leave"]}
                    self._publish(channel, {**data, **split}, client_ids)
            else:
                self._failed(channel)
        except Exception:
            self._failed(channel)

    def _failed(self, channel: str) -> None:
        self.failed += 1
        log.warning("shmbus: a presence message on %r could not be published; dropped", view_channel(channel)[:200])
