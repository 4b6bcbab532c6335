#!/usr/bin/env python3
"""Scaling with processes: N publishers on one bus against the same code on a bus each; K listening processes fed
live by one publisher; K processes reading a channel's backlog.

One shared bus serialises its writers on one lock, so N publishers on it can at best match one; a bus per process
is the ceiling the same code reaches when nothing is shared. The ratios to read: ``shared/own`` (how much of the
ceiling one bus keeps), ``N/1`` (does adding publishers add throughput, or take it away), ``K/1`` for listeners
(deliveries should grow with K, the publisher should not slow down) and for backlog readers (lock-free: should
grow with K up to the cores).

Rates move with the machine's load; the CPU each process spends per publish (or per delivery, for a listener) and
the publishers' sleeps on the lock per 1,000 publishes (voluntary context switches) move much less, and show what
contention and wake-ups cost.

Wake-up latency: one publisher at a steady 1,000 msgs/s (each message stamped with the monotonic clock) and
``--wake-listeners`` processes (default: one per CPU but the publisher's, at most 15), whose callbacks note how long
each message took to reach them; the p99 over every delivery.

The acceptance of issue 32 is printed as targets, by the CPU count: below 16 CPUs (the 2-core VM), 2 publishers on
one bus >= 1.2x one, 8 >= 0.9x one, 2 listening processes >= 1.5x the deliveries of one; with 16 or more, 16
publishers on one bus >= 4x one, 15 listening processes >= 7x one, and the wake-up p99 <= 1 ms with 15 listening.
A target whose sizes were not measured is named in a note instead (e.g. ``--publishers 1,2,8 --listeners 1,2``).

Sizes default from ``os.cpu_count()``: 1, 2, 4, ... up to the CPU count (``--quick``: 1 and the CPU count);
``--publishers 1,2,4`` and ``--listeners 1,3`` choose others. Each round measures every size of a kind once, the
shared and own rows of a size back to back, so the machine's load hits both alike; figures are medians over rounds.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import select
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable

import _common as c

from shmbus import Bus

QUICK_TIMEOUT = 90
FULL_TIMEOUT = 1200

CHANNEL = "/bench/scaling"
WARM = "/bench/scaling-warm"
WAKE = "/bench/scaling-wake"
WAKE_RATE = 1000.0  # msgs/s: the wake-up target's rate
PAYLOAD = {"user_id": 12345, "topic_id": 67890, "type": "post_created", "body": "x" * 40}  # 100 bytes of JSON

#: a job runs in a forked child: it sets up, calls ``ready()`` (which returns at the common start), works, and
#: returns its result line
Job = Callable[[Callable[[], None]], str]


# ---------------------------------------------------------------------------------------------- running children
def race(jobs: list[Job], timeout: float = 120.0) -> list[list[float]]:
    """Fork one child per job, start them together once all are ready, and return their result lines (as floats)
    in the jobs' order. A child that fails or misses ``timeout`` fails the measurement; every child is reaped."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    res_r, res_w = os.pipe()
    pids: list[int] = []
    try:
        for index, job in enumerate(jobs):
            pid = os.fork()
            if pid == 0:  # child: never returns into the parent's code
                code = 1
                try:
                    for fd in (ready_r, go_w, res_r):
                        os.close(fd)

                    def ready() -> None:
                        os.write(ready_w, b"r")
                        os.read(go_r, 1)

                    line = job(ready)
                    os.write(res_w, f"{index} {line}\n".encode())
                    code = 0
                except BaseException:
                    traceback.print_exc()
                finally:
                    os._exit(code)
            pids.append(pid)
        for fd in (ready_w, go_r, res_w):
            os.close(fd)
        ready_w = go_r = res_w = -1
        deadline = time.monotonic() + timeout
        _read_exactly(ready_r, len(jobs), deadline, "ready")
        os.write(go_w, b"g" * len(jobs))
        text = b""
        while text.count(b"\n") < len(jobs):
            text += _read_some(res_r, deadline, "result")
        lines = [line.split() for line in text.decode().splitlines()]
        return [[float(x) for x in line[1:]] for line in sorted(lines, key=lambda line: int(line[0]))]
    finally:
        for fd in (ready_r, ready_w, go_r, go_w, res_r, res_w):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        for pid in pids:
            _reap(pid)


