"""Example Spark pipeline: click events from the bus -> running counts per page -> back to the bus, live.

    .venv/bin/python examples/spark_pipeline/pipeline.py --bus demo --checkpoint /tmp/clicks-ckpt

Reads ``/events/clicks`` (see generate_events.py) with ``readStream.format("shmbus")``, keeps a running count
of clicks and distinct users per page, and publishes every changed count to ``/dashboard/clicks`` as
``{"page": "/docs", "clicks": 42, "users": 17}`` (Spark's ``complete`` output mode: after every micro-batch
with new events, one message per page; Python sinks do not support ``update`` mode). A web page subscribed to
``/dashboard/clicks`` (message_bus JS client, or ``bus.subscribe`` in Python) can show the table live;
replaying the channel (``last_id=0``) gives the latest count of every page.

With ``sinkId`` set and a checkpoint, a restarted job neither loses events nor publishes a batch twice.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import threading
from typing import Any

EVENTS_CHANNEL = "/events/clicks"
DASHBOARD_CHANNEL = "/dashboard/clicks"


def build_query(
    spark: Any,
    bus: str,
    checkpoint: str,
    *,
    available_now: bool = False,
    trigger_seconds: float = 0.0,
    starting: str = "earliest",
) -> Any:
    """Start the streaming query (returns the StreamingQuery)."""
    from pyspark.sql import functions as F

    events = (
        spark.readStream.format("shmbus")
        .option("bus", bus)
        .option("channels", EVENTS_CHANNEL)
        .option("startingOffsets", starting)
        .option("maxRecordsPerTrigger", "50000")
        .load()
        .select(F.from_json("data", "page STRING, user STRING, ts DOUBLE").alias("e"))
        .select("e.page", "e.user")
    )
    counts = events.groupBy("page").agg(
        F.count("*").alias("clicks"),
        F.approx_count_distinct("user").alias("users"),
    )
    out = counts.select(
        F.lit(DASHBOARD_CHANNEL).alias("channel"),
        F.to_json(F.struct("page", "clicks", "users")).alias("data"),
    )
    writer = (
        out.writeStream.outputMode("complete")
        .format("shmbus")
        .option("bus", bus)
        .option("sinkId", "dashboard-clicks")
        .option("maxBacklogSize", "1000")
        .option("checkpointLocation", checkpoint)
        .queryName("dashboard_clicks")
    )
    if available_now:
        writer = writer.trigger(availableNow=True)
    elif trigger_seconds:
        writer = writer.trigger(processingTime=f"{trigger_seconds} seconds")
    return writer.start()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bus", default="demo", help="bus name (default demo)")
    ap.add_argument(
        "--checkpoint",
        default="/tmp/shmbus-clicks-checkpoint",
        help="Spark checkpoint directory: where the job continues from after a restart",
    )
    ap.add_argument(
        "--reset-checkpoint",
        action="store_true",
        help="delete the checkpoint directory first and start over (needed after the bus was reset or "
        "recreated, e.g. when scripts/demo restarted)",
    )
    ap.add_argument("--trigger", type=float, default=1.0, help="seconds between micro-batches (0: back to back)")
    ap.add_argument("--available-now", action="store_true", help="process what is there, then exit")
    ap.add_argument("--master", default=os.environ.get("SPARK_MASTER", "local[2]"), help="Spark master")
    args = ap.parse_args()

    if args.reset_checkpoint and os.path.isdir(args.checkpoint):
        shutil.rmtree(args.checkpoint)
        print(f"removed the checkpoint {args.checkpoint}")
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from shmbus.adapters.spark import spark_session

    # Ctrl-C only asks to stop; the stop itself happens here, between JVM calls. (pyspark's own SIGINT handler
    # calls into the JVM from inside the signal, cancelAllJobs, while the main thread waits on the same py4j
    # connection, and each interrupted py4j call logs its tracebacks: about 40 lines before "stopping".)
    stop = threading.Event()

    def on_sigint(signum: int, frame: Any) -> None:
        if stop.is_set():
            raise KeyboardInterrupt  # a second Ctrl-C: stop at once, whatever it prints
        stop.set()

    # While the JVM starts, Ctrl-C waits (blocked, not lost): the SparkContext installs pyspark's handler at the
    # end, and ours must replace it before any Ctrl-C is delivered.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        spark = spark_session("shmbus-clicks-dashboard", args.master)
    finally:
        signal.signal(signal.SIGINT, on_sigint)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    query = None
    try:
        if not stop.is_set():
            query = build_query(
                spark, args.bus, args.checkpoint, available_now=args.available_now, trigger_seconds=args.trigger
            )
            print(
                f"streaming {EVENTS_CHANNEL} -> {DASHBOARD_CHANNEL} on bus {args.bus!r}"
                + ("" if args.available_now else "; Ctrl-C to stop"),
                flush=True,
            )
            while query.isActive and not stop.wait(0.5):  # not awaitTermination(): a JVM call Ctrl-C would cut
                pass
        if stop.is_set():
            print("stopping (the running batch commits first)", flush=True)
        elif query is not None and query.exception() is not None:
            return _failed(query.exception(), args.checkpoint)
    finally:
        _quiet_stop(query, spark)
    return 0


def _failed(exc: Any, checkpoint: str) -> int:
    """Say what matters of a failed query (Spark wraps the source's error in a page of JVM trace)."""
    text = str(exc)
    if "BusDataLossError" in text:
        reason = next((line.strip() for line in text.splitlines() if "BusDataLossError" in line), text[:300])
        print(
            f"pipeline.py: {reason}\n\nThe checkpoint {checkpoint} refers to messages this bus no longer "
            "has (the bus was reset or recreated since). Start over with --reset-checkpoint.",
            file=sys.stderr,
        )
        return 2
    print(f"pipeline.py: the query failed: {text[:2000]}", file=sys.stderr)
    return 1


def _quiet_stop(query: Any, spark: Any) -> None:
    """Stop the query between micro-batches (its batch commits, nothing is aborted), then the session."""
    from shmbus.adapters.spark import stop_gracefully

    steps = [spark.stop] if query is None else [lambda: stop_gracefully(query, timeout=30), query.stop, spark.stop]
    for step in steps:
        try:
            step()
        except Exception:  # the JVM is already going (a second Ctrl-C): nothing more to stop
            pass


if __name__ == "__main__":
    sys.exit(main())
