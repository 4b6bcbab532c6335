"""Host-wide figures of a bus: what every process did, kept in the segment, readable by any process.

The segment ends with a metrics area (see ``FLAG_METRICS`` in :mod:`shmbus.segment.layout`): one slot per entry of
its process table, each written only by its process with single aligned 8-byte stores, so a reader (``shmbus
top``, the Prometheus endpoint or the admin page in any worker) never sees a torn value and takes no lock. A slot
taken over by a new process first adds the old one's counters to the area's retired totals, so host totals
survive worker restarts.

What costs what: publishes are counted by the append itself, under the segment's lock it already holds (exact,
one store). Everything else is kept in this process's :class:`Metrics` as plain integers and written to the slot
by :meth:`Metrics.flush`, which the bus's listener calls at most twice a second while messages flow, and on an idle
bus when its 1 s wait ends (so figures are up to about 1 s old), and ``close`` once more; web adapters add their
deliveries and register gauges (parked polls, open streams) read at each flush.
"""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from .figures import RELAY_STATES, BusFigures
from .host import BusHost
from .segment import Segment
from .segment.layout import _pid_alive

__all__ = ["GaugeSource", "Metrics", "ProcessFigures", "Snapshot", "read_snapshot"]

FLUSH_INTERVAL = 0.5  # seconds between the listener's flushes


class GaugeSource(Protocol):
    """Anything that can say how many clients it holds right now (an HTTP registry, a transport hub)."""

    def metrics_gauges(self) -> Mapping[str, int]:
        """``{"parked": n, "streams": m}`` (either key may be missing)."""
        ...


class Metrics:
    """This process's figures for one bus (``bus.metrics``); see the module doc. ``figures()`` is the bus's
    :meth:`~shmbus.bus.Bus.figures`; ``segment()`` its segment when this process attached it (else None).

    Adapters add to :attr:`deliveries` (a plain int: no lock on the delivery path; two threads adding at the same
    instant may lose one increment, which a rate shown once a second can afford) and register a
    :class:`GaugeSource` with :meth:`add_source` (held weakly: a source that goes away stops counting).
    """

    def __init__(self, figures: Callable[[], BusFigures], segment: Callable[[], Segment | None]) -> None:
        self._figures = figures  # the bus's written figures (Bus.figures)
        self._segment = segment  # the segment when this process attached it, else None
        self.deliveries = 0
        self._sources: weakref.WeakSet[Any] = weakref.WeakSet()
        self._last_flush = 0.0
        self._relay_lost_base = 0  # the engines' relay_lost at fork (a bridge's counters survive fork)

    def add_source(self, source: GaugeSource) -> None:
        self._sources.add(source)

    def gauges(self) -> dict[str, int]:
        totals = {"parked": 0, "streams": 0}
        for source in list(self._sources):
            try:
                for name, value in source.metrics_gauges().items():
                    totals[name] = totals.get(name, 0) + int(value)
            except Exception:  # a figure is never worth breaking the listener for
                continue
        return totals

    def after_fork(self) -> None:
        """In a forked child (after the bus's listener dropped its parent's count): the parent's deliveries and
        relay losses are the parent's (already counted in its slot; the child counts in a slot of its own)."""
        self.deliveries = 0
        self._relay_lost_base = self._figures().relay_lost
        self._last_flush = 0.0

    def maybe_flush(self) -> None:
        now = time.monotonic()
        if now - self._last_flush >= FLUSH_INTERVAL:
            self._last_flush = now
            self.flush()

    def flush(self) -> bool:
        """Write this process's figures to its slot; False when it has none (no segment, a full process table,
        or a segment made before metrics existed)."""
        seg = self._segment()
        if seg is None:
            return False
        figures = self._figures()
        gauges = self.gauges()
        values: dict[str, int | float] = {
            "updated": time.time(),
            "deliveries": self.deliveries,
            "lost": figures.listener.lost,
            "listener_gid": figures.listener.position,
            "parked": gauges.get("parked", 0),
            "streams": gauges.get("streams", 0),
            "relay": 0,
            "relay_state": 0,
            "relay_highest": 0,
            "relay_lost": max(figures.relay_lost - self._relay_lost_base, 0),
        }
        for fig in figures.relays:
            if fig.state in RELAY_STATES:
                values["relay_state"] = RELAY_STATES.index(fig.state)
            if fig.relaying:
                values["relay"] = 1
                values["relay_highest"] = fig.backend_newest  # stored or not: lag = it - the segment's newest
        try:
            return seg.write_metrics(values)
        except (ValueError, TypeError):  # the segment was closed under us
            return False


@dataclass
class ProcessFigures:
    """One process's slot, as read."""

    pid: int
    alive: bool
    started: float
    updated: float
    publishes: int
    relayed: int
    deliveries: int
    lost: int
    parked: int
    streams: int
    listener_gid: int
    relay: bool
    relay_state: str
    relay_highest: int
    relay_lost: int = 0


