"""The Spark source and sink in cluster mode through the RabbitMQ bridge's stream (``rabbitmq_url``)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shmbus import Bus
from tests.harness.rabbitmq import shared_broker

from .test_spark import _run, sink_30_rows_once

pytestmark = pytest.mark.spark


def _delete(url: str, stream: str) -> None:
    from shmbus.adapters.rabbitmq.connection import AmqpConnection
    from shmbus.adapters.rabbitmq.errors import parse_url

    a = parse_url(url)
    conn = AmqpConnection(a.host, a.port, a.user, a.password, a.vhost, 10)
    try:
        conn.open_channel(1, 10)
        conn.delete(1, stream, 10)
    finally:
        conn.close()


@pytest.fixture(scope="module")
def amqp_url() -> Iterator[str]:
    yield from shared_broker()


def test_rabbitmq_source_and_sink_reach_bridged_hosts_once(
    spark: Any, bus_name: str, tmp_path: Path, amqp_url: str
) -> None:
    """``rabbitmq_url`` on both sides: the source reads the stream (ids are offsets + 1, sparse within a channel:
    no false data loss), the sink publishes rows into it (the bridge with relay off), and a web host bridged to the
    stream gets every row once with the stream's ids; a replayed batch is skipped using the sink records kept in
    the stream."""
    from pyspark.sql import functions as F

    from shmbus.adapters.rabbitmq import RabbitBridge

    url = amqp_url
    stream = f"s_{bus_name}"
    web = Bus(
        f"{bus_name}w", ring_size=1 << 20, keepalive_interval=0, create=True, engine=RabbitBridge(url, stream=stream)
    )
    try:
        deadline = time.monotonic() + 20
        while web.health()["engine_health"]["relay_state"] != "relaying":
            assert time.monotonic() < deadline, "no relay on the web host"
            time.sleep(0.05)
        ids = []
        for i in range(1, 31):
            ids.append(web.publish("/in", {"n": i}))
            web.publish("/noise", i)  # the stream's ids: /in gets every other one
        source = {"rabbitmq_url": url, "rabbitmq_stream": stream, "channels": "/in"}
        rows = spark.read.format("shmbus").options(**source).load().collect()
        assert [(r["message_id"], json.loads(r["data"])) for r in rows] == [(m, {"n": i}) for i, m in enumerate(ids, 1)]
        ckpt = tmp_path / "ckpt"

        def run() -> Any:
            df = spark.readStream.format("shmbus").options(**source).option("startingOffsets", "earliest").load()
            return _run(
                df.select(F.lit("/out").alias("channel"), F.col("data"))
                .writeStream.format("shmbus")
                .option("rabbitmq_url", url)
                .option("rabbitmq_stream", stream)
                .option("sinkId", "rmq")
                .option("checkpointLocation", str(ckpt))
            )

        sink_30_rows_once(run, web, ckpt, deadline=20)
    finally:
        web.destroy()
        _delete(url, stream)
