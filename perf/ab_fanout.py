#!/usr/bin/env python3
"""A/B of the lean server's CPU per broadcast delivery between this tree and another checkout.

    python perf/ab_fanout.py /tmp/base [--streams 5000] [--rounds 3] [--callgrind]

Each tree's own server runs in a fresh process: ``perf/_http_apps.ordinary_app`` (the app of
``bench_http_scale``: the middleware with its four lookups) on a real asyncio loop and real loopback TCP
sockets, holding ``--streams`` chunked streams (the share of one of ``bench_http_scale``'s 2 workers: each
stream on ``/bcast`` and one of 1,000 chat rooms). It publishes broadcasts into the bus one at a time and waits
until every stream was written; the clients are read between broadcasts, outside the measured time, and every
delivery is checked (exactly one per stream and broadcast). Figures, each the best of the process's rounds:

* CPU per delivery of the loop thread (``time.thread_time``: the registry's work, the writes and their
  ``send`` calls, kernel time included) and of the whole process (the bus listener thread too);
* the server's 1 s clock (``Server._tick``) per held stream;
* a chat message to the streams of one room (5 at 5,000 streams), published into the bus every 10 ms, per
  message (the CPU of as many 10 ms sleeps without a message subtracted);
* the two as ``bench_http_scale`` at 10,000 streams mixes them in one worker: 5,000 broadcast deliveries and 50
  chat messages a second (the publish route's requests are not in it).

The table shows the medians over rounds and their ratio (this / other); rounds alternate which tree goes first.
CPU seconds survive a loaded machine better than latencies, but not entirely (caches, frequency):
``--callgrind`` also counts the user-space instructions per delivery under valgrind (a run of 12 broadcasts
minus one of 2, at 1,000 streams; the kernel's part of ``send`` is not counted there).

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
import asyncio, json, os, socket, sys, time, uuid
tree, streams, rounds, broadcasts = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
sys.path.insert(0, tree + "/perf")
os.environ["SHMBUS_LOAD_BUS"] = "abfanout" + uuid.uuid4().hex[:8]
os.environ["SHMBUS_LOAD_OPTS"] = json.dumps({"max_active_clients": streams + 100, "long_polling_interval": 3600})
import resource
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
import _http_apps
from shmbus.adapters.server import Server
from shmbus.adapters.server.serve import connection_factory

ROOMS = 1000

def request(i):
    body = b"%%2Fbcast=-1&%%2Fchat%%2F%d=-1&__seq=1" % (i % ROOMS)
    head = b"POST /message-bus/c%dx%d/poll HTTP/1.1\r\nHost: 127.0.0.1\r\n" % (i, i)
    return head + b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)

def drain(socks):
    got = []
    for s in socks:
        data = b""
        while True:
            try:
                chunk = s.recv(1 << 16)
            except BlockingIOError:
                break
            if not chunk:
                raise ConnectionError("a stream closed")
            data += chunk
        got.append(data)
    return got

async def main():
    app = _http_apps.ordinary_app
    bus = _http_apps._bus()
    loop = asyncio.get_running_loop()
    srv = Server(app, loop)
    await srv.startup()
    server = await loop.create_server(connection_factory(srv), "127.0.0.1", 0, backlog=4096)
    port = server.sockets[0].getsockname()[1]
    reg = srv.proto.registry
    socks = []
    for first in range(0, streams, 500):
        batch = []
        for i in range(first, min(streams, first + 500)):
            s = socket.socket()
            s.setblocking(False)
            batch.append(s)
        await asyncio.gather(*(loop.sock_connect(s, ("127.0.0.1", port)) for s in batch))
        for i, s in enumerate(batch, first):
            s.send(request(i))
        socks += batch
        while reg.streams < len(socks):
            await asyncio.sleep(0.01)
    drain(socks)
    eng = app._fanout()
    done = []
    finished = eng._finished
    def spy(started, stamp, kind):
        finished(started, stamp, kind)
        if done and not done[-1].done():
            done[-1].set_result(kind)
    eng._finished = spy
    async def one(channel, data):
        done.append(loop.create_future())
        bus.publish(channel, data, site_id=_http_apps.SITE)
        await done[-1]
    out = {}
    thread, proc, ticks, chats = [], [], [], []
    n = 0
    for r in range(rounds):
        t0, p0 = time.thread_time(), time.process_time()
        for b in range(broadcasts):
            n += 1
            await one("/bcast", "@B%d;" % n)
        t1, p1 = time.thread_time(), time.process_time()
        got = drain(socks)
        bad = sum(g.count(b"@B") != broadcasts for g in got)
        assert not bad, f"{bad} streams did not get each broadcast once"
        thread.append((t1 - t0) / (broadcasts * streams) * 1e6)
        proc.append((p1 - p0) / (broadcasts * streams) * 1e6)
        t0 = time.thread_time()
        for _ in range(10):
            srv._tick()
        ticks.append((time.thread_time() - t0) / 10 / streams * 1e6)
        idle = time.process_time()
        for k in range(100):
            await asyncio.sleep(0.01)
        idle = time.process_time() - idle
        t0 = time.process_time()
        for k in range(100):
            await asyncio.sleep(0.01)  # paced as bench_http_scale's chat (a message every 20 ms to 2 workers)
            await one("/chat/%d" % k, "@C%d;" % k)
        chats.append((time.process_time() - t0 - idle) / 100 * 1e6)
        got = drain(socks)
        want = sum(1 for i in range(streams) if i % ROOMS < 100)
        assert sum(g.count(b"@C") for g in got) == want, "chat deliveries"
    out["broadcast: loop thread CPU per delivery, us"] = min(thread)
    out["broadcast: process CPU per delivery, us"] = min(proc)
    out["1 s clock (Server._tick) per held stream, us"] = min(ticks)
    out["chat message to one room's streams (process CPU), us"] = min(chats)
    # bench_http_scale at 10,000 streams, one of its 2 workers: 5,000 broadcast deliveries and 50 chat messages
    # (to 5 streams each) a second
    mix = (5000 * min(proc) + 50 * min(chats)) / (5000 + 50 * 5)
    out["bench_http_scale's mix (1 broadcast + 50 chats/s), us per delivery"] = mix
    for s in socks:
        s.close()
    server.close()
    app.close()
    print(json.dumps(out))

try:
    asyncio.run(main())
finally:
    if "bus" in _http_apps._mb:
        _http_apps._mb["bus"].destroy()
"""


