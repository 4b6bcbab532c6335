#!/usr/bin/env python3
"""PostgreSQL bridge: publish rate (single from one thread and from concurrent worker processes, and batched),
cross-host latency and database queries per read, vs psycopg in the same run.

Two "hosts" (two segments) bridged to one table in a throw-away schema of the machine's PostgreSQL
(``DATABASE_URL``, else ``postgresql://postgres@127.0.0.1:5432/test``). A helper process is the relay of both hosts
(with ``--split-relays`` one helper per host, as on two machines) and holds host B's subscriber; this process
publishes on host A with ``relay=False`` (a publishing worker's figures); the concurrent figures come from 4 worker
processes publishing on host A at once (as web workers would), started together. Baselines, interleaved: psycopg
``INSERT ... RETURNING id`` in a loop on a bare table (no secondary index, no CHECK, no notice: one round trip per
row) and, fairer, on a copy of the gem's table (its CHECK and both indexes) with the row's ``pg_notify`` in the same
statement (a listener in the helper wakes for each, as the relays do for the bridge's), each from one thread and
from 4 processes; the bare insert as one ``INSERT ... SELECT FROM unnest(...) RETURNING id`` per 100 rows; and
psycopg LISTEN/NOTIFY latency between the same two processes. Queries per read are counted on the bridge's own
connection getter (every statement it runs goes through it): the target is 0 when the segment has the data. The
gem's trims run in the relay (helper process) once a second, as the bridge does by default.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from typing import Any

import _common as c

try:
    import psycopg
except ImportError:  # the postgres extra
    psycopg = None

from shmbus import Bus

QUICK_TIMEOUT = 180
FULL_TIMEOUT = 900
CHANNEL = "/bench/pg"
DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"

HELPER = r"""
import json, sys, threading, time
import psycopg
from shmbus import Bus
from shmbus.adapters.postgres import PostgresBridge
name_a, name_b, dsn, notify, channel, hosts = sys.argv[1:7]
lat = []
def on_msg(m):
    lat.append((time.perf_counter_ns() - m.data["t"]) / 1000.0)
buses = [Bus(n, keepalive_interval=0, create=True,
             engine=PostgresBridge(dsn, notify_channel=notify, election_interval=0.05))
         for n, h in ((name_a, "a"), (name_b, "b")) if h in hosts]
while any(x.default.health()["relay_state"] != "relaying" for x in buses):
    time.sleep(0.01)
if "b" not in hosts:
    print("READY", flush=True)
    for line in sys.stdin:
        if line.strip() == "dump":
            print("[]", flush=True)
    for x in buses:
        x.close()
    sys.exit(0)
buses[-1].subscribe(channel, on_msg)
listen = psycopg.connect(dsn, autocommit=True)
listen.execute("LISTEN bench_baseline")
def pump():
    while True:
        for n in listen.notifies(timeout=1.0, stop_after=1):
            lat.append((time.perf_counter_ns() - json.loads(n.payload)["t"]) / 1000.0)
threading.Thread(target=pump, daemon=True).start()
fair = psycopg.connect(dsn, autocommit=True)  # the fair baseline's notices wake a listener, as the relays wake
fair.execute("LISTEN bench_fair")
def drain():
    while True:
        for n in fair.notifies(timeout=1.0):
            pass
threading.Thread(target=drain, daemon=True).start()
print("READY", flush=True)
for line in sys.stdin:
    if line.strip() == "dump":
        time.sleep(0.05)
        print(json.dumps(lat), flush=True)
        lat.clear()
for x in buses:
    x.close()
"""


# One of several publishing processes: ``mode`` (bridge | fair | bare | proc), then READY; on "go" it publishes ``n``
# messages and prints its start and end (CLOCK_MONOTONIC, one clock for every process).
WORKER = r"""
import json, sys, time
import psycopg
from shmbus import Bus
from shmbus.adapters.postgres import PostgresBridge
mode, dsn, notify, name, n = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
pad = "x" * 60
if mode == "bridge":
    bus = Bus(name, keepalive_interval=0, create=True, engine=PostgresBridge(dsn, notify_channel=notify, relay=False))
    bus.publish("/bench/pg/warm", 0)
    def one(i):
        bus.publish("/bench/pg/rate", {"t": time.perf_counter_ns(), "i": i, "pad": pad})
else:
    conn = psycopg.connect(dsn, autocommit=True)
    query = {"fair": FAIR, "bare": BARE, "proc": PROC}[mode]
    def one(i):
        value = json.dumps({"data": {"t": time.perf_counter_ns(), "i": i, "pad": pad}})
        args = {"bare": ("/rate", value), "fair": ("/rate", value, value), "proc": ("/rate", value)}[mode]
        conn.execute(query, args, prepare=True).fetchone()
    one(0)
