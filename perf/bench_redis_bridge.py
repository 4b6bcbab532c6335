#!/usr/bin/env python3
"""Redis bridge: publish rate, cross-host latency and Redis commands per read, vs redis-py in the same run.

Two "hosts" (two segments) bridged to one private redis-server. A helper process is the relay of both hosts (with
``--split-relays`` one helper per host, as on two machines) and holds host B's subscriber; this process publishes on
host A with ``relay=False`` (so its figures are a publishing worker's, not a relay's). Baselines, measured
interleaved: redis-py PUBLISH (sync and pipelined x100) and redis-py pub/sub latency between the same two processes.
Redis commands per long-poll read come from ``INFO commandstats`` deltas (target 0 when the segment has the data;
the gem's Redis backend needs >= 2).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import tempfile
import time
from typing import Any

import _common as c
import redis

from shmbus import Bus
from shmbus.adapters.redis import RedisBridge

QUICK_TIMEOUT = 120
FULL_TIMEOUT = 900
CHANNEL = "/bench/bridge"

HELPER = r"""
import json, os, sys, threading, time
import redis
from shmbus import Bus
from shmbus.adapters.redis import RedisBridge
name_a, name_b, url, channel, hosts = sys.argv[1:6]
lat = []
def on_msg(m):
    lat.append((time.perf_counter_ns() - m.data["t"]) / 1000.0)
buses = [Bus(n, keepalive_interval=0, create=True, engine=RedisBridge(url, election_interval=0.05))
         for n, h in ((name_a, "a"), (name_b, "b")) if h in hosts]
if "b" in hosts:
    buses[-1].subscribe(channel, on_msg)
    ps = redis.Redis.from_url(url, protocol=2).pubsub(ignore_subscribe_messages=True)
    ps.subscribe("baseline")
    def pump():
        for m in ps.listen():
            t = json.loads(m["data"])["t"]
            lat.append((time.perf_counter_ns() - t) / 1000.0)
    threading.Thread(target=pump, daemon=True).start()
while any(x.default.health()["relay_state"] != "relaying" for x in buses):
    time.sleep(0.01)
print("READY", flush=True)
for line in sys.stdin:
    if line.strip() == "dump":
        print(json.dumps(lat), flush=True)
        lat.clear()
for x in buses:
    x.close()