def run(tree: Path, streams: int, rounds: int, broadcasts: int) -> dict[str, float]:
    argv = [python_of(tree), "-c", CHILD, str(tree), str(streams), str(rounds), str(broadcasts)]
    done = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=tree)
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def instructions(tree: Path, broadcasts: int) -> int:
    return callgrind_instructions([python_of(tree), "-c", CHILD, str(tree), "1000", "1", str(broadcasts)], tree)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("other", type=Path, help="the other checkout (with its own .venv, or importable here)")
    p.add_argument("--streams", type=int, default=5000, help="streams held by the one server (default 5,000)")
    p.add_argument("--rounds", type=int, default=3, help="fresh processes per tree")
    p.add_argument("--broadcasts", type=int, default=10, help="broadcasts per measured round")
    p.add_argument("--callgrind", action="store_true", help="also count instructions per delivery under valgrind")
    args = p.parse_args()
    this, other = paired(args.rounds, HERE, args.other.resolve(), lambda t: run(t, args.streams, 3, args.broadcasts))
    print_medians(this, other, 56, "8.2f", "10.2f")
    if args.callgrind:
        a, b = ((instructions(t, 12) - instructions(t, 2)) / 10 / 1000 for t in (args.other.resolve(), HERE))
        print(f"{'broadcast: instructions per delivery (callgrind, user)':56s} {a:8.0f} {b:8.0f}  {b / a:10.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
