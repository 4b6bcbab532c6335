"""Benchmark: rows/s read from bus channels through a Spark streaming query, and bus -> Spark -> bus latency.

    python perf/bench_spark.py            # 1,000,000 messages, 10 s latency run
    python perf/bench_spark.py --quick    # 200,000 messages, 4 s latency run

Throughput: N messages of 100-byte payloads on 4 channels are read by ``readStream.format("shmbus")`` with
Trigger.AvailableNow into Spark's ``noop`` sink; the figure is rows / (wall time from ``start()`` to the end),
so it includes the ~1 s it takes Spark to start a query. Baselines measured in the same run, on the same data:

* ``reader``: the source's own read path (attach, read the partitions, build Arrow batches) in this Python
  process without Spark: the ceiling Spark adds its overhead to;
* ``rate``: Spark's built-in ``rate`` source into ``noop`` with the same row count: what Spark costs per row
  with no Python in the way.

Latency: a producer publishes 20 msg/s on ``/lat/in`` stamped with ``time.time()``; a streaming query (default
trigger, i.e. the next micro-batch starts as soon as the last one ends) republishes each row to ``/lat/out``;
a subscriber records arrival minus stamp.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from shmbus import Bus

CHANNELS = [f"/bench/{i}" for i in range(4)]
PAYLOAD = "x" * 98  # 100 bytes of JSON text once quoted


def fill(bus: Bus, n: int) -> float:
    t0 = time.perf_counter()
    for i in range(n):
        bus.publish(CHANNELS[i & 3], PAYLOAD)
    return n / (time.perf_counter() - t0)


def baseline_reader(bus_name: str, n: int) -> float:
    """The source's read path without Spark, partition by partition, in this process (one core)."""
    from shmbus.adapters.spark.options import Options, schema_for
    from shmbus.adapters.spark.readers import open_reader
    from shmbus.adapters.spark.reading import _plan, read_partition

    opts = Options.parse({"bus": bus_name, "channels": ",".join(CHANNELS)})
    reader = open_reader(opts.location)
    try:
        parts = _plan(opts, dict.fromkeys(CHANNELS, 0), reader.last_ids(CHANNELS), reader.epoch())
    finally:
        reader.close()
    t0 = time.perf_counter()
    rows = sum(b.num_rows for p in parts for b in read_partition(opts, schema_for(), p))
    elapsed = time.perf_counter() - t0
    assert rows == n, (rows, n)
    return rows / elapsed


def spark_read(spark: Any, bus_name: str, n: int) -> tuple[float, float]:
    """rows/s through a streaming query (wall, including query start) and the addBatch-only figure."""
    q = (
        spark.readStream.format("shmbus")
        .option("bus", bus_name)
        .option("channels", ",".join(CHANNELS))
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.format("noop")
        .trigger(availableNow=True)
    )
    t0 = time.perf_counter()
    query = q.start()
    query.awaitTermination()
    wall = time.perf_counter() - t0
    rows = sum(p["numInputRows"] for p in query.recentProgress)
    add_batch = sum(p["durationMs"].get("addBatch", 0) for p in query.recentProgress) / 1000
    query.stop()
    assert rows == n, (rows, n)
    return rows / wall, rows / max(add_batch, 1e-9)


def warm_up(spark: Any, bus: Bus) -> None:
    """The first Python-source query of a session pays 3-5 s (JVM JIT, Python daemons): not what we measure."""
    for i in range(1000):
        bus.publish("/warm", i)
    query = (
        spark.readStream.format("shmbus")
        .option("bus", bus.name)
        .option("channels", "/warm")
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.format("noop")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    query.stop()
    spark_rate(spark, 1000)


def spark_rate(spark: Any, n: int) -> float:
    """Spark's built-in rate source, same row count, noop sink (rowsPerBatch with the micro-batch variant)."""
    q = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", n)
        .option("numPartitions", 4)
        .load()
        .writeStream.format("noop")
        .trigger(availableNow=True)
    )
    t0 = time.perf_counter()
    query = q.start()
    query.awaitTermination()
    wall = time.perf_counter() - t0
    rows = sum(p["numInputRows"] for p in query.recentProgress)
    query.stop()
    return rows / wall


