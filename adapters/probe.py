"""Where a message waits on its way to a worker's clients: an optional per-stage probe, ``SHMBUS_PROBE=PREFIX``.

Off unless the variable is set when this module is imported; off, it costs one ``is None`` test per batch, per
drain, per slice and per bridged request, none per delivery. On, every process keeps a histogram per stage and
writes them to ``PREFIX.<pid>.json`` about once a second (from a 10 ms timer of each watched loop);
``python -m shmbus.adapters.probe PREFIX`` prints them merged (``perf/bench_http_scale.py --probe`` does).

Stages, each in seconds:

* ``listener``: publish (the message's timestamp) -> its batch queued for a loop (the listener thread);
* ``gather`` / ``gather_large``: queued -> its drain begins, for a small / large fan-out (``batch_window``, for a
  large one stretched after a long fan-out, plus the loop's lag);
* ``dispatch``: one drain's registry work done at once (the pieces of channels with a few clients here; a
  channel with many is only set aside, its per-client work is in the slices);
* ``small`` / ``large``: publish -> the last of its clients woken (written, on the lean server), for a fan-out to
  at most ``SMALL_FANOUT`` clients (a chat room) / more (a broadcast);
* ``slice``: one slice of a large fan-out's deliveries and wake-ups (the most another callback waits behind a
  fan-out);
* ``lag``: how late a 10 ms timer of the loop fires (what a request's read or a drain waits for its turn);
* ``request``: a request the lean server hands to the wrapped ASGI app (the bench's publish route), from its
  start to the end of its response.
"""

from __future__ import annotations

import asyncio
import glob
import json
import math
import os
import sys
import threading
import time
from typing import Any

__all__ = ["PROBE", "Histogram", "Probe", "load", "report"]

#: Histogram buckets per doubling (a bucket spans ~19%).
STEPS = 4
LAG_EVERY = 0.01
DUMP_EVERY = 1.0


class Histogram:
    """Counts of durations in log-spaced buckets (bucket ``b`` holds up to ``2 ** ((b + 1) / STEPS)`` µs)."""

    __slots__ = ("buckets", "max", "n", "total")

    def __init__(self) -> None:
        self.buckets: dict[int, int] = {}
        self.n = 0
        self.total = 0.0
        self.max = 0.0

    def add(self, seconds: float) -> None:
        us = seconds * 1e6
        b = int(math.log2(us) * STEPS) if us > 1.0 else 0
        self.buckets[b] = self.buckets.get(b, 0) + 1
        self.n += 1
        self.total += seconds
        if seconds > self.max:
            self.max = seconds

    def merge(self, other: dict[str, Any]) -> None:
        for b, k in other["buckets"].items():
            self.buckets[int(b)] = self.buckets.get(int(b), 0) + k
        self.n += other["n"]
        self.total += other["total"]
        self.max = max(self.max, other["max"])

    def percentile(self, p: float) -> float:
        """The upper edge (seconds) of the bucket holding the ``p``-th percentile."""
        if not self.n:
            return float("nan")
        rank, seen = p / 100.0 * self.n, 0
        for b in sorted(self.buckets):
            seen += self.buckets[b]
            if seen >= rank:
                return min(2 ** ((b + 1) / STEPS) / 1e6, self.max)
        return self.max

    def as_dict(self) -> dict[str, Any]:
        return {"buckets": self.buckets, "n": self.n, "total": self.total, "max": self.max}


class Probe:
    """This process's histograms; :meth:`note` may be called from any thread."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.lock = threading.Lock()
        self.stages: dict[str, Histogram] = {}
        self.dumped = 0.0
        os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        self.lock = threading.Lock()
        self.stages = {}

    def note(self, stage: str, seconds: float) -> None:
        with self.lock:
            h = self.stages.get(stage)
            if h is None:
                h = self.stages[stage] = Histogram()
            h.add(seconds)

    def since_publish(self, stage: str, timestamp: float) -> None:
        """``stage`` ended now for a message published at ``timestamp`` (wall clock, any process)."""
        if timestamp:
            self.note(stage, max(time.time() - timestamp, 0.0))

    def watch(self, loop: asyncio.AbstractEventLoop) -> None:
        """Measure ``loop``'s lag with a 10 ms timer, which also writes the file about once a second."""

        def tick(due: float) -> None:
            now = loop.time()
            self.note("lag", max(now - due, 0.0))
            if time.monotonic() - self.dumped >= DUMP_EVERY:
                self.dump()
            loop.call_at(now + LAG_EVERY, tick, now + LAG_EVERY)

        start = loop.time() + LAG_EVERY
        loop.call_at(start, tick, start)

    def dump(self) -> None:
        self.dumped = time.monotonic()
        with self.lock:
            data = {name: h.as_dict() for name, h in self.stages.items()}
        path = f"{self.prefix}.{os.getpid()}.json"
        try:
            with open(path + ".tmp", "w") as f:
                json.dump(data, f)
            os.replace(path + ".tmp", path)
        except OSError:
            pass  # a probe never breaks a worker


def load(prefix: str) -> dict[str, Histogram]:
    """Every process's histograms under ``prefix``, merged by stage."""
    merged: dict[str, Histogram] = {}
    for path in sorted(glob.glob(f"{glob.escape(prefix)}.*.json")):
        try:
            with open(path) as f:
                stages = json.load(f)
        except (OSError, ValueError):
            continue
        for name, h in stages.items():
            merged.setdefault(name, Histogram()).merge(h)
    return merged


def _minus(h: Histogram, before: Histogram | None) -> Histogram:
    """What ``h`` counted after ``before`` (its max: the top bucket's upper edge, at most ``h``'s max)."""
    if before is None:
        return h
    out = Histogram()
    for b, k in h.buckets.items():
        left = k - before.buckets.get(b, 0)
        if left > 0:
            out.buckets[b] = left
    out.n = sum(out.buckets.values())
    out.total = max(h.total - before.total, 0.0)
    out.max = min(2 ** ((max(out.buckets) + 1) / STEPS) / 1e6, h.max) if out.buckets else 0.0
    return out


def report(prefix: str, since: dict[str, Histogram] | None = None) -> str:
    """One line per stage (ms) of every process under ``prefix``; ``since``: a :func:`load` to subtract."""
    merged = load(prefix)
    lines = []
    for name in ("listener", "gather", "gather_large", "dispatch", "small", "large", "slice", "lag", "request"):
        h = merged.get(name)
        if h is None:
            continue
        h = _minus(h, (since or {}).get(name))
        if not h.n:
            continue
        lines.append(
            f"{name:12} n {h.n:8d}  mean {h.total / h.n * 1e3:8.2f}  p50 {h.percentile(50) * 1e3:8.2f}  "
            f"p99 {h.percentile(99) * 1e3:8.2f}  max {h.max * 1e3:8.2f} ms"
        )
    return "\n".join(lines)


PROBE: Probe | None = Probe(os.environ["SHMBUS_PROBE"]) if os.environ.get("SHMBUS_PROBE") else None

if __name__ == "__main__":  # pragma: no cover - a command-line helper
    print(report(sys.argv[1]))
