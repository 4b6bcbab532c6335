"""PySpark data source ``"shmbus"``: read bus channels as a stream or a batch, and publish rows back to the bus.

``from shmbus.adapters.spark import register, spark_session`` (the ``spark`` extra: pyspark >= 4.2, pyarrow).
See docs/spark.md. Modules: ``source`` (the data source), ``options``, ``reading`` (partitions, Arrow batches),
``sink`` (publishing rows exactly once), ``readers`` (the segment or Redis, read directly), ``stopping``
(a stop between micro-batches).
"""

from __future__ import annotations

from .options import SINK_CHANNEL_PREFIX, BusDataLossError, decode_offset, encode_offset, schema_for, sink_channel
from .sink import last_committed_batch
from .source import ShmbusDataSource, register, spark_session
from .stopping import stop_gracefully

__all__ = [
    "SINK_CHANNEL_PREFIX",
    "BusDataLossError",
    "ShmbusDataSource",
    "decode_offset",
    "encode_offset",
    "last_committed_batch",
    "register",
    "schema_for",
    "sink_channel",
    "spark_session",
    "stop_gracefully",
]
