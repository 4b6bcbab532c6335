"""What the admin page shows, as JSON-ready dicts: sans-IO, shared by the ASGI and WSGI shells.

:class:`Sampler` turns two consecutive snapshots (:func:`shmbus.metrics.read_snapshot`) into rates; one sample
serves every viewer of one process for up to ``min_interval`` seconds, so ten open admin tabs cost one
snapshot a second, not ten. :func:`read_tail` reads the newest messages of one channel for the live tail and
never shows the payload of a message with targeting (``client_ids``/``user_ids``/``group_ids``): an admin page
is not a way around targeting.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from shmbus.channels import check_channel, check_site, split_backend_name
from shmbus.errors import InvalidChannel
from shmbus.metrics import Snapshot, read_snapshot

if TYPE_CHECKING:
    from shmbus import Bus

__all__ = ["TAIL_LIMIT", "Sampler", "read_tail"]

TAIL_LIMIT = 20  # messages per tail read
MAX_PREVIEW = 300  # characters of a payload shown


class Sampler:
    """Samples of one bus for the admin page (thread-safe: WSGI threads share one)."""

    def __init__(self, bus: Bus, min_interval: float = 0.9) -> None:
        self.bus = bus
        self.min_interval = min_interval
        self._lock = threading.Lock()
        self._before: Snapshot | None = None
        self._last: Snapshot | None = None
        self._sample: dict[str, Any] | None = None

    def sample(self) -> dict[str, Any]:
        """The current sample (a new one when the last is ``min_interval`` old)."""
        with self._lock:
            now = time.time()
            if self._sample is not None and self._last is not None and now - self._last.time < self.min_interval:
                return self._sample
            snap = read_snapshot(self.bus)
            self._before, self._last = self._last, snap
            self._sample = describe(snap, self._before)
            return self._sample


def _per_second(now: float, before: float, dt: float) -> float:
    return round(max(now - before, 0) / dt, 2) if dt > 0 else 0.0


def describe(now: Snapshot, before: Snapshot | None) -> dict[str, Any]:
    """One sample: host figures, rates since ``before``, each live process, the relay, the busiest channels."""
    dt = now.time - before.time if before is not None else 0.0
    old = {p.pid: p for p in before.processes} if before is not None else {}
    procs = []
    for p in sorted(now.processes, key=lambda p: p.pid):
        if not p.alive:
            continue
        prev = old.get(p.pid)
        procs.append(
            {
                "pid": p.pid,
                "publishes_per_s": _per_second(p.publishes, prev.publishes, dt) if prev else 0.0,
                "deliveries_per_s": _per_second(p.deliveries, prev.deliveries, dt) if prev else 0.0,
                "parked": p.parked,
                "streams": p.streams,
                "listener_lag": max(now.global_id - p.listener_gid, 0) if p.listener_gid else 0,
                "lost": p.lost,
                "relay": p.relay_state if p.relay else "",
                "updated": p.updated,
            }
        )
    relay = now.relay
    busiest = []
    for key, rate in now.busiest(before, 10):
        channel, site = split_backend_name(key)
        busiest.append({"channel": channel, "site_id": site, "per_s": round(rate, 2)})
    totals = {name: now.total(name) for name in ("publishes", "deliveries", "relayed", "lost")}
    rates = {
        name: _per_second(totals[name], before.total(name), dt) if before is not None else 0.0
        for name in ("publishes", "deliveries", "relayed")
    }
    return {
        "time": now.time,
        "bus": now.bus,
        "epoch": str(now.epoch),  # 63 bits: more than a JavaScript number holds exactly
        "global_id": now.global_id,
        "oldest_global_id": now.oldest_global_id,
        "sparse_ids": now.sparse_ids,
        "ring": {
            "size": now.ring_size,
            "used": now.ring_used,
            "fill_percent": round(100 * now.ring_used / now.ring_size, 2) if now.ring_size else 0.0,
            "history_seconds": round(now.history_seconds, 2),
        },
        "channels": {"count": now.channels, "max": now.max_channels},
        "totals": totals,
        "rates": rates,
        "processes": procs,
        "exited_processes": sum(1 for p in now.processes if not p.alive),
        "relay": None if relay is None else {"pid": relay.pid, "state": relay.relay_state, "lag": now.relay_lag},
        "busiest": busiest,
        "has_metrics": now.has_metrics,
    }


def read_tail(bus: Bus, channel: str, after: int | None, site_id: str | None = None) -> dict[str, Any]:
    """The messages of ``channel`` after id ``after`` (None: the last few), newest last, with payloads hidden
    where the message has targeting. Raises :class:`~shmbus.errors.InvalidChannel` for a bad name."""
    check_channel(channel)
    last = bus.last_id(channel, site_id=site_id or "")
    if after is None or after > last:
        after = max(last - 10, 0)
    backlog = bus.backlog(channel, after, site_id or "")
    items = []
    for m in list(backlog)[-TAIL_LIMIT:]:
        item: dict[str, Any] = {"id": m.message_id, "time": m.timestamp}
        if m.targeted:
            item["hidden"] = "targeted message: payload not shown"
        else:
            try:
                text = m.raw.decode() if bus.codec.is_json else repr(m.data)
            except (UnicodeDecodeError, ValueError):
                text = repr(m.raw[:MAX_PREVIEW])
            item["data"] = text[:MAX_PREVIEW] + ("…" if len(text) > MAX_PREVIEW else "")
        items.append(item)
    return {"channel": channel, "last_id": max(last, backlog.last_id), "messages": items}


def parse_tail(query: dict[str, list[str]]) -> tuple[str | None, int | None, str | None]:
    """``?tail=/channel&after=N&site=S`` → (channel, after, site); raises ValueError with a reason."""

    def one(name: str) -> str | None:
        values = query.get(name)
        return values[-1] if values else None

    channel = one("tail") or None
    after_raw = one("after")
    after: int | None = None
    if after_raw not in (None, ""):
        try:
            after = int(after_raw or "")
        except ValueError:
            raise ValueError(f"after must be an integer, got {after_raw!r}") from None
        if after < 0:
            raise ValueError("after must be >= 0")
    site = one("site") or None
    try:
        if channel is not None:
            check_channel(channel)
        if site is not None:
            check_site(site)
    except InvalidChannel as exc:
        raise ValueError(str(exc)) from None
    return channel, after, site