print("READY", flush=True)
sys.stdin.readline()
t0 = time.monotonic()
for i in range(n):
    one(i)
print(json.dumps([t0, time.monotonic()]), flush=True)
sys.stdin.readline()
"""

BARE = "INSERT INTO baseline (channel, value) VALUES (%s, %s) RETURNING id"
# The gem's table (a copy: its CHECK and both indexes) and the gem's line as the notice, in one statement.
FAIR = (
    "WITH r AS (INSERT INTO baseline_gem (channel, value) VALUES (%s, %s) RETURNING id) "
    "SELECT id, pg_notify('bench_fair', id || '|' || id || '|/rate|' || %s) FROM r"
)
# The bridge's publish procedure called straight from psycopg, its notices on the fair baseline's channel (one
# listener, no relay): what the server does for a bridge publish, without the bridge's Python or the relays.
PROC = "CALL shmbus_send(%s, %s, 'bench_fair', '/rate')"
WORKERS = 4


def concurrent(mode: str, dsn: str, notify: str, name: str, per_worker: int) -> float:
    """Aggregate msgs/s of WORKERS processes publishing ``per_worker`` messages each, started together."""
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                f"BARE = {BARE!r}\nFAIR = {FAIR!r}\nPROC = {PROC!r}\n" + WORKER,
                mode,
                dsn,
                notify,
                name,
                str(per_worker),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(WORKERS)
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "READY", "bench worker did not start"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        spans = [json.loads(p.stdout.readline()) for p in procs if p.stdout is not None]
    finally:
        c.stop_helpers(procs, timeout=30)
    return WORKERS * per_worker / (max(e for _, e in spans) - min(b for b, _ in spans))


def _payload(i: int) -> dict[str, Any]:
    return {"t": time.perf_counter_ns(), "i": i, "pad": "x" * 60}


def bridge_sync(bus: Bus, n: int) -> None:
    for i in range(n):
        bus.publish(CHANNEL + "/rate", _payload(i))


def bridge_batch(bus: Bus, n: int) -> None:
    bridge: Any = bus.default
    for start in range(0, n, 100):
        bridge.publish_many(bus, [(CHANNEL + "/rate", _payload(i)) for i in range(start, start + 100)])


def pg_sync(conn: Any, n: int) -> None:
    for i in range(n):
        conn.execute(
            "INSERT INTO baseline (channel, value) VALUES (%s, %s) RETURNING id",
            ("/rate", json.dumps({"data": _payload(i)})),
            prepare=True,
        ).fetchone()


def pg_fair(conn: Any, n: int) -> None:
    for i in range(n):
        value = json.dumps({"data": _payload(i)})
        conn.execute(FAIR, ("/rate", value, value), prepare=True).fetchone()


def pg_proc(conn: Any, n: int) -> None:
    for i in range(n):
        conn.execute(PROC, ("/rate", json.dumps({"data": _payload(i)})), prepare=True).fetchone()


def pg_batch(conn: Any, n: int) -> None:
    for start in range(0, n, 100):
        values = [json.dumps({"data": _payload(i)}) for i in range(start, start + 100)]
        conn.execute(
            "INSERT INTO baseline (channel, value) SELECT '/rate', v FROM unnest(%s::text[]) AS v RETURNING id",
            (values,),
            prepare=True,
        ).fetchall()


def latency(helper: subprocess.Popen[str], send: Any, n: int) -> list[float]:
    """Messages at random 1-3 ms intervals; returns the helper's latencies in µs."""
    for i in range(n):
        send(i)
        time.sleep(random.uniform(0.001, 0.003))
    time.sleep(0.3)
    assert helper.stdin is not None and helper.stdout is not None
    helper.stdin.write("dump\n")
    helper.stdin.flush()
    return sorted(json.loads(helper.stdout.readline()))