"""


class PrivateRedis:
    """A throw-away redis-server on a free port (clean commandstats, no other users of the gem's keys)."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            c.skip("no redis-server on PATH")
        self.dir = tempfile.mkdtemp(prefix="shmbus-bench-redis-")
        self.port = c._free_port()
        self.proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self.dir,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.url = f"redis://127.0.0.1:{self.port}/0"
        deadline = time.monotonic() + 10
        while not c._ping("127.0.0.1", self.port):
            if time.monotonic() > deadline:
                self.close()
                raise RuntimeError("redis-server did not start")
            time.sleep(0.05)

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


def _payload(i: int) -> dict[str, Any]:
    return {"t": time.perf_counter_ns(), "i": i, "pad": "x" * 60}


def bridge_sync(bus: Bus, n: int) -> None:
    for i in range(n):
        bus.publish(CHANNEL + "/rate", _payload(i))


def bridge_batch(bus: Bus, n: int) -> None:
    bridge: Any = bus.default
    for start in range(0, n, 100):
        bridge.publish_many(bus, [(CHANNEL + "/rate", _payload(i)) for i in range(start, start + 100)])


def redis_sync(r: redis.Redis, n: int) -> None:
    for i in range(n):
        r.publish("baseline-rate", json.dumps(_payload(i)))


def redis_batch(r: redis.Redis, n: int) -> None:
    for start in range(0, n, 100):
        p = r.pipeline(transaction=False)
        for i in range(start, start + 100):
            p.publish("baseline-rate", json.dumps(_payload(i)))
        p.execute()


def latency(helper: subprocess.Popen[str], send: Any, n: int) -> list[float]:
    """Messages at random 1-3 ms intervals (the wake-up path); returns the helper's latencies in µs."""
    for i in range(n):
        send(i)
        time.sleep(random.uniform(0.001, 0.003))
    time.sleep(0.2)
    assert helper.stdin is not None and helper.stdout is not None
    helper.stdin.write("dump\n")
    helper.stdin.flush()
    return sorted(json.loads(helper.stdout.readline()))


def commands(r: redis.Redis) -> int:
    stats: dict[str, Any] = r.info("commandstats")  # type: ignore[assignment]
    return sum(int(v["calls"]) for k, v in stats.items() if k not in ("cmdstat_info", "cmdstat_ping"))


def main() -> None:
    args = c.parse_args(__doc__, extra=c.split_option)
    rep = c.Report("bench_redis_bridge", "Redis bridge vs redis-py, same run, private redis-server", args)
    repeats = args.repeats or (1 if args.quick else 3)
    n_sync, n_batch, n_lat = (2000, 20000, 300) if args.quick else (10000, 100000, 2000)
    srv = PrivateRedis()
    name_a, name_b = c.unique_name("bench-bridge-a"), c.unique_name("bench-bridge-b")
    helpers: list[subprocess.Popen[str]] = []
    buses: list[Bus] = []
    try:
        helpers = c.start_helpers(HELPER, [name_a, name_b, srv.url, CHANNEL], args.split_relays)
        helper = helpers[-1]
        a = Bus(name_a, keepalive_interval=0, engine=RedisBridge(srv.url, relay=False), create=True)
        b = Bus(name_b, keepalive_interval=0, engine=RedisBridge(srv.url, relay=False), create=True)
        buses += [a, b]
        r = redis.Redis.from_url(srv.url, protocol=2)
        rows: dict[str, list[float]] = {k: [] for k in ("bs", "bb", "rs", "rb")}
        lat: dict[str, list[float]] = {"p50": [], "p99": [], "rp50": [], "rp99": []}
        for rep_i in range(repeats):
            rep.log(f"repeat {rep_i + 1}/{repeats}")
            rows["rs"].append(c.rate(lambda n: redis_sync(r, n), n_sync))
            rows["bs"].append(c.rate(lambda n: bridge_sync(a, n), n_sync))
            rows["rb"].append(c.rate(lambda n: redis_batch(r, n), n_batch))
            rows["bb"].append(c.rate(lambda n: bridge_batch(a, n), n_batch))
            got = latency(helper, lambda i: a.publish(CHANNEL, _payload(i)), n_lat)
            lat["p50"].append(c.percentile(got, 50))
            lat["p99"].append(c.percentile(got, 99))
            got = latency(helper, lambda i: r.publish("baseline", json.dumps(_payload(i))), n_lat)
            lat["rp50"].append(c.percentile(got, 50))
            lat["rp99"].append(c.percentile(got, 99))
        rep.add("redis-py PUBLISH sync", rows["rs"], "msgs/s")
        rep.add("redis-py PUBLISH pipelined x100", rows["rb"], "msgs/s")
        rep.add(
            "bridge publish sync",
            rows["bs"],
            "msgs/s",
            baselines=["redis-py PUBLISH sync"],
            note="EVALSHA: ids + both backlogs + PUBLISH, then stored locally",
        )
        rep.add("bridge publish_many x100", rows["bb"], "msgs/s", baselines=["redis-py PUBLISH pipelined x100"])
        rep.published("gem + Redis publish", 12000, "msgs/s", "brief of issue 4 (message_bus with Redis here)")
        rep.add("redis-py pub/sub latency p50", lat["rp50"], "µs", higher_is_better=False)
        rep.add("redis-py pub/sub latency p99", lat["rp99"], "µs", higher_is_better=False)
        rep.add(
            "cross-host latency p50",
            lat["p50"],
            "µs",
            higher_is_better=False,
            baselines=["redis-py pub/sub latency p50"],
            note="publish on A -> relay -> B's segment -> callback",
        )
        rep.add(
            "cross-host latency p99",
            lat["p99"],
            "µs",
            higher_is_better=False,
            baselines=["redis-py pub/sub latency p99"],
        )
        # Redis commands per long-poll read on host B (segment has the data) and per backlog read
        last = b.last_id(CHANNEL)
        reads = 200 if args.quick else 2000
        before = commands(r)
        for _ in range(reads):
            b.last_ids(CHANNEL, CHANNEL + "/rate")
            b.backlog(CHANNEL, max(last - 5, 0))
        per_read = (commands(r) - before) / reads
        rep.add(
            "Redis commands per long-poll read (B)",
            [per_read],
            "cmds",
            higher_is_better=False,
            note="last_ids + backlog of the last 5, served from the segment",
        )
        rep.target("Redis commands per read when the segment has the data", per_read, 0, at_least=False)
        rep.target(
            "bridge publish_many msgs/s >= 2x the gem's 12k", rows and sorted(rows["bb"])[len(rows["bb"]) // 2], 24000
        )
        rep.note(
            "gem's Redis backend per long poll: 1 MGET (last_ids) + 1 ZRANGEBYSCORE per channel with news "
            "(its Redis backend's poll path), i.e. >= 1-2 commands per poll; shmbus: 0"
        )
        rep.note(
            "relays: one process per host (--split-relays)"
            if args.split_relays
            else "relays: both hosts' in one helper process (--split-relays: one per host)"
        )
        rep.note(
            "figures are for a publishing worker; the relay (helper process) shares the 2 vCPUs with it, "
            "with Redis and with the publisher"
        )
    finally:
        c.stop_helpers(helpers)
        for bus in buses:
            bus.destroy()
        for name in (name_a, name_b):
            Bus(name, create=True).destroy()
        srv.close()
    rep.emit()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
