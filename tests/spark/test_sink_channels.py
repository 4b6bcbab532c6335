"""The Spark sink follows the bus's one channel rule (:mod:`shmbus.channels`), with the bus's own names refused.

A row could name ``/__shmbus_cache/<name>`` and so forge a DistributedCache operation in every worker, or
``/__shmbus_spark/sink/<id>`` and fake a sink's progress record; a row on ``chat`` created a channel no HTTP
client could subscribe to. Both are now a typed :class:`~shmbus.errors.InvalidChannel` before anything is sent.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from shmbus import Bus, DistributedCache, InvalidChannel
from tests.harness import skip_or_fail

pytestmark = pytest.mark.spark


@pytest.fixture
def writer_for() -> Any:
    if importlib.util.find_spec("pyspark") is None:
        skip_or_fail("Python module 'pyspark' is not installed (pip install -e '.[spark]')")
    from pyspark.sql.types import StringType, StructField, StructType

    from shmbus.adapters.spark.options import SparkOptions
    from shmbus.adapters.spark.sink import _BusWriterBase

    def make(bus: Bus, **options: str) -> Any:
        schema = StructType([StructField("channel", StringType()), StructField("data", StringType())])
        return _BusWriterBase(SparkOptions.parse({"bus": bus.name, **options}), schema)

    return make


@pytest.mark.parametrize(
    ("channel", "says"),
    [
        ("/__shmbus_cache/settings", "is reserved"),
        ("/__shmbus_spark/sink/other", "is reserved"),
        ("/__mb_keepalive__/", "is reserved"),
        ("chat", "must start with '/'"),
        ("/a\nb", "CR or LF"),
    ],
)
def test_sink_rows_follow_the_channel_rule(writer_for: Any, bus_name: str, channel: str, says: str) -> None:
    bus = Bus(bus_name, ring_size=1 << 20, keepalive_interval=0, create=True)
    try:
        cache = DistributedCache("settings", bus=bus)
        cache["theme"] = "dark"
        before = bus.segment.global_id()
        row = {"channel": channel, "data": '{"op": "clear"}'}
        with pytest.raises(InvalidChannel, match=says):
            writer_for(bus)._publish_rows(bus, iter([{"channel": "/ok", "data": "1"}, row]))
        assert bus.segment.global_id() == before + 1  # the good row before it, nothing of the bad one
        assert dict(cache) == {"theme": "dark"}
    finally:
        bus.destroy()


def test_sink_channel_option_is_checked_before_any_row(writer_for: Any, bus_name: str) -> None:
    bus = Bus(bus_name, ring_size=1 << 20, keepalive_interval=0, create=True)
    try:
        with pytest.raises(InvalidChannel, match="must start with '/'"):
            writer_for(bus, channel="dashboard")
    finally:
        bus.destroy()
