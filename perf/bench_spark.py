"""Benchmark: rows/s read from bus channels through a Spark streaming query, and bus -> Spark -> bus latency.

    python perf/bench_spark.py            # 1,000,000 messages, 10 s latency run
    python perf/bench_spark.py --quick    # 200,000 messages, 4 s latency run

Throughput: N messages of 100-byte payloads on 4 channels are read by ``readStream.format("shmbus")`` with
Trigger.AvailableNow into Spark's ``noop`` sink (one micro-batch, 4 tasks on local[2]). Three figures, each the
median of ``--repeats`` queries:

* ``stream``: rows / the micro-batch's trigger time (Spark's own ``processedRowsPerSecond``): the rate a
  running stream reads at;
* ``wall``: rows / the time from ``start()`` to the end, so it also pays starting a query (~0.7 s here, most of
  it Spark's planner process importing pyspark from ``pyspark.zip``, which a long-running stream pays once);
* ``addBatch``: rows / the time Spark spent in addBatch alone.

Baselines measured in the same run, on the same data:

* ``reader``: the source's own read path (attach, read the partitions, build Arrow batches) in this Python
  process without Spark, on one core: what Spark's Python workers run, without Spark around them;
* ``rate``: Spark's built-in ``rate`` source into ``noop`` with the same row count: what Spark costs per row
  with no Python in the way.

Before measuring, a warm-up reads 4 channels twice, so that both of local[2]'s Python workers exist and the
JVM has compiled the Arrow path: otherwise the first measured query pays a worker's fork and imports (~1 s).

Latency: a producer publishes 20 msg/s on ``/lat/in`` stamped with ``time.time()``; a streaming query (default
trigger, i.e. the next micro-batch starts as soon as the last one ends) republishes each row to ``/lat/out``;
a subscriber records arrival minus stamp.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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
    from shmbus.adapters.spark.options import SparkOptions, schema_for
    from shmbus.adapters.spark.readers import open_reader
    from shmbus.adapters.spark.reading import _plan, read_partition

    opts = SparkOptions.parse({"bus": bus_name, "channels": ",".join(CHANNELS)})
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


def spark_read(spark: Any, bus_name: str, channels: list[str], n: int) -> dict[str, float]:
    """One Trigger.AvailableNow query into ``noop``: seconds of wall time, trigger time and addBatch time."""
    q = (
        spark.readStream.format("shmbus")
        .option("bus", bus_name)
        .option("channels", ",".join(channels))
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.format("noop")
        .trigger(availableNow=True)
    )
    t0 = time.perf_counter()
    query = q.start()
    query.awaitTermination()
    wall = time.perf_counter() - t0
    progress = query.recentProgress
    query.stop()
    rows = sum(p["numInputRows"] for p in progress)
    assert rows == n, (rows, n)
    trigger = sum(p["durationMs"].get("triggerExecution", 0) for p in progress if p["numInputRows"]) / 1000
    add_batch = sum(p["durationMs"].get("addBatch", 0) for p in progress) / 1000
    return {"wall": wall, "trigger": trigger, "add_batch": add_batch}


def warm_up(spark: Any, bus: Bus) -> None:
    """Start what a long-running stream has running: both Python workers (4 tasks on local[2]), the planner's
    imports, the JVM's compiled Arrow path; and Spark's rate source, for its baseline."""
    warm = [f"/warm/{i}" for i in range(4)]
    for i in range(100_000):
        bus.publish(warm[i & 3], PAYLOAD)
    for _ in range(2):
        spark_read(spark, bus.name, warm, 100_000)
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

    from shmbus.adapters.spark import stop_gracefully

    got: list[float] = []
    done = threading.Event()
    expected = int(seconds * rate)

    def on_out(msg: Any) -> None:
        got.append(time.time() - float(msg.data["t"]))
        if len(got) >= expected:
            done.set()

    bus.subscribe("/lat/out", on_out)
    checkpoint = tempfile.mkdtemp(prefix="shmbus-bench-")
    query = (
        spark.readStream.format("shmbus")
        .option("bus", bus.name)
        .option("channels", "/lat/in")
        .load()
        .select(F.lit("/lat/out").alias("channel"), F.col("data"))
        .writeStream.format("shmbus")
        .option("bus", bus.name)
        .option("checkpointLocation", checkpoint)
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
        try:
            stop_gracefully(query)  # between micro-batches: a plain stop() lands mid-write and Spark logs ERRORs
        finally:
            shutil.rmtree(checkpoint, ignore_errors=True)  # the run leaves nothing in /tmp
        bus.unsubscribe("/lat/out")
    return got


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="200k messages, one query per figure, a 4 s latency run")
    ap.add_argument("--messages", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=None, help="queries per figure, median reported (default 3)")
    ap.add_argument("--json", action="store_true", help="also print one JSON line with every figure")
    args = ap.parse_args()
    n = args.messages or (200_000 if args.quick else 1_000_000)
    repeats = args.repeats or (1 if args.quick else 3)
    lat_seconds = 4.0 if args.quick else 10.0

    from shmbus.adapters.spark import spark_session

    name = f"bench_spark_{os.getpid()}"
    # ~190 bytes per record in the ring: size it (and the per-channel backlog) so nothing is trimmed
    ring = max(64 << 20, (((n + 100_000) * 256) // (1 << 20) + 1) << 20)
    bus = Bus(name, ring_size=ring, max_backlog_size=n + 1, keepalive_interval=0, create=True)
    spark = None
    try:
        t0 = time.perf_counter()
        spark = spark_session("shmbus-bench", "local[2]")
        print(f"spark session started in {time.perf_counter() - t0:.1f} s (local[2], {os.cpu_count()} cpus)")
        pub = fill(bus, n)
        print(f"published {n:,} x 100-byte messages on {len(CHANNELS)} channels at {pub:,.0f} msg/s")
        warm_up(spark, bus)
        base = statistics.median(baseline_reader(name, n) for _ in range(repeats))
        runs = [spark_read(spark, name, CHANNELS, n) for _ in range(repeats)]
        wall, trigger, add_batch = (statistics.median(r[k] for r in runs) for k in ("wall", "trigger", "add_batch"))
        rate = statistics.median(spark_rate(spark, n) for _ in range(repeats))
        stream_rate, wall_rate, add_rate = n / trigger, n / wall, n / add_batch
        print(f"read {n:,} rows through Spark (median of {repeats} queries, 4 tasks on local[2]):")
        print(f"  stream (rows / trigger time, Spark's processedRowsPerSecond): {stream_rate:>11,.0f} rows/s")
        print(f"  wall (start() to end; {wall - trigger:.2f} s of it starting the query): {wall_rate:>11,.0f} rows/s")
        print(f"  addBatch only:                                                {add_rate:>11,.0f} rows/s")
        print(f"  baseline 'reader' (same read path, no Spark, 1 core): {base:,.0f} rows/s")
        print(f"    ratio stream / reader {stream_rate / base:.2f}, wall / reader {wall_rate / base:.2f}")
        print(f"  baseline 'rate' (Spark's built-in source, no Python): {rate:,.0f} rows/s")
        print(f"    ratio stream / rate {stream_rate / rate:.2f}, wall / rate {wall_rate / rate:.2f}")
        if args.quick or n < 1_000_000:
            print("  (the targets are for the full run: on fewer rows a micro-batch's fixed costs weigh more)")
        else:
            for label, ok in (
                ("stream >= 0.8 x reader", stream_rate >= 0.8 * base),
                ("wall >= 0.8 x reader", wall_rate >= 0.8 * base),
                ("stream >= 300,000 rows/s", stream_rate >= 300_000),
                ("wall >= 300,000 rows/s", wall_rate >= 300_000),
            ):
                print(f"  target {label}: {'met' if ok else 'NOT met'}")
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
                        "repeats": repeats,
                        "rows_per_s_stream": stream_rate,
                        "rows_per_s": wall_rate,
                        "rows_per_s_add_batch": add_rate,
                        "query_start_s": wall - trigger,
                        "baseline_reader": base,
                        "baseline_rate": rate,
                        "ratio_stream_reader": stream_rate / base,
                        "ratio_wall_reader": wall_rate / base,
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
            _end_jvm()
        bus.destroy()


def _end_jvm() -> None:
    """Wait for the JVM to exit (it does when its stdin closes) instead of leaving it to outlive this process."""
    from pyspark import SparkContext

    proc = getattr(SparkContext._gateway, "proc", None)
    if proc is not None and proc.stdin is not None:
        proc.stdin.close()
        proc.wait(30)


if __name__ == "__main__":
    main()
