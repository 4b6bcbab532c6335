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
import sys
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

    spark = spark_session("shmbus-clicks-dashboard", args.master)
    query = build_query(
        spark, args.bus, args.checkpoint, available_now=args.available_now, trigger_seconds=args.trigger
    )
    print(
        f"streaming {EVENTS_CHANNEL} -> {DASHBOARD_CHANNEL} on bus {args.bus!r}"
        + ("" if args.available_now else "; Ctrl-C to stop"),
        flush=True,
    )
    try:
        query.awaitTermination()
    except KeyboardInterrupt:  # a normal way to stop: no traceback from Spark's threads
        print("stopping", flush=True)
    except Exception as exc:  # Spark wraps the source's error in a page of JVM trace: say what matters
        text = str(exc)
        if "BusDataLossError" in text:
            reason = next((line.strip() for line in text.splitlines() if "BusDataLossError" in line), text[:300])
            print(
                f"pipeline.py: {reason}\n\nThe checkpoint {args.checkpoint} refers to messages this bus no longer "
                "has (the bus was reset or recreated since). Start over with --reset-checkpoint.",
                file=sys.stderr,
            )
            return 2
        raise
    finally:
        _quiet_stop(query, spark)
    return 0


def _quiet_stop(query: Any, spark: Any) -> None:
    """Stop the query between micro-batches, then the session, without the py4j tracebacks an interrupted JVM
    call prints."""
    import logging

    from shmbus.adapters.spark import stop_gracefully

    logging.getLogger("py4j").setLevel(logging.CRITICAL)
    for step in (lambda: stop_gracefully(query, timeout=10), query.stop, spark.stop):
        try:
            step()
        except Exception:  # already stopping: Ctrl-C also reached the JVM
            pass


if __name__ == "__main__":
    sys.exit(main())
