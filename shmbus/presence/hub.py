"""One process's presence hub per bus: its :class:`~.table.LocalTable` announced, the :class:`~.view.UnionView` of
every announcer, and the thread that moves between them.

Why a reserved channel and not a table in shared memory: a process killed -9 cannot clean a shared table, so every
entry would need a lease renewed in place, a lock and a reclaim rule, and join/leave events would still need a
channel. Announcements on :data:`PRESENCE_CHANNEL` need none of that: a silent announcer simply expires in every
view, ordering is the channel's, and a bridge can later carry the same messages to other hosts. Steady state costs
one small heartbeat per announcing process every ``heartbeat`` seconds: a renewed poll publishes nothing.

Everything a view does happens on the hub's one thread (messages from the listener are queued to it), so events
reach followers in order.
"""

from __future__ import annotations

import logging
import queue
import secrets
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from ..errors import BusDestroyed
from ..message import Message
from ..perprocess import Birth, PerProcess
from ..threads import start_without_signals
from .publisher import ViewPublisher
from .table import Entry, LocalTable
from .view import Member, PresenceEvent, UnionView

__all__ = ["PRESENCE_CHANNEL", "PresenceHub", "hub_for", "stop_hub"]

log = logging.getLogger("shmbus.presence")

#: The bus's own channel of presence announcements (reserved: no HTTP client may poll or publish it).
PRESENCE_CHANNEL = "/__presence"
#: Entries per joins/leaves or snapshot message (a channel name is at most 160 bytes: a message stays small).
BATCH = 200
#: The presence channel's retained backlog: nobody replays it (a view asks for snapshots), so keep it short.
BACKLOG = 64

Follower = Callable[[PresenceEvent], Any]