def main() -> None:
    args = c.parse_args(__doc__, extra=c.split_option)
    if psycopg is None:
        c.skip("psycopg is not installed (pip install 'shmbus[postgres]')")
    from shmbus.adapters.postgres import PostgresBridge

    rep = c.Report("bench_postgres_bridge", "PostgreSQL bridge vs psycopg, same run", args)
    repeats = args.repeats or (1 if args.quick else 3)
    n_sync, n_batch, n_lat = (1000, 10000, 200) if args.quick else (5000, 50000, 1000)
    n_worker = n_sync // WORKERS * 2  # per worker process: 2x the single-thread count in all
    url = os.environ.get("DATABASE_URL") or DEFAULT_URL
    try:
        admin = psycopg.connect(url, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        c.skip(f"no PostgreSQL at {url}: {exc}")
    schema = c.unique_name("bench_pg").replace("-", "_").lower()
    admin.execute(f"CREATE SCHEMA {schema}")
    dsn = psycopg.conninfo.make_conninfo(url, options=f"-c search_path={schema}")
    notify = f"_mb_{schema}"
    name_a, name_b = c.unique_name("bench-pg-a"), c.unique_name("bench-pg-b")
    helpers: list[subprocess.Popen[str]] = []
    buses: list[Bus] = []
    try:
        helpers = c.start_helpers(HELPER, [name_a, name_b, dsn, notify, CHANNEL], args.split_relays)
        helper = helpers[-1]
        a = Bus(
            name_a, keepalive_interval=0, engine=PostgresBridge(dsn, notify_channel=notify, relay=False), create=True
        )
        b = Bus(
            name_b, keepalive_interval=0, engine=PostgresBridge(dsn, notify_channel=notify, relay=False), create=True
        )

        def host(tag: str, **options: Any) -> Bus:
            return Bus(
                c.unique_name(f"bench-pg-{tag}"),
                keepalive_interval=0,
                engine=PostgresBridge(dsn, notify_channel=notify, relay=False, **options),
                create=True,
            )

        fast = host("f", synchronous_commit=False)
        buses += [a, b, fast]
        conn = psycopg.connect(dsn, autocommit=True)
        conn.execute(
            "CREATE TABLE baseline (id bigserial PRIMARY KEY, channel text NOT NULL, value text NOT NULL, "
            "added_at timestamp DEFAULT CURRENT_TIMESTAMP NOT NULL)"
        )
        conn.execute(
            "CREATE TABLE baseline_gem (id bigserial PRIMARY KEY, channel text NOT NULL, value text NOT NULL "
            "CHECK (octet_length(value) >= 2), added_at timestamp DEFAULT CURRENT_TIMESTAMP NOT NULL)"
        )
        conn.execute("CREATE INDEX baseline_gem_channel_id ON baseline_gem (channel, id)")
        conn.execute("CREATE INDEX baseline_gem_added_at ON baseline_gem (added_at)")
        rows: dict[str, list[float]] = {
            k: [] for k in ("bs", "bb", "ps", "pb", "fs", "pf", "cb", "cf", "cp", "pp", "cpp")
        }
        lat: dict[str, list[float]] = {"p50": [], "p99": [], "np50": [], "np99": []}
        for rep_i in range(repeats):
            rep.log(f"repeat {rep_i + 1}/{repeats}")
            rows["ps"].append(c.rate(lambda n: pg_sync(conn, n), n_sync))
            rows["pf"].append(c.rate(lambda n: pg_fair(conn, n), n_sync))
            rows["pp"].append(c.rate(lambda n: pg_proc(conn, n), n_sync))
            rows["bs"].append(c.rate(lambda n: bridge_sync(a, n), n_sync))
            rows["cp"].append(concurrent("bare", dsn, notify, name_a, n_worker))
            rows["cf"].append(concurrent("fair", dsn, notify, name_a, n_worker))
            rows["cpp"].append(concurrent("proc", dsn, notify, name_a, n_worker))
            rows["cb"].append(concurrent("bridge", dsn, notify, name_a, n_worker))
            rows["fs"].append(c.rate(lambda n: bridge_sync(fast, n), n_sync))
            rows["pb"].append(c.rate(lambda n: pg_batch(conn, n), n_batch))
            rows["bb"].append(c.rate(lambda n: bridge_batch(a, n), n_batch))
            got = latency(helper, lambda i: a.publish(CHANNEL, _payload(i)), n_lat)
            lat["p50"].append(c.percentile(got, 50))
            lat["p99"].append(c.percentile(got, 99))
            got = latency(
                helper,
                lambda i: conn.execute("SELECT pg_notify('bench_baseline', %s)", (json.dumps(_payload(i)),)),
                n_lat,
            )
            lat["np50"].append(c.percentile(got, 50))
            lat["np99"].append(c.percentile(got, 99))
        rep.add("psycopg INSERT RETURNING loop", rows["ps"], "msgs/s", note="bare table: no index, CHECK or notice")
        rep.add(
            "psycopg INSERT+NOTIFY loop, gem table",
            rows["pf"],
            "msgs/s",
            note="the gem's table (CHECK, both indexes), the row's pg_notify in the same statement",
        )
        rep.add(f"psycopg INSERT RETURNING, {WORKERS} processes", rows["cp"], "msgs/s", note="bare table, aggregate")
        rep.add(f"psycopg INSERT+NOTIFY, gem table, {WORKERS} processes", rows["cf"], "msgs/s", note="aggregate")
        rep.add(
            "psycopg CALL shmbus_send loop",
            rows["pp"],
            "msgs/s",
            baselines=["psycopg INSERT+NOTIFY loop, gem table"],
            note="the bridge's procedure without the bridge: its notices wake one listener, no relay",
        )
        rep.add(
            f"psycopg CALL shmbus_send, {WORKERS} processes",
            rows["cpp"],
            "msgs/s",
            baselines=[f"psycopg INSERT+NOTIFY, gem table, {WORKERS} processes"],
            note="aggregate",
        )
        rep.add("psycopg INSERT RETURNING x100 (unnest)", rows["pb"], "msgs/s")
        rep.add(
            "bridge publish",
            rows["bs"],
            "msgs/s",
            baselines=["psycopg INSERT RETURNING loop", "psycopg INSERT+NOTIFY loop, gem table"],
            note="one procedure call (insert, commit, pg_notify), then stored locally; trims run in the relay",
        )
        rep.add(
            f"bridge publish, {WORKERS} processes",
            rows["cb"],
            "msgs/s",
            baselines=[
                f"psycopg INSERT RETURNING, {WORKERS} processes",
                f"psycopg INSERT+NOTIFY, gem table, {WORKERS} processes",
            ],
            note="aggregate of 4 publishing processes on host A (web workers), single publishes",
        )
        rep.add(
            "bridge publish, synchronous_commit=False",
            rows["fs"],
            "msgs/s",
            baselines=["psycopg INSERT RETURNING loop"],
            note="and the commit does not wait for the WAL flush (the baseline's does)",
        )
        rep.add("bridge publish_many x100", rows["bb"], "msgs/s", baselines=["psycopg INSERT RETURNING x100 (unnest)"])
        rep.published("gem + PostgreSQL publish", 700, "msgs/s", "issue 12 (message_bus's postgres backend here)")
        rep.add("psycopg LISTEN/NOTIFY latency p50", lat["np50"], "µs", higher_is_better=False)
        rep.add("psycopg LISTEN/NOTIFY latency p99", lat["np99"], "µs", higher_is_better=False)
        rep.add(
            "cross-host latency p50",
            lat["p50"],
            "µs",
            higher_is_better=False,
            baselines=["psycopg LISTEN/NOTIFY latency p50"],
            note="publish on A -> table + NOTIFY -> relay -> B's segment -> callback",
        )
        rep.add(
            "cross-host latency p99",
            lat["p99"],
            "µs",
            higher_is_better=False,
            baselines=["psycopg LISTEN/NOTIFY latency p99"],
        )
        bridge_b: Any = b.default
        queries = {"n": 0}
        real = bridge_b._conn

        def counting() -> Any:
            queries["n"] += 1
            return real()

        bridge_b._conn = counting
        last = b.last_id(CHANNEL)
        reads = 200 if args.quick else 2000
        after = b.look_back(CHANNEL, 5)
        for _ in range(reads):
            b.last_ids(CHANNEL, CHANNEL + "/rate")
            b.backlog(CHANNEL, after)
        per_read = queries["n"] / reads
        rep.add(
            "database queries per long-poll read (B)",
            [per_read],
            "queries",
            higher_is_better=False,
            note=f"last_ids + backlog of the last 5 (up to id {last}), served from the segment",
        )
        rep.target("database queries per read when the segment has the data", per_read, 0, at_least=False)

        def med(k: str) -> float:
            return sorted(rows[k])[len(rows[k]) // 2]

        rep.target("bridge publish msgs/s (single, one thread)", med("bs"), 5000)
        rep.target(f"bridge publish msgs/s (single, {WORKERS} processes)", med("cb"), 5000)
        rep.target("bridge publish msgs/s (single, synchronous_commit=False)", med("fs"), 5000)
        rep.target("bridge publish_many msgs/s (batched)", med("bb"), 20000)
        rep.note(
            "relays: one process per host (--split-relays)"
            if args.split_relays
            else "relays: both hosts' in one helper process (--split-relays: one per host)"
        )
        rep.note(
            "figures are for a publishing worker; PostgreSQL, the relay (helper process) and the publisher share "
            "the machine's 2 vCPUs"
        )
        conn.close()
    finally:
        c.stop_helpers(helpers)
        for bus in buses:
            bus.destroy()
        for name in (name_a, name_b):
            Bus(name, create=True).destroy()
        admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        admin.close()
    rep.emit()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
