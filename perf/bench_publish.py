#!/usr/bin/env python3
"""Publish throughput of 100-byte messages: shmbus vs redis-py to a local Redis, measured in the same run.

Rows are measured round-robin (one repeat of every row, then the next repeat) so neighbours' load hits the
subject and the baseline alike. The gem's figure is quoted, not measured (no Ruby here).
"""

from __future__ import annotations

import contextlib
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import _common as c

from shmbus import Bus
from shmbus.segment import Segment

CHANNEL = "/bench/publish"
#: discourse/message_bus, memory backend: the figure issue 2 quotes. Not measured here (no Ruby on this box).
GEM_MEMORY_BACKEND = 8_600.0


def payload_dict(size: int = 100) -> dict[str, Any]:
    """A small realistic message whose JSON (orjson) encoding is exactly ``size`` bytes."""
    import orjson

    d: dict[str, Any] = {"user_id": 12345, "topic_id": 67890, "type": "post_created", "body": ""}
    d["body"] = "x" * (size - len(orjson.dumps(d)))
    assert len(orjson.dumps(d)) == size
    return d


# ---------------------------------------------------------------------------------------------- loops
def bus_loop(bus: Bus, data: dict[str, Any]) -> Callable[[int], None]:
    publish = bus.publish

    def run(n: int) -> None:
        for _ in range(n):
            publish(CHANNEL, data)

    return run


def segment_loop(seg: Segment, payload: bytes) -> Callable[[int], None]:
    append = seg.append
    ch = CHANNEL.encode()

    def run(n: int) -> None:
        for _ in range(n):
            append(ch, b"", payload)

    return run


def redis_sync_loop(r: Any, data: dict[str, Any]) -> Callable[[int], None]:
    import orjson

    publish, dumps = r.publish, orjson.dumps

    def run(n: int) -> None:
        for _ in range(n):
            publish(CHANNEL, dumps(data))

    return run


def redis_pipe_loop(r: Any, data: dict[str, Any], batch: int = 100) -> Callable[[int], None]:
    import orjson

    dumps = orjson.dumps

    def run(n: int) -> None:
        for _ in range(n // batch):
            p = r.pipeline(transaction=False)
            for _ in range(batch):
                p.publish(CHANNEL, dumps(data))
            p.execute()

    return run


def concurrent_rate(make_loop: Callable[[], Callable[[int], None]], n: int, procs: int = 2) -> float:
    """Aggregate rate of ``procs`` forked processes running ``make_loop()(n)`` after one start signal."""
    go_r, go_w = os.pipe()
    res_r, res_w = os.pipe()
    pids = []
    try:
        for _ in range(procs):
            pid = os.fork()
            if pid == 0:  # child: never returns into the parent's code
                code = 1
                try:
                    os.close(go_w)
                    loop = make_loop()
                    loop(min(n, 200))  # warm caches / connections
                    os.read(go_r, 1)
                    t0 = time.perf_counter()
                    loop(n)
                    t1 = time.perf_counter()
                    os.write(res_w, f"{t0!r} {t1!r}\n".encode())
                    code = 0
                finally:
                    os._exit(code)
            pids.append(pid)
        time.sleep(0.3)  # let children attach and warm up
        os.write(go_w, b"g" * procs)
        spans: list[tuple[float, float]] = []
        buf = b""
        deadline = time.monotonic() + 300
        while len(spans) < procs and time.monotonic() < deadline:
            chunk = os.read(res_r, 4096)
            if not chunk:
                break
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                a, b = line.split()
                spans.append((float(a), float(b)))
        if len(spans) < procs:
            raise RuntimeError("a publishing child failed")
        return procs * n / (max(b for _, b in spans) - min(a for a, _ in spans))
    finally:
        for fd in (go_r, go_w, res_r, res_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        for pid in pids:
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG) == (0, 0):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)