def _read_some(fd: int, deadline: float, what: str) -> bytes:
    left = deadline - time.monotonic()
    if left <= 0 or not select.select([fd], [], [], left)[0]:
        raise RuntimeError(f"bench_scaling: children timed out ({what})")
    chunk = os.read(fd, 4096)
    if not chunk:
        raise RuntimeError(f"bench_scaling: a child failed before its {what}")
    return chunk


def _read_exactly(fd: int, n: int, deadline: float, what: str) -> None:
    got = 0
    while got < n:
        got += len(_read_some(fd, deadline, what))


def _reap(pid: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG) != (0, 0):
                return
        time.sleep(0.01)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


# ---------------------------------------------------------------------------------------------- the jobs
def publisher(name: str, n: int, *, own: bool) -> Job:
    """Publish ``n`` messages on bus ``name`` (``own``: a bus of its own made under that name, and destroyed)."""

    def job(ready: Callable[[], None]) -> str:
        bus = Bus(name, create=own, keepalive_interval=0, ring_size=4 << 20)
        try:
            publish = bus.publish
            for _ in range(500):  # attach, imports, caches: out of the timed part (listeners count CHANNEL only)
                publish(WARM, PAYLOAD)
            ready()
            u0 = resource.getrusage(resource.RUSAGE_SELF)
            t0 = time.perf_counter()
            for _ in range(n):
                publish(CHANNEL, PAYLOAD)
            t1 = time.perf_counter()
            u1 = resource.getrusage(resource.RUSAGE_SELF)
        finally:
            bus.destroy() if own else bus.close()
        cpu = u1.ru_utime + u1.ru_stime - u0.ru_utime - u0.ru_stime
        return f"{t0!r} {t1!r} {n} {cpu!r} {u1.ru_nvcsw - u0.ru_nvcsw}"

    return job


def subscriber(name: str, n: int) -> Job:
    """Count ``n`` messages on CHANNEL; the time of the last one, what the listener lost, and the process's CPU
    and sleeps (voluntary context switches: its futex waits, mostly) from the start to the last one."""

    def job(ready: Callable[[], None]) -> str:
        bus = Bus(name, keepalive_interval=0)
        done = threading.Event()
        count = [0, 0.0]

        def on_message(_: object) -> None:
            count[0] += 1
            if count[0] == n:
                count[1] = time.perf_counter()
                done.set()

        try:
            bus.subscribe(CHANNEL, on_message)
            ready()
            u0 = resource.getrusage(resource.RUSAGE_SELF)
            done.wait(60)
            u1 = resource.getrusage(resource.RUSAGE_SELF)
            lost = bus.figures().listener.lost
        finally:
            bus.close()
        cpu = u1.ru_utime + u1.ru_stime - u0.ru_utime - u0.ru_stime
        return f"{count[1]!r} {count[0]} {lost} {cpu!r} {u1.ru_nvcsw - u0.ru_nvcsw}"

    return job


def wake_publisher(name: str, rate: float, n: int) -> Job:
    """Publish ``n`` messages at a steady ``rate``, each stamped with ``time.perf_counter_ns()`` just before."""

    def job(ready: Callable[[], None]) -> str:
        bus = Bus(name, keepalive_interval=0)
        try:
            ready()
            time.sleep(0.2)  # the listeners are asleep on the futex when the first message comes
            step = 1.0 / rate
            due = time.perf_counter()
            for _ in range(n):
                due += step
                left = due - time.perf_counter()
                if left > 0:
                    time.sleep(left)
                bus.publish(WAKE, {"t": time.perf_counter_ns(), **PAYLOAD})
        finally:
            bus.close()
        return f"{n}"

    return job


def wake_subscriber(name: str, n: int) -> Job:
    """Note, for each of ``n`` messages on WAKE, the microseconds from its stamp to this callback."""

    def job(ready: Callable[[], None]) -> str:
        bus = Bus(name, keepalive_interval=0)
        done = threading.Event()
        lat: list[float] = []

        def on_message(msg: object) -> None:
            lat.append((time.perf_counter_ns() - msg.data["t"]) / 1e3)  # type: ignore[attr-defined]
            if len(lat) == n:
                done.set()

        try:
            bus.subscribe(WAKE, on_message)
            ready()
            done.wait(60)
        finally:
            bus.close()
        return " ".join(f"{x:.1f}" for x in lat)

    return job


