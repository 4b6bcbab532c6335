#!/usr/bin/env python3
"""Publish-to-callback latency across processes, shmbus vs redis-py pub/sub measured the same way, same run.

One publisher (this process) and N forked subscriber processes. Every message carries the publisher's
``time.perf_counter_ns()`` taken just before ``publish``; the subscriber's callback subtracts it from its own
``perf_counter_ns()`` (CLOCK_MONOTONIC: one clock for every process on the host). Messages go out at random
1-3 ms intervals, so each one finds the subscribers asleep: this is the wake-up path, not a throughput test.
Also: the CPU-busy worker (pure-Python work on the main thread, GIL switch interval 5 ms vs 0.5 ms), the idle
CPU of an attached, listening process, and proof that a publisher does not poll.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import select
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any

import _common as c
import orjson

from shmbus import Bus

QUICK_TIMEOUT = 150
FULL_TIMEOUT = 900
CHANNEL = "/bench/wake"
WARMUP = 20


@dataclass(frozen=True)
class Config:
    kind: str  # "shm" or "redis"
    n: int
    busy: bool = False
    switch: float | None = None  # sys.setswitchinterval in the subscriber

    @property
    def label(self) -> str:
        s = f"{'shmbus' if self.kind == 'shm' else 'redis-py'} N={self.n}"
        if self.busy:
            s += f" busy, switch {(self.switch or 0.005) * 1000:g} ms"
        return s


def cpu_work() -> int:
    """Pure-Python work that holds the GIL (what a busy sync web worker does)."""
    x = 0
    for i in range(2000):
        x += i * i
    return x


# ---------------------------------------------------------------------------------------------- children
def subscriber(cfg: Config, bus: Bus | None, url: str | None, ready_fd: int, out_path: str, max_s: float) -> None:
    """Body of a forked subscriber process: record latencies until the stop message, write them as JSON."""
    if cfg.switch:
        sys.setswitchinterval(cfg.switch)
    lat: list[int] = []
    done = threading.Event()

    def on(now: int, data: dict[str, Any]) -> None:
        if data.get("stop"):
            done.set()
        elif data["i"] >= WARMUP:
            lat.append(now - data["t"])

    closer: Any = None
    if cfg.kind == "shm":
        assert bus is not None
        bus.subscribe(CHANNEL, lambda m: on(time.perf_counter_ns(), m.data))
        closer = bus.close
    else:
        import redis

        r = redis.Redis.from_url(url)
        ps = r.pubsub(ignore_subscribe_messages=True)
        ps.subscribe(CHANNEL)

        def listen() -> None:
            for m in ps.listen():
                on(time.perf_counter_ns(), orjson.loads(m["data"]))
                if done.is_set():
                    break

        threading.Thread(target=listen, daemon=True).start()

        def closer() -> None:
            ps.close()
            r.close()

    os.write(ready_fd, b"r")
    cpu0 = time.process_time()
    if cfg.busy:
        deadline = time.monotonic() + max_s
        while not done.is_set() and time.monotonic() < deadline:
            cpu_work()
    else:
        done.wait(max_s)
    cpu = time.process_time() - cpu0
    with open(out_path + ".tmp", "w") as f:
        json.dump({"lat": lat, "cpu": cpu}, f)
    os.rename(out_path + ".tmp", out_path)
    with contextlib.suppress(Exception):
        closer()


def fork_child(fn: Any, *a: Any) -> int:
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            fn(*a)
            code = 0
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)
    return pid


def reap(pids: list[int], timeout: float) -> None:
    """Wait for children; SIGKILL whatever is still running at the deadline (never leave one behind)."""
    deadline = time.monotonic() + timeout
    left = list(pids)
    while left and time.monotonic() < deadline:
        for pid in list(left):
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG) == (0, 0):
                    continue
            left.remove(pid)
        if left:
            time.sleep(0.01)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    pids.clear()


def wait_ready(fd: int, n: int, timeout: float) -> None:
    got = 0
    deadline = time.monotonic() + timeout
    while got < n:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise RuntimeError(f"only {got}/{n} subscribers became ready")
        got += len(os.read(fd, n - got))


# ---------------------------------------------------------------------------------------------- one run
@dataclass
class RunResult:
    p50: float
    p99: float
    samples: int
    expected: int
    pub_cpu_us: float  # publisher CPU per event
    pub_cpu_share: float  # publisher CPU / wall during the run (a spinning publisher would be ~1)


def run(cfg: Config, events: int, bus: Bus, url: str | None, tmp: str, pids: list[int]) -> RunResult:
    ready_r, ready_w = os.pipe()
    paths = [os.path.join(tmp, f"{cfg.kind}-{i}-{time.monotonic_ns()}.json") for i in range(cfg.n)]
    max_s = 30 + events * 0.01
    rclient = None
    try:
        for p in paths:
            sbus = bus if cfg.kind == "shm" else None
            pids.append(fork_child(subscriber, cfg, sbus, url, ready_w, p, max_s))
        wait_ready(ready_r, cfg.n, 30)
        if cfg.kind == "redis":
            import redis

            rclient = redis.Redis.from_url(url)
            deadline = time.monotonic() + 30
            while dict(rclient.pubsub_numsub(CHANNEL)).get(CHANNEL.encode(), 0) < cfg.n:
                if time.monotonic() > deadline:
                    raise RuntimeError("redis subscribers never subscribed")
                time.sleep(0.01)
            rpub, dumps = rclient.publish, orjson.dumps

            def publish(d: dict[str, Any]) -> None:
                rpub(CHANNEL, dumps(d))
        else:
            bpub = bus.publish

            def publish(d: dict[str, Any]) -> None:
                bpub(CHANNEL, d)

        time.sleep(0.2)  # let the listeners settle into their wait
        rnd = random.Random(42)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        pn = time.perf_counter_ns
        for i in range(WARMUP + events):
            time.sleep(rnd.uniform(0.001, 0.003))
            publish({"t": pn(), "i": i})
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        publish({"stop": 1})
        lat: list[int] = []
        deadline = time.monotonic() + max_s + 10
        for p in paths:
            while not os.path.exists(p):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{cfg.label}: a subscriber never reported")
                time.sleep(0.01)
            with open(p) as f:
                lat += json.load(f)["lat"]
        reap(pids, 10)
    finally:
        os.close(ready_r)
        os.close(ready_w)
        if rclient is not None:
            rclient.close()
        reap(pids, 5)
    lat.sort()
    us = [x / 1000 for x in lat]
    return RunResult(
        c.percentile(us, 50), c.percentile(us, 99), len(us), events * cfg.n, cpu / (WARMUP + events) * 1e6, cpu / wall
    )


# ---------------------------------------------------------------------------------------------- idle CPU
def idle_listener(bus: Bus, ready_fd: int, out_path: str, seconds: float) -> None:
    bus.subscribe(CHANNEL, lambda m: None)
    os.write(ready_fd, b"r")
    time.sleep(0.3)
    c0, w0 = time.process_time(), time.monotonic()
    time.sleep(seconds)
    with open(out_path, "w") as f:
        json.dump(
            {"cpu": time.process_time() - c0, "wall": time.monotonic() - w0, "threads": threading.active_count()}, f
        )
    bus.close()


def idle_publisher(bus: Bus, ready_fd: int, out_path: str, seconds: float) -> None:
    for i in range(1000):
        bus.publish(CHANNEL, {"i": i})
    os.write(ready_fd, b"r")
    c0, w0 = time.process_time(), time.monotonic()
    time.sleep(seconds)
    with open(out_path, "w") as f:
        json.dump(
            {"cpu": time.process_time() - c0, "wall": time.monotonic() - w0, "threads": threading.active_count()}, f
        )
    bus.close()


def measure_idle(bus: Bus, tmp: str, pids: list[int], seconds: float, listeners: int = 4) -> dict[str, Any]:
    """Idle CPU of attached listening processes and of a publish-only process, over the same window."""
    ready_r, ready_w = os.pipe()
    paths = [os.path.join(tmp, f"idle-{i}.json") for i in range(listeners + 1)]
    try:
        for p in paths[:-1]:
            pids.append(fork_child(idle_listener, bus, ready_w, p, seconds))
        pids.append(fork_child(idle_publisher, bus, ready_w, paths[-1], seconds))
        wait_ready(ready_r, listeners + 1, 30)
        reap(pids, seconds + 30)
    finally:
        os.close(ready_r)
        os.close(ready_w)
        reap(pids, 5)
    res = []
    for p in paths:
        with open(p) as f:
            res.append(json.load(f))
    return {"listeners": res[:-1], "publisher": res[-1]}


# ---------------------------------------------------------------------------------------------- main
def main() -> int:
    args = c.parse_args(__doc__ or "")
    rep = c.Report("bench_wake", "publish-to-callback latency across processes (µs, lower is better)", args)
    repeats = args.repeats or (1 if args.quick else 3)
    events = 300 if args.quick else 2000
    idle_s = 3.0
    tmp = tempfile.mkdtemp(prefix="shmbus-perf-wake-")
    bus = Bus(c.unique_name("perfwake"), create=True)
    pids: list[int] = []
    try:
        bus.segment  # noqa: B018 - attach in the "master" before forking, like gunicorn --preload
        with c.redis_baseline() as rb:
            rep.note(f"Redis baseline: {rb.source}" + (f" ({rb.problem})" if rb.problem else ""))
            kinds = ["shm"] + (["redis"] if rb.url else [])
            configs = [Config(k, n) for k in kinds for n in (1, 4)]
            configs += [Config(k, 1, True, s) for k in kinds for s in (None, 0.0005)]
            results: dict[Config, list[RunResult]] = {cfg: [] for cfg in configs}
            for i in range(repeats):
                for cfg in configs:
                    r = run(cfg, events, bus, rb.url, tmp, pids)
                    results[cfg].append(r)
                    rep.log(
                        f"repeat {i + 1}/{repeats} {cfg.label}: p50 {r.p50:.0f} µs, p99 {r.p99:.0f} µs "
                        f"({r.samples}/{r.expected} samples), publisher {r.pub_cpu_us:.0f} µs CPU/event"
                    )
            idle = measure_idle(bus, tmp, pids, idle_s)
        for cfg in configs:
            rs = results[cfg]
            twin = Config("redis", cfg.n, cfg.busy, cfg.switch)
            base = twin.label if cfg.kind == "shm" and rb.url else None
            for q in ("p50", "p99"):
                rep.add(
                    f"{cfg.label} {q}",
                    [getattr(r, q) for r in rs],
                    "µs",
                    higher_is_better=False,
                    baselines=[f"{base} {q}"] if base else [],
                )
        for cfg in configs:
            missing = sum(r.expected - r.samples for r in results[cfg])
            if missing:
                rep.note(f"{cfg.label}: {missing} messages never reached a callback")
            pub = [r.pub_cpu_us for r in results[cfg]]
            share = max(r.pub_cpu_share for r in results[cfg])
            rep.add(
                f"{cfg.label} publisher CPU/event",
                pub,
                "µs",
                higher_is_better=False,
                note=f"max CPU/wall {share * 100:.1f}% while publishing every 1-3 ms",
            )
        cpus = [x["cpu"] / x["wall"] * 100 for x in idle["listeners"]]
        rep.add(f"idle listening process CPU ({idle_s:g} s, {len(cpus)} procs)", cpus, "%", higher_is_better=False)
        pubidle = idle["publisher"]
        rep.add(
            f"idle publish-only process CPU ({idle_s:g} s)",
            [pubidle["cpu"] / pubidle["wall"] * 100],
            "%",
            higher_is_better=False,
            note=f"{pubidle['threads']} thread(s) alive: no listener, nothing polls",
        )
        n4 = Config("shm", 4).label
        rep.target(f"{n4} p50", rep.rows[f"{n4} p50"].median, 150, at_least=False, unit=" µs")
        rep.target(f"{n4} p99", rep.rows[f"{n4} p99"].median, 1000, at_least=False, unit=" µs")
        rep.target("idle listening process CPU", max(cpus), 0.1, at_least=False, unit=" %")
        pub_share = max(r.pub_cpu_share for cfg in configs if cfg.kind == "shm" for r in results[cfg])
        rep.target(
            "shmbus publisher CPU/wall while publishing every 1-3 ms (spinning would be ~100)",
            pub_share * 100,
            50,
            at_least=False,
            unit=" %",
        )
        rep.note(
            f"{events} events per run after {WARMUP} warm-up events, {repeats} run(s) per row, rows "
            "interleaved; percentiles over all (subscriber, event) samples of a run; median [min-max] "
            "over runs"
        )
    finally:
        reap(pids, 5)
        bus.destroy()
        shutil.rmtree(tmp, ignore_errors=True)
    rep.emit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
