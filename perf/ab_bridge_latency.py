#!/usr/bin/env python3
"""Paired A/B of a bridge's cross-host latency between this tree and another checkout, message by message.

    python perf/ab_bridge_latency.py /tmp/base [--backend redis|postgres] [--n 1500] [--rounds 2]

The other checkout needs its own ``.venv`` (``git worktree add /tmp/base <commit>``, then ``python3 -m venv
/tmp/base/.venv && /tmp/base/.venv/bin/pip install -e '/tmp/base[redis,postgres]'``).

Why paired: on a shared machine the whole machine's speed drifts by 15-20% between runs minutes apart, more than the
difference to measure, so two benchmark runs one after the other compare the machine, not the code. Here both trees
run side by side, each with its own Redis server (or PostgreSQL schema), a publishing process (host A, with its
relay) and a subscribing process (host B: its relay and a callback), all in that tree's interpreter. The driver tells
one tree's publisher to publish one message (stamped inside the publisher just before ``bus.publish``), waits until
that tree's subscriber got it, sleeps 1-3 ms (the wake-up path, as in ``bench_*_bridge``), then does the same for the
other tree, in a random order per message: only one system runs at a time and machine drift hits both alike. Every
process sleeps between messages, so each step runs with cold caches, as the wake-up path does in production.

Prints per round each tree's p50/p99 and the publisher's CPU per publish, and the ratio of the p50s (this tree /
the other). Not part of ``perf/run``: it needs a second checkout.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_ENGINE = r"""
import sys, time
from shmbus import Bus
kind, name, url, notify = sys.argv[1:5]
if kind == "redis":
    from shmbus.adapters.redis import RedisBridge
    engine = RedisBridge(url, election_interval=0.05)
else:
    from shmbus.adapters.postgres import PostgresBridge
    engine = PostgresBridge(url, election_interval=0.05, notify_channel=notify)
bus = Bus(name, keepalive_interval=0, create=True, engine=engine)
"""

_WAIT_RELAYING = r"""
while bus.default.health()["relay_state"] != "relaying":
    time.sleep(0.01)
print("READY", flush=True)
"""

PUBLISHER = (
    _ENGINE
    + _WAIT_RELAYING
    + r"""
pad, cpu = "x" * 60, 0.0
for line in sys.stdin:
    if line.startswith("go"):
        t = time.thread_time()
        bus.publish("/ab", {"t": time.perf_counter_ns(), "i": int(line.split()[1]), "pad": pad})
        cpu += time.thread_time() - t
    elif line.startswith("cpu"):
        print(cpu, flush=True)
        cpu = 0.0
bus.destroy()
"""
)

SUBSCRIBER = (
    _ENGINE
    + r"""
import json
lat = {}
def on_message(m):
    lat[m.data["i"]] = (time.perf_counter_ns() - m.data["t"]) / 1000
    sys.stdout.write("got %d\n" % m.data["i"])
    sys.stdout.flush()
bus.subscribe("/ab", on_message)
"""
    + _WAIT_RELAYING
    + r"""
for line in sys.stdin:
    if line.startswith("dump"):
        print(json.dumps(list(lat.values())), flush=True)
        lat.clear()