def backlog_reader(name: str, rounds: int) -> Job:
    """Read CHANNEL's whole backlog ``rounds`` times (lock-free reads)."""

    def job(ready: Callable[[], None]) -> str:
        bus = Bus(name, keepalive_interval=0)
        try:
            bus.backlog(CHANNEL, 0)
            ready()
            got = 0
            t0 = time.perf_counter()
            for _ in range(rounds):
                got += len(bus.backlog(CHANNEL, 0))
            t1 = time.perf_counter()
        finally:
            bus.close()
        return f"{t0!r} {t1!r} {got}"

    return job


def made(name: str, **options: int) -> Bus:
    """A new bus, its segment made now (a bus attaches on first use), for children to attach by name."""
    bus = Bus(name, create=True, keepalive_interval=0, **options)
    bus.segment  # noqa: B018 - attach now
    return bus


def aggregate(lines: list[list[float]]) -> float:
    """Operations per second of children that each report ``t0 t1 ops ...``, from the first start to the last end."""
    return sum(x[2] for x in lines) / (max(x[1] for x in lines) - min(x[0] for x in lines))


# ---------------------------------------------------------------------------------------------- the measurements
def measure_publishers(rep: c.Report, sizes: list[int], n: int, rounds: int) -> None:
    """Rates, and what contention costs besides: CPU per publish (waiting on a lock in the kernel, spinning) and
    the voluntary context switches (sleeps on the lock) per 1,000 publishes, which the machine's load moves less."""
    rows: dict[tuple[str, int], list[list[list[float]]]] = {(kind, k): [] for kind in ("shared", "own") for k in sizes}
    for r in range(rounds):
        for k in sizes:
            name = c.unique_name("perfscale-shared")
            bus = made(name, ring_size=4 << 20)
            try:
                rows["shared", k].append(race([publisher(name, n, own=False) for _ in range(k)]))
            finally:
                bus.destroy()
            names = [c.unique_name(f"perfscale-own{i}") for i in range(k)]
            rows["own", k].append(race([publisher(x, n, own=True) for x in names]))
        rep.log(
            f"publishers round {r + 1}/{rounds}: "
            + ", ".join(
                f"N={k} shared {aggregate(rows['shared', k][-1]) / 1e3:.0f}k "
                f"own {aggregate(rows['own', k][-1]) / 1e3:.0f}k"
                for k in sizes
            )
        )
    where = {"shared": "on one bus", "own": "a bus each"}
    for k in sizes:
        for kind in ("own", "shared"):
            runs = rows[kind, k]
            bases = [f"publish, N={k} a bus each", f"publish, N={sizes[0]} on one bus"] if kind == "shared" else []
            rep.add(f"publish, N={k} {where[kind]}", [aggregate(x) for x in runs], "msgs/s", baselines=bases)
            rep.add(
                f"CPU per publish, N={k} {where[kind]}",
                [1e6 * sum(child[3] for child in x) / sum(child[2] for child in x) for x in runs],
                "us",
                higher_is_better=False,
                baselines=[f"CPU per publish, N={k} a bus each"] if kind == "shared" else [],
            )
            rep.add(
                f"sleeps per 1k publishes, N={k} {where[kind]}",
                [1e3 * sum(child[4] for child in x) / sum(child[2] for child in x) for x in runs],
                "",
                higher_is_better=False,
            )
    one = f"publish, N={sizes[0]} on one bus"
    rep.note(
        "publishers, shared/own: "
        + ", ".join(f"N={k} {rep.ratio(f'publish, N={k} on one bus', f'publish, N={k} a bus each'):.2f}" for k in sizes)
    )
    rep.note(
        f"publishers on one bus, N/{sizes[0]}: "
        + ", ".join(f"N={k} {rep.ratio(f'publish, N={k} on one bus', one):.2f}" for k in sizes)
    )


