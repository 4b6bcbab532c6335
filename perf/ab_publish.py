#!/usr/bin/env python3
"""A/B of ``Bus.publish`` between this tree and another checkout (e.g. ``git worktree add /tmp/base <commit>``).

    python perf/ab_publish.py /tmp/base [--rounds 12] [--n 100000] [--callgrind] [--dispatch {live,burst}]

``--dispatch`` measures the listener instead: a forked child publishes ``n`` messages while the parent's listener
dispatches them to a subscriber; the figure is messages delivered per CPU-second of the parent (its listener
thread's work: reading, decoding, dispatching), which the machine's load does not change (the child's pace still
sets the batch sizes). ``--dispatch burst`` takes the pace out: the parent holds the dispatch lock while it
publishes ``n`` messages, then the listener dispatches them in one go (CPU-seconds again).

Each round runs the same publish loop in a fresh process of each tree, alternating which goes first, so both see
the same machine; the figure is the median of the paired ratios (this tree / the other). ``--callgrind`` also
counts instructions per publish under valgrind (the difference of a long and a short run, so start-up cancels
out): unlike seconds, that count repeats exactly, whatever else the machine is doing.

Not part of ``perf/run``: it needs a second checkout.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent

LOOP = """
import os, sys, time
sys.path.insert(0, sys.argv[1])
from shmbus import Bus
n = int(sys.argv[2])
bus = Bus(f"abpub{os.getpid()}", keepalive_interval=0, create=True)
data = {"user_id": 12345, "topic_id": 67890, "type": "post_created", "body": "x" * 40}
publish = bus.publish
for _ in range(2000):
    publish("/bench/ab", data)
t0 = time.perf_counter()
for _ in range(n):
    publish("/bench/ab", data)
print(n / (time.perf_counter() - t0))
bus.destroy()
"""

#: What both dispatch measurements share: a bus with a large ring, one subscriber counting to n, which notes the
#: CPU time of the first and the n-th delivery.
_SUBSCRIBED = """
import os, sys, threading, time
sys.path.insert(0, sys.argv[1])
from shmbus import Bus
n = int(sys.argv[2])
bus = Bus(f"abdisp{os.getpid()}", keepalive_interval=0, create=True, ring_size=128 << 20, max_backlog_size=10)
data = {"user_id": 12345, "topic_id": 67890, "type": "post_created", "body": "x" * 40}
done = threading.Event()
times = []
count = 0
def got(msg):
    global count
    count += 1
    if count in (1, n):
        times.append(time.process_time())
    if count == n:
        done.set()
bus.subscribe("/bench/ab", got)
"""

DISPATCH = (
    _SUBSCRIBED
    + """
pid = os.fork()
if pid == 0:
    for _ in range(n):
        bus.publish("/bench/ab", data)
    os._exit(0)
os.waitpid(pid, 0)
assert done.wait(120), count
print((n - 1) / (times[-1] - times[0]))
bus.destroy()
"""
)

BURST = (
    _SUBSCRIBED
    + """
table = getattr(bus, "subscriptions", None)  # before issue 26 the lock was the bus's own
lock = table.dispatch_lock if table is not None else bus._dispatch_lock
with lock:
    for _ in range(n):
        bus.publish("/bench/ab", data)
    time.sleep(0.3)  # the listener has read what it could and waits for the lock
    t0 = time.process_time()
assert done.wait(120), count
print(n / (time.process_time() - t0))
bus.destroy()
"""
)


def rate(tree: Path, n: int, script: str = LOOP) -> float:
    out = subprocess.run([sys.executable, "-c", script, str(tree), str(n)], capture_output=True, text=True, check=True)
    return float(out.stdout)


def instructions(tree: Path, n: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/cg.out", sys.executable, "-c", LOOP]
        out = subprocess.run(
            [*argv, str(tree), str(n)],
            capture_output=True,
            text=True,
            check=True,
        )
    found = re.search(r"Collected : (\d+)", out.stderr)
    assert found, out.stderr[-2000:]
    return int(found.group(1))


def per_publish(tree: Path) -> float:
    return (instructions(tree, 22_000) - instructions(tree, 2_000)) / 20_000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("other", type=Path, help="the other checkout (its shmbus/ is imported)")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--n", type=int, default=100_000, help="publishes per round")
    parser.add_argument("--callgrind", action="store_true", help="also count instructions per publish")
    parser.add_argument(
        "--dispatch", choices=["live", "burst"], help="the listener's dispatch rate instead of publish's (see above)"
    )
    args = parser.parse_args()
    other = args.other.resolve()
    if not (other / "shmbus" / "__init__.py").is_file():
        parser.error(f"{other} has no shmbus/ package")
    script = {"live": DISPATCH, "burst": BURST}.get(args.dispatch or "", LOOP)
    ours: list[float] = []
    theirs: list[float] = []
    for i in range(args.rounds):
        if i % 2:
            theirs.append(rate(other, args.n, script))
            ours.append(rate(HERE, args.n, script))
        else:
            ours.append(rate(HERE, args.n, script))
            theirs.append(rate(other, args.n, script))
    paired = [a / b for a, b in zip(ours, theirs, strict=True)]
    print(f"this tree  {statistics.median(ours):,.0f} msgs/s (median of {args.rounds} rounds of {args.n:,})")
    print(f"{other}  {statistics.median(theirs):,.0f} msgs/s")
    print(
        f"ratio this/other: median {statistics.median(paired):.4f} (paired rounds {min(paired):.3f}..{max(paired):.3f})"
    )
    if args.callgrind:
        if shutil.which("valgrind") is None:
            print("--callgrind: valgrind is not installed (apt-get install valgrind)", file=sys.stderr)
            return 1
        mine, base = per_publish(HERE), per_publish(other)
        print(f"instructions per publish: this tree {mine:,.0f}, other {base:,.0f} ({100 * (mine / base - 1):+.2f}%)")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")  # the same hashing in every process: instruction counts repeat
    sys.exit(main())