bus.destroy()
"""
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Side:
    """One tree's two hosts on their own backend."""

    def __init__(self, python: str, cwd: Path, backend: str, tag: str, cleanup: list[Callable[[], Any]]) -> None:
        notify = f"{tag}_n"
        if backend == "redis":
            port, data = _free_port(), tempfile.mkdtemp(prefix="shmbus-ab-")
            server = subprocess.Popen(
                ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", data],
                stdout=subprocess.DEVNULL,
            )
            cleanup.append(lambda: (server.kill(), server.wait(), shutil.rmtree(data, ignore_errors=True)))
            url = f"redis://127.0.0.1:{port}/0"
            time.sleep(0.3)
        else:
            import psycopg

            base = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
            admin = psycopg.connect(base, autocommit=True)
            admin.execute(f"CREATE SCHEMA {tag}")
            cleanup.append(lambda: (admin.execute(f"DROP SCHEMA {tag} CASCADE"), admin.close()))
            url = psycopg.conninfo.make_conninfo(base, options=f"-c search_path={tag}")
        self.procs = []
        for code, host in ((SUBSCRIBER, "b"), (PUBLISHER, "a")):
            p = subprocess.Popen(
                [python, "-c", code, backend, f"{tag}{host}", url, notify],
                cwd=cwd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            self.procs.append(p)
            cleanup.append(lambda p=p: _stop(p))
        self.sub, self.pub = self.procs
        for p in self.procs:
            if p.stdout is None or p.stdout.readline().strip() != "READY":
                raise RuntimeError(f"{python}: a host did not start")

    def send(self, line: str) -> None:
        assert self.pub.stdin is not None
        self.pub.stdin.write(line + "\n")
        self.pub.stdin.flush()

    def received(self, i: int) -> None:
        assert self.sub.stdout is not None
        while True:
            got = self.sub.stdout.readline()
            if not got:
                raise RuntimeError("the subscriber exited")
            if got.split()[1] == str(i):
                return

    def results(self, count: int) -> tuple[list[float], float]:
        assert self.sub.stdin is not None and self.sub.stdout is not None and self.pub.stdout is not None
        self.sub.stdin.write("dump\n")
        self.sub.stdin.flush()
        lat = sorted(json.loads(self.sub.stdout.readline()))
        self.send("cpu")
        return lat, float(self.pub.stdout.readline()) / count * 1e6


def _stop(p: subprocess.Popen[str]) -> None:
    try:
        if p.stdin is not None:
            p.stdin.close()
        p.wait(10)
    except Exception:
        p.kill()


def run_round(trees: dict[str, tuple[str, Path]], backend: str, n: int, round_no: int) -> dict[str, Any]:
    cleanup: list[Callable[[], Any]] = []
    try:
        sides = {
            name: Side(py, cwd, backend, f"ab{os.getpid()}_{round_no}_{k}", cleanup)
            for k, (name, (py, cwd)) in enumerate(trees.items())
        }
        out: dict[str, Any] = {}
        for count in (200, n):  # a warm-up, then the measured messages
            for i in range(count):
                order = list(sides.values())
                random.shuffle(order)
                for side in order:
                    side.send(f"go {i}")
                    side.received(i)
                    time.sleep(random.uniform(0.001, 0.003))
            for name, side in sides.items():
                lat, cpu = side.results(count)
                out[name] = {
                    "p50": statistics.median(lat),
                    "p99": lat[max(0, int(len(lat) * 0.99) - 1)],
                    "publisher_cpu": cpu,
                    "n": len(lat),
                }
        return out
    finally:
        for step in reversed(cleanup):
            try:
                step()
            except Exception:
                pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("other", type=Path, help="the other checkout (with its own .venv)")
    ap.add_argument("--backend", choices=["redis", "postgres"], default="redis")
    ap.add_argument("--n", type=int, default=1500, help="messages per tree per round")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    other_python = args.other / ".venv" / "bin" / "python"
    if not other_python.exists():
        sys.exit(f"{other_python} is missing: give the other checkout its own .venv (see the module doc)")
    here = Path(__file__).resolve().parent.parent
    trees = {"this": (sys.executable, here), "other": (str(other_python), args.other.resolve())}
    ratios = []
    for r in range(args.rounds):
        res = run_round(trees, args.backend, args.n, r)
        ratio = res["this"]["p50"] / res["other"]["p50"]
        ratios.append(ratio)
        for name in trees:
            f = res[name]
            print(
                f"round {r + 1} {name:5}: p50 {f['p50']:7.1f} µs  p99 {f['p99']:7.1f} µs  "
                f"publisher CPU {f['publisher_cpu']:6.1f} µs/publish  ({f['n']} messages)"
            )
        print(f"round {r + 1} p50 this/other: {ratio:.3f}", flush=True)
    print(f"{args.backend}: cross-host p50 this/other, median of {len(ratios)} rounds: {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