def measure_listeners(rep: c.Report, sizes: list[int], n: int, rounds: int) -> None:
    """Rates, and the CPU they cost: the publisher's per publish (its wake-up calls), each listener's per delivery
    (its wake-ups), which the machine's load moves less than rates; and how often a listener slept (a woken
    listener drains everything before it sleeps again: far fewer sleeps than deliveries)."""
    published: dict[int, list[float]] = {k: [] for k in sizes}
    delivered: dict[int, list[float]] = {k: [] for k in sizes}
    pub_cpu: dict[int, list[float]] = {k: [] for k in sizes}
    sub_cpu: dict[int, list[float]] = {k: [] for k in sizes}
    sub_sleeps: dict[int, list[float]] = {k: [] for k in sizes}
    lost_total = 0
    for _ in range(rounds):
        for k in sizes:
            name = c.unique_name("perfscale-listen")
            bus = made(name, ring_size=64 << 20, max_backlog_size=10)
            try:
                lines = race([publisher(name, n, own=False)] + [subscriber(name, n) for _ in range(k)])
            finally:
                bus.destroy()
            pub, subs = lines[0], lines[1:]
            lost_total += int(sum(x[2] for x in subs)) + sum(n - int(x[1]) for x in subs)
            published[k].append(n / (pub[1] - pub[0]))
            delivered[k].append(k * n / (max(x[0] for x in subs) - pub[0]))
            pub_cpu[k].append(1e6 * pub[3] / n)
            sub_cpu[k].append(1e6 * sum(x[3] for x in subs) / (k * n))
            sub_sleeps[k].append(1e3 * sum(x[4] for x in subs) / (k * n))
    one = sizes[0]
    for k in sizes:
        rep.add(
            f"publish, {k} listening processes",
            published[k],
            "msgs/s",
            baselines=[f"publish, {one} listening processes"],
        )
        rep.add(
            f"deliveries, {k} listening processes",
            delivered[k],
            "msgs/s",
            baselines=[f"deliveries, {one} listening processes"],
        )
        rep.add(f"publisher CPU per publish, {k} listening", pub_cpu[k], "us", higher_is_better=False)
        rep.add(f"listener CPU per delivery, {k} listening", sub_cpu[k], "us", higher_is_better=False)
        rep.add(f"listener sleeps per 1k deliveries, {k} listening", sub_sleeps[k], "", higher_is_better=False)
    rep.note(
        f"listeners, K/{one}: deliveries "
        + ", ".join(
            f"K={k} {rep.ratio(f'deliveries, {k} listening processes', f'deliveries, {one} listening processes'):.2f}"
            for k in sizes
        )
        + "; the publisher's rate "
        + ", ".join(
            f"K={k} {rep.ratio(f'publish, {k} listening processes', f'publish, {one} listening processes'):.2f}"
            for k in sizes
        )
    )
    if lost_total:
        rep.note(f"listeners lost or missed {lost_total} messages in all (the ring is 64 MiB: they should not)")


