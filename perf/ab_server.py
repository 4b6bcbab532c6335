#!/usr/bin/env python3
"""A/B of the lean server's CPU per request between this tree and another checkout (``git worktree add``).

    python perf/ab_server.py /tmp/base [--rounds 3] [--callgrind]

The connection is driven in-process, as tests/server/test_inprocess.py drives it (each tree's own
``tests/server/mock_transport.py``: a fake transport and clock, no sockets, no load generator), so the figure is the
server's own Python per request: a bus poll answered at once (``dlp=t``), ten such polls pipelined in one read, a
long poll parked then ended by its interval, and a GET answered by the wrapped ASGI app (the bridge). Each round runs
a fresh process of each tree (its ``.venv/bin/python`` when it has one), alternating which goes first; a figure is
the best of three loops in a process, and the table shows the medians over rounds and their ratio (this / other).
``--callgrind`` also counts instructions per request of the bus cases under valgrind (the difference of a run of
1,200 and one of 200 requests, so start-up cancels out): unlike seconds, that count repeats whatever the machine does.

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
from wire import poll, request
from shmbus import Bus
from shmbus.adapters.asgi import MessageBusMiddleware
from shmbus.adapters.server import Server
try:
    from shmbus.adapters.server.serve import connection_factory
except ImportError:  # before issue 26
    connection_factory = lambda srv: srv.protocol_factory

async def ok_app(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})

def rig(mw):
    loop = FakeLoop()
    t = FakeTransport(loop)
    t.connect(connection_factory(Server(mw, loop))())
    return loop, t

def timed(step, n):
    t0 = time.process_time()
    for _ in range(n):
        step()
    return (time.process_time() - t0) / n * 1e6

async def bridged(mw, n):
    loop, t = rig(mw)
    data = request("GET", "/ok")
    t0 = time.process_time()
    for _ in range(n):
        t.receive(data)
        while not t.out:
            await asyncio.sleep(0)
        await asyncio.sleep(0)
        t.out.clear()
    return (time.process_time() - t0) / n * 1e6

async def count(case, n):
    bus = Bus("abserver" + uuid.uuid4().hex[:8], keepalive_interval=0, create=True)
    mw = MessageBusMiddleware(ok_app, bus=bus, long_polling_interval=1)
    loop, t = rig(mw)
    data, advance = CASES[case](bus)
    for _ in range(n):
        t.receive(data)
        loop.advance(advance) if advance else loop.run_due()
        t.out.clear()
    mw.close()
    bus.destroy()

CASES = {
    "dlp": lambda bus: (poll("c1", {"/x": 0}, dlp=True), 0.0),
    "pipelined": lambda bus: (poll("c1", {"/x": 0}, dlp=True) * 10, 0.0),
    "parked": lambda bus: (poll("c2", {"/x": bus.last_id("/x")}), 2.0),
}

async def main():
    if len(sys.argv) > 2:
        return await count(sys.argv[2], int(sys.argv[3]))
    bus = Bus("abserver" + uuid.uuid4().hex[:8], keepalive_interval=0, create=True)
    mw = MessageBusMiddleware(ok_app, bus=bus, long_polling_interval=1)
    try:
        dlp = poll("c1", {"/x": 0}, dlp=True)
        long = poll("c2", {"/x": bus.last_id("/x")})
        out = {}
        def once(data, advance=0.0):
            loop, t = rig(mw)
            def step():
                t.receive(data)
                loop.advance(advance) if advance else loop.run_due()
                t.out.clear()
            return step
        out["bus poll answered at once (dlp), us"] = min(timed(once(dlp), 3000) for _ in range(3))
        out["10 pipelined dlp polls in one read, us per poll"] = min(timed(once(dlp * 10), 300) for _ in range(3)) / 10
        out["long poll parked, ended by its 1 s interval, us"] = min(timed(once(long, 2.0), 1000) for _ in range(3))
        out["GET answered by the ASGI app (bridge), us"] = min([await bridged(mw, 2000) for _ in range(3)])
    finally:
        mw.close()
        bus.destroy()
    print(json.dumps(out))

asyncio.run(main())
"""


def run(tree: Path) -> dict[str, float]:
    done = subprocess.run(
        [python_of(tree), "-c", CHILD, str(tree)], capture_output=True, text=True, check=True, cwd=tree
    )
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def instructions(tree: Path, case: str, n: int) -> int:
    return callgrind_instructions([python_of(tree), "-c", CHILD, str(tree), case, str(n)], tree)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("other", type=Path, help="the other checkout (with its own .venv, or importable here)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--callgrind", action="store_true", help="also count instructions per request under valgrind")
    args = p.parse_args()
    this, other = paired(args.rounds, HERE, args.other.resolve(), run)
    print_medians(this, other, 52, "8.1f", "10.2f")
    if args.callgrind:
        print(f"\n{'instructions per request (callgrind)':52s} {'other':>8s} {'this':>8s}  this/other")
        for case, label in (
            ("dlp", "bus poll answered at once (dlp)"),
            ("pipelined", "10 pipelined dlp polls, per read"),
            ("parked", "long poll parked, ended by its 1 s interval"),
        ):
            a, b = ((instructions(t, case, 1200) - instructions(t, case, 200)) / 1000 for t in (args.other, HERE))
            print(f"{label:52s} {a:8.0f} {b:8.0f}  {b / a:10.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