class PresenceHub:
    """Presence of one bus in this process. ``touch`` (the poll flow) makes it an announcer; ``members`` and
    ``follow`` read the union of all announcers on the host."""

    def __init__(
        self,
        bus: Any,
        *,
        heartbeat: float = 2.0,
        expiry: float = 6.0,
        tick: float = 0.25,
        max_entries: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.bus = bus
        self.heartbeat, self.tick, self.clock = heartbeat, tick, clock
        self.table = LocalTable(max_entries)
        self.view = UnionView(expiry, max_entries * 10)
        self.wid = secrets.token_hex(8)
        self.host = socket.gethostname()
        self.announcing = False
        self.followers: list[Follower] = []
        self._birth = Birth()
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._view_lock = threading.Lock()
        self._ready = threading.Event()
        self._stopping = threading.Event()
        self._snapshot_due = False
        self.views = ViewPublisher(bus)  # the view channels' changes and snapshots (see .browser)
        bus.tap(self._on_batch, linger=tick / 5)  # a tap, not a subscription: it leaves the web shells' linger on
        self._thread = threading.Thread(target=self._run, name="shmbus-presence", daemon=True)
        start_without_signals(self._thread)

    # -- the API
    def touch(self, client_id: str, user_id: Any, channels: Iterable[str], lease: float) -> None:
        """A poll of ``client_id`` began on ``channels``: present for ``lease`` seconds from now."""
        self.table.touch(client_id, user_id, channels, lease, self.clock(), time.time())
        self.announcing = True

    def hold(self, client_id: str, user_id: Any, channels: Iterable[str]) -> list[str]:
        """A connection (SSE, WebSocket) of ``client_id`` subscribed ``channels``: present until released."""
        held = self.table.hold(client_id, user_id, channels, self.clock(), time.time())
        self.announcing = True
        return held

    def release(self, client_id: str, channels: Iterable[str], grace: float) -> None:
        """That connection let go of ``channels`` (or ended): present ``grace`` seconds more."""
        self.table.release(client_id, channels, grace, self.clock())

    def members(self, channel: str, wait: float | None = None) -> list[Member]:
        """Clients present on ``channel`` on this host. The first call in a process waits (at most ``wait``
        seconds, by default one heartbeat) until every announcer had a chance to be heard."""
        self._ready.wait(self.heartbeat + 2 * self.tick if wait is None else wait)
        with self._view_lock:
            return self.view.members(channel)

    def serve_views(self) -> None:
        """A client of this process reads a view channel: announce (heartbeats), so that the changes no
        announcement causes (a worker gone) are published here too (see :mod:`.browser`)."""
        self.announcing = True

    def request_snapshot(self, channel: str, client_id: str) -> None:
        """Send ``client_id`` the current list of ``channel`` on its view channel (``/__presence<channel>``), from
        the hub's thread once its view is complete: the caller (a poll, a subscription) does not wait."""
        self.announcing = True
        self.views.ask(channel, client_id)

    def summary(self, channels: int = 20, members: int = 10) -> dict[str, Any]:
        """Presence per channel as the admin page shows it (never waits: a view still starting shows less)."""
        with self._view_lock:
            return {
                "ready": self._ready.is_set(),
                "clients": self.view.size,
                "channels": len(self.view.channels),
                "workers": len(self.view.workers),
                "busiest": self.view.busiest(channels, members),
            }

    def follow(self, callback: Follower) -> Callable[[], None]:
        """Call ``callback(event)`` on the hub's thread for every join and leave; returns the way to stop."""
        self.followers = [*self.followers, callback]

        def unfollow() -> None:
            self.followers = [f for f in self.followers if f is not callback]

        return unfollow

    def stop(self, timeout: float = 2.0) -> None:
        """Stop the thread; an announcer says goodbye first, so views drop its clients at once."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        self._inbox.put(None)
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        try:
            self.bus.untap(self._on_batch)
        except Exception:  # the bus is closing: its table goes with it
            pass

    # -- the thread
    def _on_batch(self, messages: list[Message]) -> None:
        if not self._birth.here:  # a forked child's copy of the parent's tap delivers to nobody
            return
        for m in messages:
            if m.channel == PRESENCE_CHANNEL:
                self._inbox.put(m.data)

    def _publish(self, data: dict[str, Any]) -> None:
        self.bus.publish(PRESENCE_CHANNEL, data, max_backlog_size=BACKLOG)

    def _run(self) -> None:
        start = self.clock()
        next_beat = start
        try:
            self._publish({"t": "sync"})
            while not self._stopping.is_set():
                msgs = self._drain()
                now = self.clock()
                events, own = self._apply([m for m in msgs if m is not None], now)
                if self.announcing:
                    next_beat = self._announce(now, next_beat)
                with self._view_lock:
                    expired = self.view.expire(now)
                events += expired
                if not self._ready.is_set() and now - start >= self.heartbeat + self.tick:
                    self._ready.set()
                self._fire(events)
                self._publish_views(own, expired)
            if self.announcing:
                self._publish({"t": "bye", "w": self.wid})
        except BusDestroyed:
            pass  # the bus closed under us: nothing left to announce
        except Exception:
            log.exception("shmbus: the presence thread failed; presence stops in this process")
        finally:
            self._ready.set()

    def _drain(self) -> list[Any]:
        """The messages queued now, waiting at most one tick for the first."""
        msgs: list[Any] = []
        try:
            msgs.append(self._inbox.get(timeout=self.tick))
            while True:
                msgs.append(self._inbox.get_nowait())
        except queue.Empty:
            return msgs

    def _apply(self, msgs: list[Any], now: float) -> tuple[list[PresenceEvent], list[PresenceEvent]]:
        """Apply announcements; returns every event, and those this process publishes on the view channels
        (caused by its own announcements, or by a goodbye when it leads: see :mod:`.browser`)."""
        events: list[PresenceEvent] = []
        own: list[PresenceEvent] = []
        with self._view_lock:
            for m in msgs:
                if isinstance(m, dict) and m.get("t") == "sync":
                    self._snapshot_due = self._snapshot_due or m.get("to") in (None, self.wid)
                    continue
                caused = self.view.apply(m, now)
                events += caused
                mine = isinstance(m, dict) and (m.get("w") == self.wid or (m.get("t") == "bye" and self.announcing))
                if caused and mine:
                    own += caused
            wants, self.view.wants_sync = self.view.wants_sync, []
        for wid in wants:
            if wid != self.wid:  # its own table it knows: a first batch of its own holds every join so far
                self._publish({"t": "sync", "to": wid})
        return events, own

    def _publish_views(self, own: list[PresenceEvent], expired: list[PresenceEvent]) -> None:
        if expired and self.announcing:
            own = own + expired
        if own:
            self.views.changes(own)
        if self._ready.is_set():
            self.views.snapshots(self._members_now)

    def _members_now(self, channel: str) -> list[Member]:
        with self._view_lock:
            return self.view.members(channel)

    def _announce(self, now: float, next_beat: float) -> float:
        self.table.sweep(now)
        joined, left = self.table.take_changes()
        base = {"w": self.wid, "h": self.host}
        for i in range(0, max(len(joined), len(left)), BATCH):
            self._publish({**base, "t": "d", "j": joined[i : i + BATCH], "l": left[i : i + BATCH]})
        if self._snapshot_due:
            self._snapshot_due = False
            self._send_snapshot(base, self.table.snapshot())
        if now >= next_beat:
            self._publish({**base, "t": "hb"})
            next_beat = now + self.heartbeat
        return next_beat

    def _send_snapshot(self, base: dict[str, Any], entries: list[Entry]) -> None:
        parts = [entries[i : i + BATCH] for i in range(0, len(entries), BATCH)] or [[]]
        for i, part in enumerate(parts):
            self._publish({**base, "t": "s", "m": part, "first": i == 0, "last": i == len(parts) - 1})

    def _fire(self, events: list[PresenceEvent]) -> None:
        for event in events:
            for callback in self.followers:
                try:
                    callback(event)
                except Exception:
                    log.exception("shmbus: a presence follower failed on %r", event)


_hubs: weakref.WeakKeyDictionary[Any, PerProcess[PresenceHub]] = weakref.WeakKeyDictionary()
_hubs_lock = threading.Lock()


def hub_for(bus: Any) -> PresenceHub:
    """This process's hub of ``bus`` (made, with its thread, on first use; again in a forked child)."""
    holder = _hubs.get(bus)
    if holder is None:
        with _hubs_lock:
            holder = _hubs.get(bus)
            if holder is None:
                holder = _hubs[bus] = PerProcess(lambda: PresenceHub(bus))
    return holder.get()


def stop_hub(bus: Any) -> None:
    """Stop this process's hub of ``bus``, if it has one (the bus closes)."""
    holder = _hubs.get(bus)
    hub = holder.clear() if holder is not None else None
    if hub is not None:
        hub.stop()