def measure_wake(rep: c.Report, k: int, n: int, rounds: int) -> None:
    """The wake-up path: messages at WAKE_RATE, each finding ``k`` listening processes asleep (or nearly)."""
    p99s: list[float] = []
    p50s: list[float] = []
    missing = 0
    for _ in range(rounds):
        name = c.unique_name("perfscale-wake")
        bus = made(name, ring_size=4 << 20)
        try:
            lines = race([wake_publisher(name, WAKE_RATE, n)] + [wake_subscriber(name, n) for _ in range(k)])
        finally:
            bus.destroy()
        lat = sorted(x for line in lines[1:] for x in line)
        missing += k * n - len(lat)
        p50s.append(lat[len(lat) // 2])
        p99s.append(lat[min(len(lat) - 1, int(len(lat) * 0.99))])
    rep.add(f"wake-up p50, {k} listening, {WAKE_RATE:.0f} msgs/s", p50s, "us", higher_is_better=False)
    rep.add(f"wake-up p99, {k} listening, {WAKE_RATE:.0f} msgs/s", p99s, "us", higher_is_better=False)
    if missing:
        rep.note(f"wake-up: {missing} deliveries missing (listeners that did not get every message in 60 s)")


def check_targets(rep: c.Report, publishers: list[int], listeners: list[int], wake_k: int) -> None:
    """Issue 32's acceptance, as ratios of this run's medians; the set by the CPU count."""

    def ratio(kind: str, k: int) -> float:
        if kind == "publish":
            return rep.ratio(f"publish, N={k} on one bus", "publish, N=1 on one bus")
        return rep.ratio(f"deliveries, {k} listening processes", "deliveries, 1 listening processes")

    cpus = os.cpu_count() or 1
    wanted: list[tuple[str, str, int, float]]
    if cpus >= 16:
        wanted = [("publish", "publishers on one bus", 16, 4.0), ("listen", "listening processes", 15, 7.0)]
    else:
        wanted = [
            ("publish", "publishers on one bus", 2, 1.2),
            ("publish", "publishers on one bus", 8, 0.9),
            ("listen", "listening processes: deliveries", 2, 1.5),
        ]
    unmeasured = []
    for kind, what, k, goal in wanted:
        sizes = publishers if kind == "publish" else listeners
        if 1 in sizes and k in sizes:
            rep.target(f"{what}, {k} / 1 ({cpus} CPUs)", ratio(kind, k), goal, unit="x")
        else:
            unmeasured.append(f"{'--publishers' if kind == 'publish' else '--listeners'} with 1 and {k}")
    if cpus >= 16:
        row = f"wake-up p99, 15 listening, {WAKE_RATE:.0f} msgs/s"
        if wake_k == 15 and row in rep.rows:
            rep.target(
                f"wake-up p99, 15 listening at {WAKE_RATE:.0f} msgs/s",
                rep.rows[row].median,
                1000.0,
                at_least=False,
                unit=" us",
            )
        else:
            unmeasured.append("--wake-listeners 15")
    if unmeasured:
        rep.note("targets not checked (sizes not measured): run with " + "; ".join(unmeasured))


def measure_backlog(rep: c.Report, sizes: list[int], reads: int, rounds: int) -> None:
    rates: dict[int, list[float]] = {k: [] for k in sizes}
    name = c.unique_name("perfscale-backlog")
    bus = made(name, max_backlog_size=1000)
    try:
        for _ in range(1000):
            bus.publish(CHANNEL, PAYLOAD)
        for _ in range(rounds):
            for k in sizes:
                rates[k].append(aggregate(race([backlog_reader(name, reads) for _ in range(k)])))
    finally:
        bus.destroy()
    one = f"backlog reads, {sizes[0]} processes"
    for k in sizes:
        rep.add(f"backlog reads, {k} processes", rates[k], "msgs/s", baselines=[one])
    rep.note(
        f"backlog readers, K/{sizes[0]}: "
        + ", ".join(f"K={k} {rep.ratio(f'backlog reads, {k} processes', one):.2f}" for k in sizes)
    )


def default_sizes(quick: bool) -> list[int]:
    cpus = os.cpu_count() or 1
    if quick:
        return sorted({1, cpus})
    sizes, k = [], 1
    while k < cpus:
        sizes.append(k)
        k *= 2
    return [*sizes, cpus]


def sizes_arg(text: str) -> list[int]:
    sizes = sorted({int(x) for x in text.split(",") if x.strip()})
    if not sizes or sizes[0] < 1:
        raise ValueError(f"sizes must be positive integers: {text!r}")
    return sizes


def main() -> int:
    def extra(p: argparse.ArgumentParser) -> None:
        p.add_argument("--publishers", type=sizes_arg, default=None, help="publisher counts, e.g. 1,2,4")
        p.add_argument("--listeners", type=sizes_arg, default=None, help="listener/reader counts, e.g. 1,3")
        p.add_argument(
            "--listener-yield",
            action="store_true",
            help="listeners yield the CPU once before they sleep (shmbus.bus.listener.YIELD_BEFORE_SLEEP), for an A/B",
        )
        p.add_argument(
            "--wake-listeners",
            type=int,
            default=None,
            help="listening processes for the wake-up latency (default: CPUs - 1, 1 to 15; 0: not measured)",
        )

    args = c.parse_args(__doc__ or "", extra=extra)
    if args.listener_yield:  # set before the children fork: they inherit it
        from shmbus.bus import listener

        listener.YIELD_BEFORE_SLEEP = True
    quick = args.quick
    rep = c.Report("bench_scaling", "throughput with N publishers and K listeners/readers (processes)", args)
    publishers = args.publishers or default_sizes(quick)
    listeners = args.listeners or default_sizes(quick)
    rounds = args.repeats or (2 if quick else 5)
    measure_publishers(rep, publishers, 50_000 if quick else 200_000, rounds)
    measure_listeners(rep, listeners, 20_000 if quick else 100_000, rounds)
    measure_backlog(rep, listeners, 10 if quick else 100, rounds)
    wake_k = args.wake_listeners
    if wake_k is None:
        wake_k = min(max((os.cpu_count() or 1) - 1, 1), 15)
    if wake_k > 0:
        measure_wake(rep, wake_k, 500 if quick else 2000, rounds)
    check_targets(rep, publishers, listeners, wake_k)
    rep.note(
        f"{os.cpu_count()} CPUs; more processes than CPUs share them (the ideal K/1 or N/1 stops at the CPU count, "
        "less the publisher's for listeners). Load-sensitive: read the ratios, not the absolute figures"
    )
    rep.emit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