def start_subscriber(name: str) -> int:
    """Fork a process subscribed to CHANNEL (counts messages) so publishes pay the real futex wake-ups."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(r)
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # for sigwait; threads inherit it
            bus = Bus(name, create=False)
            count = [0]
            bus.subscribe(CHANNEL, lambda m: count.__setitem__(0, count[0] + 1))
            os.write(w, b"r")
            signal.sigwait({signal.SIGTERM})
            bus.close()
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    os.read(r, 1)
    os.close(r)
    return pid


def stop_child(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if os.waitpid(pid, os.WNOHANG) != (0, 0):
            return
        time.sleep(0.02)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


# ---------------------------------------------------------------------------------------------- main
def main() -> int:
    args = c.parse_args(__doc__ or "")
    rep = c.Report("bench_publish", "publish throughput, 100-byte payloads, 1 process unless stated", args)
    quick = args.quick
    repeats = args.repeats or (3 if quick else 5)
    n_shm = 30_000 if quick else 200_000
    n_sync = 2_000 if quick else 15_000
    n_pipe = 20_000 if quick else 100_000
    n_conc = 20_000 if quick else 150_000
    data = payload_dict(100)
    import orjson

    raw = orjson.dumps(data)

    names = {k: c.unique_name(f"perfpub-{k}") for k in ("json", "msgpack", "raw", "sub", "conc")}
    buses: list[Bus] = []
    sub_pid = 0
    try:
        bus_json = Bus(names["json"], codec="json", create=True)
        bus_mp = Bus(names["msgpack"], codec="msgpack", create=True)
        bus_sub = Bus(names["sub"], codec="json", create=True)
        bus_conc = Bus(names["conc"], codec="json", create=True)
        buses += [bus_json, bus_mp, bus_sub, bus_conc]
        seg_bus = Bus(names["raw"], create=True)
        buses.append(seg_bus)
        seg = seg_bus.segment
        for b in buses:
            b.segment  # noqa: B018 - attach now, not inside the timed loop
        rep.log(f"msgpack payload is {len(bus_mp.codec.encode(data))} bytes for the same dict (JSON: {len(raw)})")

        rows: dict[str, tuple[Callable[[], float], list[float]]] = {
            "Bus.publish json (orjson)": (lambda: c.rate(bus_loop(bus_json, data), n_shm), []),
            "Bus.publish msgpack": (lambda: c.rate(bus_loop(bus_mp, data), n_shm), []),
            "Segment.append raw 100 B": (lambda: c.rate(segment_loop(seg, raw), n_shm), []),
            "Bus.publish json, 1 subscribed process": (lambda: c.rate(bus_loop(bus_sub, data), n_shm), []),
            "Bus.publish json, 2 processes (aggregate)": (
                lambda: concurrent_rate(lambda: bus_loop(bus_conc, data), n_conc),
                [],
            ),
        }
        with c.redis_baseline() as rb:
            rep.note(
                f"Redis baseline: {rb.source}"
                + (f", server {rb.server_version}" if rb.server_version else "")
                + (f" ({rb.problem})" if rb.problem else "")
            )
            rclient = None
            if rb.url:
                import redis

                rclient = redis.Redis.from_url(rb.url)
                url = rb.url
                rows["redis-py PUBLISH sync"] = (lambda: c.rate(redis_sync_loop(rclient, data), n_sync), [])
                rows["redis-py PUBLISH pipelined x100"] = (
                    lambda: c.rate(redis_pipe_loop(rclient, data), n_pipe),
                    [],
                )
                rows["redis-py PUBLISH sync, 2 processes"] = (
                    lambda: concurrent_rate(lambda: redis_sync_loop(redis.Redis.from_url(url), data), n_sync),
                    [],
                )
            sub_pid = start_subscriber(names["sub"])
            for name, (fn, _) in rows.items():  # warm-up: imports, slot lookup, connections
                if "2 processes" not in name:
                    fn()
            for i in range(repeats):
                for _name, (fn, vals) in rows.items():
                    vals.append(fn())
                rep.log(
                    f"repeat {i + 1}/{repeats}: "
                    + ", ".join(f"{k.split(' (')[0]}={v[-1] / 1e3:.0f}k" for k, (_, v) in rows.items())
                )
            if rclient is not None:
                with contextlib.suppress(Exception):
                    rclient.close()

        have_redis = "redis-py PUBLISH sync" in rows
        base1 = ["redis-py PUBLISH sync", "redis-py PUBLISH pipelined x100"] if have_redis else []
        rep.published(
            "gem memory backend (published)",
            GEM_MEMORY_BACKEND,
            "msgs/s",
            "discourse/message_bus memory backend, as quoted in issue 2",
        )
        for name, (_, vals) in rows.items():
            if name.startswith("redis"):
                continue
            bl = list(base1)
            if "2 processes" in name and have_redis:
                bl = ["redis-py PUBLISH sync, 2 processes", *base1[1:]]
            rep.add(name, vals, "msgs/s", baselines=[*bl, "gem memory backend (published)"])
        for name, (_, vals) in rows.items():
            if name.startswith("redis"):
                rep.add(name, vals, "msgs/s")

        main_rate = rep.rows["Bus.publish json (orjson)"].median
        rep.target("Bus.publish json msgs/s", main_rate, 300_000, unit="")
        rep.target(
            "vs gem memory backend (published figure, not measured here)",
            main_rate / GEM_MEMORY_BACKEND,
            30,
            unit="x",
        )
        if have_redis:
            rep.target(
                "vs redis-py sync PUBLISH (measured now)",
                rep.ratio("Bus.publish json (orjson)", "redis-py PUBLISH sync"),
                10,
                unit="x",
            )
            rep.note(
                "vs redis-py pipelined x100 (measured now): "
                f"{rep.ratio('Bus.publish json (orjson)', 'redis-py PUBLISH pipelined x100'):.1f}x "
                "(no target; pipelining trades latency for throughput)"
            )
        else:
            rep.note("no Redis available: the redis-py ratios could not be measured in this run")
        spread = [max(v) / min(v) for _, v in rows.values() if v and min(v) > 0]
        rep.note(
            f"{repeats} repeats per row, interleaved; worst max/min spread {max(spread):.2f}x "
            f"(median {statistics.median(spread):.2f}x): the machine is shared"
        )
    finally:
        if sub_pid:
            stop_child(sub_pid)
        for b in buses:
            with contextlib.suppress(Exception):
                b.destroy()
    rep.emit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
