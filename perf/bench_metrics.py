#!/usr/bin/env python3
"""What the host-wide metrics cost: publish throughput with the per-process counter on and off, in one run.

The counter is one aligned load and store in the append, under the lock the append already holds. "Off" is the
same bus with this process's counter word unset (what a segment without a metrics area does), measured
round-robin with "on" so both see the same machine; it skips the store but not the branch that picks the word, so
it understates the cost (``perf/ab_publish.py`` against a tree without the counting lines measures all of it).
Also: the cost of reading a snapshot (``shmbus top``, ``/metrics``, the admin page read one per refresh) on a bus
with 1,000 channels, and of rendering the Prometheus text.
"""

from __future__ import annotations

import statistics
import time

import _common as c

from shmbus import Bus
from shmbus.adapters.metrics import render
from shmbus.metrics import read_snapshot

QUICK_TIMEOUT = 120


def main() -> int:
    args = c.parse_args(__doc__ or "")
    rep = c.Report("bench_metrics", "cost of the host-wide metrics (publish counter, snapshot reads)", args)
    repeats = args.repeats or (5 if args.quick else 15)
    n = 20_000 if args.quick else 100_000
    bus = Bus(c.unique_name("perfmetrics"), keepalive_interval=0, create=True)
    try:
        data = {"user_id": 12345, "topic_id": 67890, "type": "post_created", "body": "x" * 40}
        publish = bus.publish
        for _ in range(2000):
            publish("/bench/metrics", data)
        seg = bus.segment
        word = seg._pub_word
        assert word, "this bus has no metrics slot"

        def loop(k: int) -> None:
            for _ in range(k):
                publish("/bench/metrics", data)

        on: list[float] = []
        off: list[float] = []
        for _ in range(repeats):
            seg._pub_word = word
            on.append(c.rate(loop, n))
            seg._pub_word = 0
            off.append(c.rate(loop, n))
        seg._pub_word = word
        rep.add("Bus.publish, counting (shipped)", on, "msgs/s", baselines=["Bus.publish, counter off"])
        rep.add("Bus.publish, counter off", off, "msgs/s")
        paired = [a / b for a, b in zip(on, off, strict=True)]
        cost = 100 * (1 - statistics.median(paired))
        rep.note(
            f"counting costs {cost:.2f}% of publish throughput (median of {repeats} paired rounds of {n:,}; "
            f"paired ratios {min(paired):.3f}..{max(paired):.3f}: the spread is the machine's noise)"
        )
        rep.target("publish throughput lost to counting, %", cost, 2.0, at_least=False, unit="%")

        for i in range(1000):
            bus.publish(f"/bench/channel/{i}", i)
        reads: list[float] = []
        renders: list[float] = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            read_snapshot(bus)
            reads.append((time.perf_counter() - t0) * 1e6)
            t0 = time.perf_counter()
            render(bus)
            renders.append((time.perf_counter() - t0) * 1e6)
        rep.add("read_snapshot, 1,001 channels", reads, "µs", higher_is_better=False)
        rep.add("Prometheus text (no channel scan)", renders, "µs", higher_is_better=False)
    finally:
        bus.destroy()
    rep.emit()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