def latency(spark: Any, bus: Bus, seconds: float, rate: float = 20.0) -> list[float]:
    from pyspark.sql import functions as F

    got: list[float] = []
    done = threading.Event()
    expected = int(seconds * rate)

    def on_out(msg: Any) -> None:
        got.append(time.time() - float(msg.data["t"]))
        if len(got) >= expected:
            done.set()

    bus.subscribe("/lat/out", on_out)
    query = (
        spark.readStream.format("shmbus")
        .option("bus", bus.name)
        .option("channels", "/lat/in")
        .load()
        .select(F.lit("/lat/out").alias("channel"), F.col("data"))
        .writeStream.format("shmbus")
        .option("bus", bus.name)
        .option("checkpointLocation", tempfile.mkdtemp(prefix="shmbus-bench-"))
        .start()
    )
    try:
        # wait until the query runs (its first offsets are logged) before producing
        deadline = time.monotonic() + 60
        while not query.recentProgress and time.monotonic() < deadline:
            time.sleep(0.05)
        bus.publish("/lat/in", {"t": time.time(), "warmup": True})
        while not got and time.monotonic() < deadline:
            time.sleep(0.05)
        got.clear()
        start = time.monotonic()
        for i in range(expected):
            target = start + i / rate
            delay = target - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            bus.publish("/lat/in", {"t": time.time(), "i": i})
        done.wait(30)
    finally:
        query.stop()
        bus.unsubscribe("/lat/out")
    return got


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="200k messages and a 4 s latency run")
    ap.add_argument("--messages", type=int, default=None)
    ap.add_argument("--json", action="store_true", help="also print one JSON line with every figure")
    args = ap.parse_args()
    n = args.messages or (200_000 if args.quick else 1_000_000)
    lat_seconds = 4.0 if args.quick else 10.0

    from shmbus.adapters.spark import spark_session

    name = f"bench_spark_{os.getpid()}"
    # ~190 bytes per record in the ring: size it (and the per-channel backlog) so nothing is trimmed
    ring = max(64 << 20, ((n * 256) // (1 << 20) + 1) << 20)
    bus = Bus(name, ring_size=ring, max_backlog_size=n + 1, keepalive_interval=0)
    spark = None
    try:
        t0 = time.perf_counter()
        spark = spark_session("shmbus-bench", "local[2]")
        print(f"spark session started in {time.perf_counter() - t0:.1f} s (local[2], {os.cpu_count()} cpus)")
        pub = fill(bus, n)
        print(f"published {n:,} x 100-byte messages on {len(CHANNELS)} channels at {pub:,.0f} msg/s")
        warm_up(spark, bus)
        base = baseline_reader(name, n)
        wall, add_batch = spark_read(spark, name, n)
        rate = spark_rate(spark, n)
        print(
            f"read {n:,} rows through Spark:  {wall:,.0f} rows/s  (wall incl. query start; "
            f"{add_batch:,.0f} rows/s in addBatch)"
        )
        print(f"  baseline 'reader' (same read path, no Spark, 1 core): {base:,.0f} rows/s  -> ratio {wall / base:.2f}")
        print(f"  baseline 'rate' (Spark built-in source, no Python):  {rate:,.0f} rows/s  -> ratio {wall / rate:.2f}")
        print(f"  target >= 300,000 rows/s: {'met' if wall >= 300_000 else 'NOT met'}")
        lat = latency(spark, bus, lat_seconds)
        if lat:
            p50, p95 = pct(lat, 50), pct(lat, 95)
            print(
                f"latency bus -> Spark -> bus ({len(lat)} msgs at 20/s, default trigger): "
                f"p50 {p50 * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms, max {max(lat) * 1000:.0f} ms, "
                f"mean {statistics.mean(lat) * 1000:.0f} ms"
            )
        else:
            p50 = p95 = float("nan")
            print("latency: no message came back")
        if args.json:
            print(
                json.dumps(
                    {
                        "messages": n,
                        "rows_per_s": wall,
                        "rows_per_s_add_batch": add_batch,
                        "baseline_reader": base,
                        "baseline_rate": rate,
                        "latency_p50": p50,
                        "latency_p95": p95,
                    }
                )
            )
    finally:
        if spark is not None:
            for q in spark.streams.active:
                q.stop()
            spark.stop()
        bus.destroy()


if __name__ == "__main__":
    main()
