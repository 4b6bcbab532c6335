"""A streaming query run as its own process by test_spark.py, so the test can SIGKILL its driver mid-stream.

Usage: python stream_job.py BUS CHANNELS OUT_DIR CHECKPOINT MAX_RECORDS_PER_TRIGGER
Reads CHANNELS of BUS from the earliest retained message with Trigger.AvailableNow and appends the rows to
parquet files in OUT_DIR (Spark's file sink: exactly-once per batch through its _spark_metadata log).
"""

from __future__ import annotations

import sys

from shmbus.adapters.spark import spark_session


def main() -> None:
    bus, channels, out, checkpoint, per_trigger = sys.argv[1:6]
    spark = spark_session("shmbus-stream-job", "local[2]")
    query = (
        spark.readStream.format("shmbus")
        .option("bus", bus)
        .option("channels", channels)
        .option("startingOffsets", "earliest")
        .option("maxRecordsPerTrigger", per_trigger)
        .load()
        .select("channel", "message_id", "data")
        .writeStream.format("parquet")
        .option("path", out)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    print("started", flush=True)
    query.awaitTermination()
    print("done", flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
