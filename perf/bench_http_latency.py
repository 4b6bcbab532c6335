#!/usr/bin/env python3
"""HTTP publish-to-receive latency: 1,000 streaming polls on one channel (uvicorn, 2 workers, ASGI), 20 msgs/s.

Also ``server``: the same middleware served by ``shmbus.adapters.server.GunicornWorker`` (2 workers).

A separate publisher process publishes ``{"t": perf_counter_ns()}`` 20 times a second (taken just before
``publish``); the raw-socket client (perf/_http_load.py) takes ``perf_counter_ns()`` when a frame arrives and
subtracts (CLOCK_MONOTONIC: one clock for every process on the host). Every delivery to every client is a
sample, so p99 includes the last of the 1,000 clients each worker writes to, and the client's own queueing (one
Python process reading 1,000 sockets on the same 2 cores).

Baselines: published figures only (not measured here): the gem p99 45-72 ms, Starlette + broadcaster (SSE) p99
33 ms. No same-run baseline: a comparable one needs a second pub/sub server stack (future work).
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import time

import _common as c
import _http_load as load
from bench_http_fanout import fork, reap

from shmbus import Bus

QUICK_TIMEOUT = 150
FULL_TIMEOUT = 600
CHANNEL = "/bench/latency"
RATE = 20.0
WARMUP = 5
T_RE = re.compile(rb'"t":(\d+)')


def publisher(bus_name: str, count: int, go_fd: int) -> None:
    bus = Bus(bus_name, keepalive_interval=0, create=True)
    bus.publish("/bench/warm", 0)
    os.read(go_fd, 1)
    start = time.monotonic()
    for k in range(count):
        delay = start + k / RATE - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        bus.publish(CHANNEL, {"k": k, "t": time.perf_counter_ns()})
    bus.close()


async def measure(port: int, n: int, count: int, go_w: int) -> tuple[list[int], int]:
    lat: list[int] = []
    bufs: dict[int, bytes] = {}

    def on_data(conn: load.StreamConn, data: bytes, now: int) -> None:
        key = id(conn)
        buf = bufs.get(key, b"") + data
        cut = buf.rfind(load.SEP)
        if cut < 0:
            bufs[key] = buf
            return
        bufs[key] = buf[cut + len(load.SEP) :]
        for t in T_RE.findall(buf[:cut]):
            lat.append(now - int(t))

    conns = await load.open_streams(port, n, CHANNEL, timeout=60, on_data=on_data)
    try:
        os.write(go_w, b"g")
        await load.wait_counts(conns, count, timeout=count / RATE + 30)
        missing = n * count - sum(min(x.count, count) for x in conns)
        return lat, missing
    finally:
        load.close_all(conns)


def run(n: int, seconds: float, native: bool = False) -> tuple[list[int], int]:
    """The middleware under uvicorn, or (``native``) served by shmbus.adapters.server.GunicornWorker."""
    bus, server = load.bench_server("bench-http-latency", n, native)
    name = bus.name
    count = int(seconds * RATE)
    go_r, go_w = os.pipe()
    pub = fork(publisher, name, count, go_r)
    try:
        lat, missing = asyncio.run(measure(server.port, n, count, go_w))
        return lat[WARMUP * n :], missing
    finally:
        reap(pub)
        os.close(go_r)
        os.close(go_w)
        server.stop()
        bus.destroy()


def main() -> None:
    args = c.parse_args(__doc__)
    load.exit_on_sigterm()
    load.raise_nofile(30000)
    rep = c.Report("bench_http_latency", "HTTP publish-to-receive latency, 1,000 streaming clients, 20 msgs/s", args)
    n = 1000
    seconds = 6.0 if args.quick else 30.0
    repeats = args.repeats or (1 if args.quick else 3)
    stats: dict[str, tuple[list[float], list[float], list[float]]] = {"shmbus": ([], [], []), "server": ([], [], [])}
    missing_total = 0
    for r in range(repeats):
        for kind in stats:  # interleaved
            rep.log(f"{kind}: N={n}, {seconds:g} s at {RATE:g} msgs/s, repeat {r + 1}/{repeats}")
            lat, missing = run(n, seconds, native=kind == "server")
            missing_total += missing
            s = sorted(v / 1e6 for v in lat)
            p50s, p99s, maxs = stats[kind]
            p50s.append(c.percentile(s, 50))
            p99s.append(c.percentile(s, 99))
            maxs.append(s[-1] if s else float("nan"))
            rep.log(f"  {len(s)} samples, p50 {p50s[-1]:.2f} ms, p99 {p99s[-1]:.2f} ms, max {maxs[-1]:.1f} ms")
    p50s, p99s, maxs = stats["shmbus"]
    rep.published("gem p99 (best)", 45.0, "ms", "message_bus gem, p99 45-72 ms")
    rep.published("Starlette+broadcaster p99", 33.0, "ms", "Starlette + broadcaster SSE, p99 33 ms")
    for m in (rep.rows["gem p99 (best)"], rep.rows["Starlette+broadcaster p99"]):
        m.higher_is_better = False
    rep.add("shmbus p50", p50s, "ms", higher_is_better=False)
    rep.add("shmbus p99", p99s, "ms", higher_is_better=False, baselines=["gem p99 (best)", "Starlette+broadcaster p99"])
    rep.add("shmbus max", maxs, "ms", higher_is_better=False)
    rep.target("p99 latency", rep.rows["shmbus p99"].median, 25.0, at_least=False, unit=" ms")
    sp50, sp99, smax = stats["server"]
    rep.add(
        "server p50",
        sp50,
        "ms",
        higher_is_better=False,
        baselines=["shmbus p50"],
        note="shmbus.adapters.server.GunicornWorker",
    )
    rep.add(
        "server p99",
        sp99,
        "ms",
        higher_is_better=False,
        baselines=["shmbus p99", "gem p99 (best)", "Starlette+broadcaster p99"],
    )
    rep.add("server max", smax, "ms", higher_is_better=False)
    rep.target("server p99 latency", rep.rows["server p99"].median, 25.0, at_least=False, unit=" ms")
    if missing_total:
        rep.note(f"{missing_total} deliveries missing at the end (over all repeats)")
    rep.note(
        "samples = every delivery to every client after 5 warm-up messages; client = one Python process on "
        f"the same 2 cores as the 2 uvicorn workers and the publisher; {load.server_stack()}"
    )
    rep.emit()


if __name__ == "__main__":
    sys.exit(main())
