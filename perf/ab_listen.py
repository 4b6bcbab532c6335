#!/usr/bin/env python3
"""Instructions the listener thread runs per delivery, counted by callgrind, in this tree and optionally another
checkout (e.g. ``git worktree add /tmp/base <commit>``).

    python perf/ab_listen.py [OTHER_CHECKOUT] [--n 2000] [--top 12]

On a 2-core machine one publisher and K listening processes share the CPUs, so what K listeners deliver is bound
by the CPU each delivery costs the listener: the figure to cut. Counted for two shapes of batch, with one
subscriber on the channel (as ``perf/bench_scaling.py`` subscribes):

* ``burst``: ``n`` messages published while the listener waits for the dispatch lock, then read and dispatched in
  as few batches as the reads allow (the per-message cost: scan, decode, message objects, dispatch);
* ``one by one``: each message published after the last one was delivered, so every delivery is a batch of one
  and a wake-up (the per-batch cost besides: the futex word, the epoch, the metrics, the sleep).

How: under ``valgrind --tool=callgrind --separate-threads=yes``, the subscriber's callback calls ``math.frexp``
(callgrind zeroes the calling thread's counters there) on the delivery before the ``n`` counted and ``math.ldexp``
(a dump of that thread's counters) on the last of them, so the dump holds the listener thread's work for ``n``
deliveries (and one sleep and wake-up), whatever the main thread did meanwhile; divided by ``n``, the figure.
Only user-space instructions are counted
(the kernel's side of a wake-up is not). A count, unlike seconds, repeats exactly whatever the machine is doing.

Not part of ``perf/run``: it needs valgrind and takes a minute.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from _callgrind import parse

HERE = Path(__file__).resolve().parent.parent

SCRIPT = """
import math, os, sys, threading
sys.path.insert(0, sys.argv[1])
from shmbus import Bus
n, mode = int(sys.argv[2]), sys.argv[3]
bus = Bus(f"ablisten{os.getpid()}", keepalive_interval=0, create=True, ring_size=64 << 20, max_backlog_size=10)
data = {"user_id": 12345, "topic_id": 67890, "type": "post_created", "body": "x" * 40}
zero, dump = math.frexp, math.ldexp
count = [0, 0, -1, -1]  # delivered, the count to wake the main thread at, the counts to zero and to dump at
ev = threading.Event()
def got(msg):
    c = count[0] = count[0] + 1
    if c == count[2]:
        zero(1.0)  # in the listener thread: callgrind zeroes and dumps the calling thread's counters
    elif c == count[3]:
        dump(1.0, 1)
    if c >= count[1]:
        ev.set()
bus.subscribe("/bench/ab", got)
publish = bus.publish
table = getattr(bus, "subscriptions", None)
lock = table.dispatch_lock if table is not None else bus._dispatch_lock
def one_by_one(k):
    for _ in range(k):
        ev.clear()
        count[1] = count[0] + 1
        publish("/bench/ab", data)
        assert ev.wait(60)
one_by_one(500)  # caches, the listener's first batches
count[2] = count[0] + 1  # the next delivery zeroes: the n after it are counted
count[3] = count[2] + n
one_by_one(1)
if mode == "burst":
    ev.clear()
    count[1] = count[0] + n
    with lock:
        for _ in range(n):
            publish("/bench/ab", data)
    assert ev.wait(600)
else:
    one_by_one(n)
assert count[0] == count[3], count
bus.destroy()
"""


def measure(tree: Path, n: int, mode: str) -> tuple[float, dict[str, float]]:
    """Instructions per delivery of the listener thread, and by function (exclusive)."""
    python = tree / ".venv" / "bin" / "python"
    if not python.exists():
        python = Path(sys.executable)
    out = Path(tempfile.mkdtemp(prefix="ablisten-"))
    try:
        cmd = [
            "valgrind",
            "--tool=callgrind",
            "--separate-threads=yes",
            "--zero-before=math_frexp*",
            "--dump-before=math_ldexp*",
            f"--callgrind-out-file={out}/cg",
            str(python),
            "-c",
            SCRIPT,
            str(tree),
            str(n),
            mode,
        ]
        subprocess.run(cmd, check=True, capture_output=True)
        best: tuple[int, dict[str, int]] = (0, {})
        for path in sorted(out.glob("cg.1-*")):
            names: dict[str, str] = {}
            got = parse(path, names)
            if got[0] > best[0]:
                best = got
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return best[0] / n, {k: v / n for k, v in best[1].items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("other", nargs="?", help="another checkout to compare with")
    p.add_argument("--n", type=int, default=2000, help="deliveries counted")
    p.add_argument("--top", type=int, default=12, help="functions listed per tree and shape")
    args = p.parse_args()
    if not shutil.which("valgrind"):
        sys.exit("ab_listen: valgrind is not installed")
    trees = [("this", HERE)] + ([("other", Path(args.other).resolve())] if args.other else [])
    results = {}
    for mode in ("burst", "one"):
        for label, tree in trees:
            whole, per = results[label, mode] = measure(tree, args.n, mode)
            print(f"{label} ({tree}), {'burst' if mode == 'burst' else 'one by one'}:")
            print(f"  listener instructions per delivery: {whole:>10,.0f}")
            for name, cost in sorted(per.items(), key=lambda kv: -kv[1])[: args.top]:
                print(f"    {cost:>9,.0f}  {name}")
    if args.other:
        for mode in ("burst", "one"):
            a, b = results["this", mode][0], results["other", mode][0]
            print(f"this/other, {mode}: {a / b:.3f} ({a:,.0f} / {b:,.0f} instructions per delivery)")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