@dataclass
class Snapshot:
    """Everything ``shmbus top``, the metrics endpoint and the admin page show, read at one moment."""

    time: float
    bus: str
    epoch: int
    processes: list[ProcessFigures]
    retired: dict[str, int]
    global_id: int
    oldest_global_id: int
    ring_size: int
    ring_used: int
    history_seconds: float
    channels: int
    max_channels: int
    sparse_ids: bool
    has_metrics: bool
    channel_last_ids: dict[str, int] = field(default_factory=dict)

    def total(self, name: str) -> int:
        """A counter summed over every slot plus the retired totals (``publishes``, ``relayed``, ...)."""
        return int(sum(getattr(p, name) for p in self.processes) + self.retired.get(name, 0))

    def gauge(self, name: str) -> int:
        """A gauge (``parked``, ``streams``) summed over live processes."""
        return int(sum(getattr(p, name) for p in self.processes if p.alive))

    @property
    def relay(self) -> ProcessFigures | None:
        """The live process relaying for a bridge engine, if any."""
        for p in self.processes:
            if p.alive and p.relay:
                return p
        return None

    @property
    def relay_lag(self) -> int:
        """The backend's newest id as the relay knows it minus the segment's newest: messages Redis/PostgreSQL hold
        that the relay has not stored yet (0 without a relay)."""
        r = self.relay
        return max(r.relay_highest - self.global_id, 0) if r is not None and r.relay_highest else 0

    def busiest(self, before: Snapshot | None, n: int = 10) -> list[tuple[str, float]]:
        """Channels by messages per second since ``before`` (by id advance; with sparse ids, by global ids)."""
        if before is None:
            return []
        dt = max(self.time - before.time, 1e-6)
        rates = []
        for key, last in self.channel_last_ids.items():
            prev = before.channel_last_ids.get(key)
            if prev is not None and last > prev:
                rates.append((key, (last - prev) / dt))
        rates.sort(key=lambda kv: -kv[1])
        return rates[:n]


def _process_figures(pid: int, rows: list[dict[str, float]], pid_alive: bool) -> ProcessFigures:
    """One process's figures from its slots: one normally, more when it attached more than once (two Bus objects
    on one segment, or a Bus closed and attached again through another entry). Counters add up over all of them;
    gauges and the listener's position come from the slots still attached (a detached slot keeps its last
    figures, which are no longer true)."""
    live = [r for r in rows if r.get("attached", 1)] if pid_alive else []
    relays = [r for r in live if r["relay"]]
    states = [int(r["relay_state"]) for r in relays or live or rows if int(r["relay_state"])]
    state = states[0] if states else 0
    listener = [int(r["listener_gid"]) for r in live if r["listener_gid"]]
    return ProcessFigures(
        pid=pid,
        alive=bool(live),
        started=min(float(r["started"]) for r in rows),
        updated=max(float(r["updated"]) for r in rows),
        publishes=sum(int(r["publishes"]) for r in rows),
        relayed=sum(int(r["relayed"]) for r in rows),
        deliveries=sum(int(r["deliveries"]) for r in rows),
        lost=sum(int(r["lost"]) for r in rows),
        parked=sum(int(r["parked"]) for r in live),
        streams=sum(int(r["streams"]) for r in live),
        # the laggiest listener of the process (a lag is what the figure is for); without one, the last known
        listener_gid=min(listener) if listener else max(int(r["listener_gid"]) for r in rows),
        relay=bool(relays),
        relay_state=RELAY_STATES[state] if 0 <= state < len(RELAY_STATES) else "?",
        relay_highest=max((int(r["relay_highest"]) for r in relays or rows), default=0),
        relay_lost=sum(int(r.get("relay_lost", 0)) for r in rows),
    )


def read_snapshot(source: BusHost | Segment, *, channels: bool = True, exclude_self: bool = False) -> Snapshot:
    """Read the host's figures of a bus (or of an attached :class:`~shmbus.segment.Segment`, as the CLI does):
    any process may call it, nothing is written but this process's own flush. ``exclude_self`` leaves out the
    calling process (a CLI that attached only to look)."""
    if isinstance(source, Segment):
        seg, name = source, source.name
    else:
        source.metrics.flush()  # this process's own figures, current
        seg, name = source.segment, source.name
    st = seg.stats()
    area = seg.read_metrics()
    procs: list[ProcessFigures] = []
    retired: dict[str, int] = {}
    me = os.getpid()
    if area is not None:
        retired, slots = area
        by_pid: dict[int, list[dict[str, float]]] = {}
        for row in slots:
            pid = int(row["pid"])
            if exclude_self and pid == me:
                continue
            by_pid.setdefault(pid, []).append(row)
        for pid, rows in by_pid.items():
            procs.append(_process_figures(pid, rows, _pid_alive(pid) and pid in st.processes))
    last_ids: dict[str, int] = {}
    if channels:
        for info in seg.iter_channels():
            if info.last_id and not info.expired:
                last_ids[info.key.decode(errors="replace")] = int(info.last_id)
    return Snapshot(
        time=time.time(),
        bus=name,
        epoch=int(st.epoch),
        processes=procs,
        retired=retired,
        global_id=int(st.global_id),
        oldest_global_id=int(st.oldest_global_id),
        ring_size=int(st.ring_size),
        ring_used=int(st.ring_used),
        history_seconds=float(st.history_seconds),
        channels=int(st.channels),
        max_channels=int(st.max_channels),
        sparse_ids=bool(seg.sparse_ids),
        has_metrics=area is not None,
        channel_last_ids=last_ids,
    )
