"""A streaming query stopped while rows keep arriving, run as its own process by test_spark.py.

Usage: python stop_job.py BUS CHECKPOINT graceful|plain

Its own process because the test reads everything the driver JVM logs: the JVM of the shared test session
writes to a stderr that pytest cannot attribute to one test. Publishes ``{"n": i}`` on ``/in`` of BUS without
pause and runs ``/in -> /out`` through the shmbus sink. Once several batches ran, it stops the query at the
moment a row arrives on ``/out``, i.e. while a batch is in its write (``stop_gracefully`` or, to see what the
test guards against, ``query.stop()``, which makes Spark log its abort ERROR lines then), stops publishing, and
drains what is left with an availableNow query on the same checkpoint. Prints one JSON line:
``{"sent": N, "graceful": bool}``.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

from pyspark.sql import functions as F

from shmbus import Bus
from shmbus.adapters.spark import spark_session, stop_gracefully


def main() -> None:
    bus_name, checkpoint, mode = sys.argv[1:4]
    spark = spark_session("shmbus-stop-job", "local[2]")
    bus = Bus(bus_name, create=False, keepalive_interval=0, max_backlog_size=1_000_000)
    sent = 0
    stop_producing = threading.Event()

    def produce() -> None:
        nonlocal sent
        while not stop_producing.is_set():
            bus.publish("/in", {"n": sent + 1})
            sent += 1
            time.sleep(0.005)

    writing = threading.Event()
    bus.subscribe("/out", lambda _msg: writing.set())

    def query(available_now: bool) -> Any:
        w = (
            spark.readStream.format("shmbus")
            .option("bus", bus_name)
            .option("channels", "/in")
            .option("startingOffsets", "earliest")
            .load()
            .select(F.lit("/out").alias("channel"), F.col("data"))
            .writeStream.format("shmbus")
            .option("bus", bus_name)
            .option("sinkId", "stop-job")
            .option("maxBacklogSize", "1000000")  # the sink's default keeps 1000 per channel, like the gem
            .option("checkpointLocation", checkpoint)
        )
        return w.trigger(availableNow=True).start() if available_now else w.start()

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    q = query(available_now=False)
    deadline = time.monotonic() + 120
    while sum(1 for p in q.recentProgress if p["numInputRows"]) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    writing.clear()
    if not writing.wait(60):
        raise SystemExit("no batch wrote rows: nothing to interrupt")
    graceful = stop_gracefully(q, timeout=60) if mode == "graceful" else (q.stop() or False)
    stop_producing.set()
    producer.join()
    rest = query(available_now=True)
    rest.awaitTermination(120)
    rest.stop()
    print(json.dumps({"sent": sent, "graceful": graceful}), flush=True)
    bus.close()
    spark.stop()


if __name__ == "__main__":
    main()
