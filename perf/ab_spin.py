#!/usr/bin/env python3
"""The writers' lock under contention, with and without the bounded spin before sleeping (``_native.LOCK_SPIN``).

    python perf/ab_spin.py [--spins 0,20] [--rounds 3] [--n 200000]

Two publishers on one bus, each pinned to its own CPU (the first two this process may use), so that they run at
the same time and meet on the lock whatever else the machine runs; each publishes ``n`` messages. Printed per
round and spin count: CPU per publish (both processes), their sleeps (voluntary context switches: mostly waits on
the lock) and preemptions (involuntary ones) per 1,000 publishes. The spin counts alternate within each round, so
a change in the machine's load hits them alike. Rates are not printed: on a shared machine they say little.

Not part of ``perf/run``: it needs two CPUs to itself to mean much, and its figures are read side by side.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from shmbus import Bus, _native

PAYLOAD = {"user_id": 12345, "topic_id": 67890, "type": "post_created", "body": "x" * 40}


def run(spin: int, n: int, cpus: list[int]) -> tuple[float, float, float]:
    """CPU us per publish, sleeps and preemptions per 1,000 publishes, of two pinned publishers on one bus."""
    name = f"abspin{os.getpid()}"
    bus = Bus(name, create=True, keepalive_interval=0, ring_size=4 << 20)
    bus.segment  # noqa: B018 - made now, for the children to attach
    r, w = os.pipe()
    pids = []
    try:
        for cpu in cpus:
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    os.sched_setaffinity(0, {cpu})
                    _native.LOCK_SPIN = spin
                    mine = Bus(name, keepalive_interval=0)
                    for _ in range(500):
                        mine.publish("/bench/warm", PAYLOAD)
                    u0 = resource.getrusage(resource.RUSAGE_SELF)
                    for _ in range(n):
                        mine.publish("/bench/spin", PAYLOAD)
                    u1 = resource.getrusage(resource.RUSAGE_SELF)
                    mine.close()
                    cpu_s = u1.ru_utime + u1.ru_stime - u0.ru_utime - u0.ru_stime
                    os.write(w, f"{cpu_s} {u1.ru_nvcsw - u0.ru_nvcsw} {u1.ru_nivcsw - u0.ru_nivcsw}\n".encode())
                    code = 0
                finally:
                    os._exit(code)
            pids.append(pid)
        os.close(w)
        w = -1
        for pid in pids:
            _, status = os.waitpid(pid, 0)
            if status:
                raise RuntimeError(f"a publisher failed (status {status})")
        text = b""
        while chunk := os.read(r, 4096):
            text += chunk
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)
        bus.destroy()
    rows = [[float(x) for x in line.split()] for line in text.decode().splitlines()]
    total = len(rows) * n
    return tuple(sum(row[i] for row in rows) / total * k for i, k in ((0, 1e6), (1, 1e3), (2, 1e3)))  # type: ignore[return-value]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spins", default="0,20", help="LOCK_SPIN values to compare, e.g. 0,20,50")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--n", type=int, default=200_000, help="publishes per publisher")
    args = p.parse_args()
    spins = [int(x) for x in args.spins.split(",")]
    cpus = sorted(os.sched_getaffinity(0))[:2]
    if len(cpus) < 2:
        sys.exit("ab_spin: needs two CPUs")
    got: dict[int, list[tuple[float, float, float]]] = {s: [] for s in spins}
    for i in range(args.rounds):
        order = spins if i % 2 == 0 else spins[::-1]
        for spin in order:
            got[spin].append(run(spin, args.n, cpus))
            cpu, sleeps, preempt = got[spin][-1]
            load = os.getloadavg()[0]
            print(
                f"round {i + 1} spin {spin:>3}: CPU/publish {cpu:.2f} us, sleeps/1k {sleeps:.1f}, "
                f"preemptions/1k {preempt:.1f} (load {load:.1f})"
            )
    for spin in spins:
        rows = got[spin]
        med = [statistics.median(r[i] for r in rows) for i in range(3)]
        print(
            f"median, spin {spin:>3}: CPU/publish {med[0]:.2f} us, sleeps/1k {med[1]:.1f}, preemptions/1k {med[2]:.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
