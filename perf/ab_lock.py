#!/usr/bin/env python3
"""Instructions a publish runs while it holds the bus's writer lock, counted by callgrind, in this tree and
optionally another checkout (e.g. ``git worktree add /tmp/base <commit>``).

    python perf/ab_lock.py [OTHER_CHECKOUT] [--n 200] [--payload 100] [--top 12]

Every other publisher of the bus waits while one holds the lock, so these instructions bound how far N publishers
on one bus can scale. A count, unlike seconds, repeats exactly whatever else the machine is doing.

How: in a process under ``valgrind --tool=callgrind``, ``shmbus._native.mutex_lock`` and ``mutex_unlock`` (which
the append calls by module attribute) are wrapped: right after the lock is taken the wrapper calls ``math.frexp``,
where callgrind zeroes its counters, and right before the unlock ``math.ldexp``, where callgrind dumps them. So each
dump holds one critical section, without the lock and unlock calls themselves. The same wrappers around an empty
critical section (``try: lock; finally: unlock``, as the append has) measure what the wrappers add; that is taken
off. Whole publishes (lock included) are counted from two dumps around ``n`` of them, without the wrappers.

Not part of ``perf/run``: it needs valgrind and takes a minute.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import NamedTuple

from _callgrind import parse

HERE = Path(__file__).resolve().parent.parent

SCRIPT = """
import math, os, sys
sys.path.insert(0, sys.argv[1])
from shmbus import Bus, _native
n, size = int(sys.argv[2]), int(sys.argv[3])
bus = Bus(f"ablock{os.getpid()}", keepalive_interval=0, create=True, ring_size=256 << 10)
data = {"user_id": 12345, "topic_id": 67890, "type": "post_created", "body": "x" * max(size - 60, 0)}
publish = bus.publish
for _ in range(3000):  # caches, and a ring that wraps: the steady state
    publish("/bench/ab", data)
zero, dump = math.frexp, math.ldexp
dump(1.0, 1)  # dump 1: start-up
for _ in range(n):
    publish("/bench/ab", data)
dump(1.0, 1)  # dump 2: n whole publishes
real_lock, real_unlock = _native.mutex_lock, _native.mutex_unlock


def lock(ptr, timeout):
    taken = real_lock(ptr, timeout)
    zero(1.0)
    return taken


def unlock(ptr):
    dump(1.0, 1)
    return real_unlock(ptr)


_native.mutex_lock, _native.mutex_unlock = lock, unlock
ptr = bus.segment._mutex_ptr
for _ in range(n):  # dumps 3 .. n+2: empty critical sections (what the wrappers cost)
    try:
        if _native.mutex_lock(ptr, 5.0):
            pass
    finally:
        _native.mutex_unlock(ptr)
for _ in range(n):  # dumps n+3 .. 2n+2: the publishes' critical sections
    publish("/bench/ab", data)
_native.mutex_lock, _native.mutex_unlock = real_lock, real_unlock
bus.destroy()
"""


class Counts(NamedTuple):
    """Instructions per publish: in all, under the lock, and under the lock by C function (exclusive)."""

    whole: float
    section: float
    per: dict[str, float]


def measure(tree: Path, n: int, size: int) -> Counts:
    python = tree / ".venv" / "bin" / "python"
    if not python.exists():
        python = Path(sys.executable)
    out = Path(tempfile.mkdtemp(prefix="ablock-"))
    try:
        cmd = [
            "valgrind",
            "--tool=callgrind",
            "--zero-before=math_frexp*",
            "--dump-before=math_ldexp*",
            f"--callgrind-out-file={out}/cg",
            str(python),
            "-c",
            SCRIPT,
            str(tree),
            str(n),
            str(size),
        ]
        subprocess.run(cmd, check=True, capture_output=True)
        names: dict[str, str] = {}
        dumps = [parse(out / f"cg.{i}", names) for i in range(1, 2 * n + 3)]
    finally:
        shutil.rmtree(out, ignore_errors=True)
    whole = dumps[1][0] / n
    empty, inside = dumps[2 : n + 2], dumps[n + 2 : 2 * n + 2]
    wrappers = sum(t for t, _ in empty) / n
    section = sum(t for t, _ in inside) / n - wrappers
    per: dict[str, float] = defaultdict(float)
    for _, fns in inside:
        for name, cost in fns.items():
            per[name] += cost / n
    for _, fns in empty:
        for name, cost in fns.items():
            per[name] -= cost / n
    return Counts(whole, section, dict(per))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("other", nargs="?", help="another checkout to compare with")
    p.add_argument("--n", type=int, default=200, help="publishes counted (one dump each)")
    p.add_argument("--payload", type=int, default=100, help="payload bytes (JSON of a dict)")
    p.add_argument("--top", type=int, default=12, help="functions listed per tree")
    args = p.parse_args()
    if not shutil.which("valgrind"):
        sys.exit("ab_lock: valgrind is not installed")
    trees = [("this", HERE)] + ([("other", Path(args.other).resolve())] if args.other else [])
    results = {label: measure(tree, args.n, args.payload) for label, tree in trees}
    for label, tree in trees:
        r = results[label]
        print(f"{label} ({tree}), payload {args.payload} B:")
        print(f"  instructions per publish, whole:          {r.whole:>10,.0f}")
        print(f"  instructions per publish, under the lock: {r.section:>10,.0f}")
        for name, cost in sorted(r.per.items(), key=lambda kv: -kv[1])[: args.top]:
            print(f"    {cost:>9,.0f}  {name}")
    if args.other:
        a, b = results["this"], results["other"]
        print(f"this/other: whole {a.whole / b.whole:.3f}, under the lock {a.section / b.section:.3f}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
