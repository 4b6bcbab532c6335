#!/usr/bin/env python3
"""What presence costs with 10,000 present clients: segment bytes, and publish throughput with presence on and off.

One bus; this process's presence hub holds 10,000 clients (100 per channel on 100 channels, as a web worker with
``presence=True`` would after their first polls). Figures:

* segment: the ring bytes the joins wrote (the ``/__presence`` batches and the view channels' ``change``
  messages), the bytes a reader's snapshot request makes every announcer write, the steady state's bytes per
  second (heartbeats only: a renewed poll writes nothing), and the channel slots presence takes;
* publish: paired rounds of publishes on an ordinary channel with the hub's tap attached (on) and detached (off),
  in the same process, with a no-op tap in both (a web worker has one: the middleware's). Beside the rates, the
  process CPU per publish (the publishing thread, the listener thread and the hub's thread together, up to the
  moment the listener has seen the round's last message), which survives a loaded machine better than a rate.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import _common as c

from shmbus import Bus
from shmbus.presence import PRESENCE_CHANNEL, hub_for, stop_hub

QUICK_TIMEOUT = 180
CLIENTS = 10_000
CHANNELS = 100


def main() -> int:
    args = c.parse_args(__doc__ or "")
    rep = c.Report("bench_presence", "cost of presence with 10,000 present clients (segment, publish)", args)
    repeats = args.repeats or (5 if args.quick else 15)
    n = 20_000 if args.quick else 100_000
    bus = Bus(c.unique_name("perfpresence"), keepalive_interval=0, create=True)
    seen = {"gid": 0}

    def baseline_tap(msgs: list[Any]) -> None:
        seen["gid"] = msgs[-1].global_id

    try:
        bus.tap(baseline_tap)
        seg = bus.segment
        hub = hub_for(bus)
        time.sleep(hub.heartbeat + 1)  # its start (a sync request, a first heartbeat) is not part of the joins
        head0 = seg.stats().head
        for i in range(CLIENTS):
            hub.touch(f"{i:032x}", i, [f"/room/{i % CHANNELS}"], lease=3600)  # as long as the npm client's ids
        deadline = time.monotonic() + 60
        while len(bus.presence("/room/0", wait=30)) < CLIENTS // CHANNELS and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(4 * hub.tick)  # the view channels' changes follow the view
        joined = seg.stats().head - head0
        rep.add("ring bytes written by 10,000 joins", [joined], "bytes", higher_is_better=False)
        rep.target("segment bytes for 10,000 present clients, MB", joined / 1e6, 2.0, at_least=False, unit="MB")

        head1 = seg.stats().head
        bus.publish(PRESENCE_CHANNEL, {"t": "sync"})  # what a starting reader asks of every announcer
        time.sleep(8 * hub.tick)
        snap = seg.stats().head - head1
        rep.add("ring bytes of one full snapshot (a reader starts)", [snap], "bytes", higher_is_better=False)

        head2, t2 = seg.stats().head, time.monotonic()
        time.sleep(3 * hub.heartbeat)
        steady = (seg.stats().head - head2) / (time.monotonic() - t2)
        rep.add("ring bytes per second, steady state", [steady], "bytes/s", higher_is_better=False)
        views = sum(1 for i in range(CHANNELS) if bus.last_id(f"/__presence/room/{i}"))
        rep.note(f"channel slots presence uses: {views + 1} (the view channels and /__presence)")

        data = {"user_id": 12345, "topic_id": 67890, "type": "post_created", "body": "x" * 40}
        publish = bus.publish

        def round_(k: int) -> tuple[float, float]:
            """(publishes per second, process CPU µs per publish) of k publishes, the listener caught up."""
            cpu0, t0 = time.process_time(), time.perf_counter()
            last = 0
            for _ in range(k):
                last = publish("/bench/presence", data) or last
            rate = k / (time.perf_counter() - t0)
            top = bus.last_ids("/bench/presence")["/bench/presence"]
            gid = bus.backlog("/bench/presence", top - 1)[0].global_id
            while seen["gid"] < gid:
                time.sleep(0.001)
            return rate, (time.process_time() - cpu0) / k * 1e6

        for _ in range(3):
            round_(2000)
        on_rate: list[float] = []
        off_rate: list[float] = []
        on_cpu: list[float] = []
        off_cpu: list[float] = []
        for _ in range(repeats):
            r, u = round_(n)
            on_rate.append(r)
            on_cpu.append(u)
            bus.untap(hub._on_batch)
            r, u = round_(n)
            off_rate.append(r)
            off_cpu.append(u)
            bus.tap(hub._on_batch, linger=hub.tick / 5)
        rep.add("Bus.publish, presence on (10,000 present)", on_rate, "msgs/s", baselines=["Bus.publish, presence off"])
        rep.add("Bus.publish, presence off", off_rate, "msgs/s")
        rep.add("process CPU per publish, presence on", on_cpu, "µs", higher_is_better=False)
        rep.add("process CPU per publish, presence off", off_cpu, "µs", higher_is_better=False)
        paired = [a / b for a, b in zip(on_rate, off_rate, strict=True)]
        cost = 100 * (1 - statistics.median(paired))
        cpu_cost = 100 * (statistics.median([a / b for a, b in zip(on_cpu, off_cpu, strict=True)]) - 1)
        rep.note(
            f"presence costs {cost:.2f}% of publish throughput and {cpu_cost:.2f}% more CPU per publish (medians of "
            f"{repeats} paired rounds of {n:,}; paired rate ratios {min(paired):.3f}..{max(paired):.3f}: the spread "
            "is the machine's noise)"
        )
        rep.target("publish throughput lost to presence, %", cost, 1.0, at_least=False, unit="%")
        rep.target("CPU per publish added by presence, %", cpu_cost, 1.0, at_least=False, unit="%")
    finally:
        stop_hub(bus)
        bus.destroy()
    rep.emit()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
