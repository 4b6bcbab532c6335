"""PySpark data source ``"shmbus"``: read bus channels as a stream or a batch, and publish rows to the bus.

Needs the ``spark`` extra (``pip install 'shmbus[spark]'``: pyspark >= 4.2, pyarrow). Register it once per
session with :func:`register`, then::

    spark.readStream.format("shmbus").option("bus", "app").option("channels", "/events/clicks").load()
    df.writeStream.format("shmbus").option("bus", "app").option("sinkId", "clicks-agg")
        .option("checkpointLocation", "/tmp/ckpt").start()

Where the code runs matters (see docs/spark.md): Spark calls the planning methods in a Python process on the
driver host and ``read()``/``write()`` in executor workers, on pickled copies. So every object here holds only
plain data (bus name, URL, parsed options) and opens the bus inside the call that needs it, closing it again.
On one host executors attach to the segment by name; on a cluster they read the Redis bridge's backlogs
(option ``redis_url``).

Offsets are ``{"epoch": E, "ids": {channel: last_id, ...}}`` with sorted channel keys: Spark compares offsets
as JSON text, so an unstable key order would make it run empty batches forever. The epoch changes when the
bus is reset, which is how a checkpoint from before a reset is detected even when the new ids already passed
the old ones.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import (
    StructType,
)

from .options import (
    FORMAT_NAME,
    SparkOptions,
    schema_for,
)
from .reading import (
    BusBatchReader,
    BusStreamReader,
)
from .sink import (
    BusBatchWriter,
    BusStreamWriter,
)

__all__ = ["FORMAT_NAME", "ShmbusDataSource", "register", "spark_session"]


def spark_session(app_name: str = "shmbus", master: str = "local[2]", **conf: str) -> Any:
    """A SparkSession set up the way the data source needs on one host (and quiet).

    Workers must run this interpreter (``PYSPARK_PYTHON``; otherwise they may lack pyarrow or shmbus), the driver
    binds to loopback (no hostname-resolution warning, nothing exposed), the UI is off, and the data source is
    registered. Extra ``conf`` entries are passed to the builder (use dots: ``**{"spark.x": "y"}``).
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def register(spark: Any) -> None:
    """Register the ``"shmbus"`` format with ``spark`` (idempotent)."""
    spark.dataSource.register(ShmbusDataSource)


# ---------------------------------------------------------------------------------------------- data source
class ShmbusDataSource(DataSource):
    """``format("shmbus")``: streaming and batch reader, streaming and batch writer."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        self.opts = SparkOptions.parse(options)

    def schema(self) -> StructType:
        return schema_for("binary" if self.opts.data_format == "binary" else "string")

    def reader(self, schema: StructType) -> DataSourceReader:
        self.opts.require_source()
        return BusBatchReader(self.opts, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        self.opts.require_source()
        return BusStreamReader(self.opts, schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return BusBatchWriter(self.opts, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return BusStreamWriter(self.opts, schema)
