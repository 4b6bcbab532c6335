#!/usr/bin/env python3
"""A/B of the lean server's 1 s clock (``Server._tick``) with many parked streams, between this tree and another
checkout (``git worktree add``).

    python perf/ab_clock.py /tmp/base [--streams 10000] [--seconds 60] [--rounds 3] [--callgrind]

One server holds ``--streams`` chunked streams (``long_polling_interval`` 25 s, the gem's default), driven
in-process as tests/server/test_inprocess.py drives a connection (each tree's own ``tests/server/mock_transport.py``:
fake transports and a fake clock, no sockets). The clock then runs ``--seconds`` seconds, a tick a second: the
streams end at 25 s and re-poll at once (a client's reconnect). Figures, the best of three runs in a process: the
CPU of the ticks per second (``time.thread_time``, the ticks only: the re-polls are outside it) and per held
stream and second, and the visits (``tick`` calls on connections) per second, over the first 20 s (the clock
alone) and over all the seconds (with the streams' ends, the same work in both trees, and their fresh
deadlines); and the CPU of a re-poll (an ended stream's client polls again and is parked). Each round runs a
fresh process of each tree, alternating which goes first; the table shows medians and their ratio.
``--callgrind`` also counts the instructions of 20 ticks (a run with them minus one without: no stream ends in
20 s) under valgrind at 2,000 streams.

Not part of ``perf/run``: it needs a second checkout.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from _ab import callgrind_instructions, paired, print_medians, python_of

HERE = Path(__file__).resolve().parent.parent

CHILD = r"""
import asyncio, json, sys, time, uuid
sys.path.insert(0, sys.argv[1] + "/tests/server")
from mock_transport import FakeLoop, FakeTransport
from wire import poll
from shmbus import Bus
from shmbus.adapters.asgi import MessageBusMiddleware
from shmbus.adapters.server import Server
from shmbus.adapters.server.connection import HttpConnection
from shmbus.adapters.server.serve import connection_factory

streams, seconds, mode = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
QUIET = min(seconds, 20)  # the streams end at 25 s
visits = [0]
tick = HttpConnection.tick
def counted(self, now, cutoff):
    visits[0] += 1
    tick(self, now, cutoff)

async def run(mw, tick_it):
    loop = FakeLoop()
    srv = Server(mw, loop)
    factory = connection_factory(srv)
    ts = []
    for i in range(streams):
        t = FakeTransport(loop)
        t.connect(factory())
        t.receive(poll("c%d" % i, {"/x": -1}, chunk=True))
        t.out.clear()
        ts.append(t)
        if i % 97 == 0:
            loop.advance(0.01)  # the streams arrive over a second, as clients do
    loop.advance(1.0 - (loop.now % 1.0))
    cpu, seen, visits[0], repoll = [], [], 0, [0.0, 0]
    for s in range(seconds):
        t0 = time.thread_time()
        if tick_it:
            loop.advance(1.0)
        else:
            loop.now += 1.0
        cpu.append(time.thread_time() - t0)
        seen.append(visits[0])
        visits[0] = 0
        ended = [i for i, t in enumerate(ts) if t.out.endswith(b"0\r\n\r\n")]
        if ended:  # they re-poll (not in the ticks' time)
            data = [poll("c%d" % i, {"/x": -1}, chunk=True, seq=s + 2) for i in ended]
            t0 = time.thread_time()
            for i, d in zip(ended, data):
                t = ts[i]
                t.out.clear()
                t.receive(d)
            repoll[0] += time.thread_time() - t0
            repoll[1] += len(ended)
    for t in ts:
        t.close()
    loop.run_due()
    return cpu, seen, repoll[0] / max(repoll[1], 1)

async def main():
    bus = Bus("abclock" + uuid.uuid4().hex[:8], keepalive_interval=0, create=True)
    mw = MessageBusMiddleware(None, bus=bus, long_polling_interval=25, max_active_clients=streams + 100)
    try:
        if mode != "time":
            HttpConnection.tick = counted
            await run(mw, mode == "ticks")
            return
        runs = [await run(mw, True) for _ in range(3)]
        quiet = min(sum(cpu[:QUIET]) for cpu, _, _ in runs) / QUIET
        every = min(sum(cpu) for cpu, _, _ in runs) / seconds
        repoll = min(r for _, _, r in runs)
        HttpConnection.tick = counted  # (a call more per visit: not in the timed runs)
        seen = (await run(mw, True))[1]
        out = {
            "first 20 s (no stream ends): CPU per second, us": quiet * 1e6,
            "  per held stream and second, us": quiet / streams * 1e6,
            "  connections visited per second": sum(seen[:QUIET]) / QUIET,
            "all the seconds (ends, re-polls): CPU per second, us": every * 1e6,
            "  per held stream and second, us ": every / streams * 1e6,
            "  connections visited per second ": sum(seen) / seconds,
            "a stream's re-poll (parked again), CPU per poll, us": repoll * 1e6,
        }
        print(json.dumps(out))
    finally:
        mw.close()
        bus.destroy()

asyncio.run(main())
"""


def run(tree: Path, streams: int, seconds: int) -> dict[str, float]:
    argv = [python_of(tree), "-c", CHILD, str(tree), str(streams), str(seconds), "time"]
    done = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=tree)
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def instructions(tree: Path, seconds: int, mode: str) -> int:
    return callgrind_instructions([python_of(tree), "-c", CHILD, str(tree), "2000", str(seconds), mode], tree)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("other", type=Path, help="the other checkout (with its own .venv, or importable here)")
    p.add_argument("--streams", type=int, default=10_000, help="parked streams on the one server (default 10,000)")
    p.add_argument("--seconds", type=int, default=60, help="seconds of the clock per run (default 60)")
    p.add_argument("--rounds", type=int, default=3, help="fresh processes per tree")
    p.add_argument("--callgrind", action="store_true", help="also count the ticks' instructions under valgrind")
    args = p.parse_args()
    this, other = paired(args.rounds, HERE, args.other.resolve(), lambda t: run(t, args.streams, args.seconds))
    print_medians(this, other, 56, "10.3f", "8.3f")
    if args.callgrind:
        for label, tree in (("other", args.other.resolve()), ("this", HERE)):
            n = instructions(tree, 20, "ticks") - instructions(tree, 20, "clock")
            print(f"{label}: {n / 20 / 2000:,.0f} instructions per held stream and second (2,000 streams, 20 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
