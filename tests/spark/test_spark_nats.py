"""The "shmbus" PySpark data source in cluster mode on NATS JetStream: the source reads the NATS bridge's stream
(one subject per channel, ids sparse within a channel), the sink writes rows into it through the bridge with relay
off, and a web host bridged to the stream gets every row once, with the stream's ids."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shmbus import Bus
from tests.harness import skip_or_fail
from tests.harness.nats import DEFAULT_NATS_URL, NATS_HOW, NatsServer, find_nats_server, nats_jetstream

from .test_spark import _run, sink_30_rows_once

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def nats_url() -> Iterator[str]:
    if os.environ.get("SHMBUS_PRIVATE_SERVICES") != "1" and nats_jetstream():
        yield DEFAULT_NATS_URL
        return
    binary = find_nats_server()
    if binary is None:
        skip_or_fail(f"no nats-server binary to start a private NATS ({NATS_HOW})")
    server = NatsServer(binary).start()
    try:
        yield server.url
    finally:
        server.close()


@pytest.fixture
def stream(nats_url: str, bus_name: str) -> Iterator[str]:
    """This test's stream (named after its bus), deleted afterwards."""
    from shmbus.adapters.nats import jetstream as js
    from shmbus.adapters.nats.client import NatsConnection

    yield bus_name
    conn = NatsConnection(nats_url, timeout=10, connect_timeout=5)
    try:
        js.api(conn, f"STREAM.DELETE.{bus_name}")
    except js.JsError:
        pass
    conn.close()


def test_the_reader_without_spark(nats_url: str, bus_name: str, stream: str) -> None:
    """The reader's ranges, newest ids and timestamps (what the source plans with), against a real stream."""
    from shmbus.adapters.nats import NatsBridge
    from shmbus.adapters.spark.nats_reader import NatsReader
    from shmbus.adapters.spark.readers import Location, open_reader

    web = Bus(f"{bus_name}w", keepalive_interval=0, engine=NatsBridge(nats_url, stream=bus_name), create=True)
    try:
        ids = []
        for i in range(10):
            ids.append(web.publish("/in", {"n": i}, user_ids=[i] if i == 3 else None))
            web.publish("/noise", i)
        reader = open_reader(Location(nats_url=nats_url, nats_stream=bus_name))
        assert isinstance(reader, NatsReader)
        try:
            assert reader.last_ids(["/in", "/none"]) == {"/in": ids[-1], "/none": 0}
            assert reader.first_available("/in") == ids[0]
            chunk = reader.read("/in", ids[2], ids[7])
            assert chunk.message_ids == ids[3:8] and chunk.sparse and chunk.first_available == ids[2] + 1
            assert [json.loads(p) for p in chunk.payloads] == [{"n": i} for i in range(3, 8)]
            assert chunk.metas[0] and not chunk.metas[1]  # user_ids=[3] travels
            assert all(t is not None and abs(t - time.time()) < 600 for t in chunk.timestamps)
        finally:
            reader.close()
    finally:
        web.destroy()


def test_nats_source_and_sink_reach_bridged_hosts_once(
    spark: Any, nats_url: str, bus_name: str, stream: str, tmp_path: Path
) -> None:
    from pyspark.sql import functions as F

    from shmbus.adapters.nats import NatsBridge

    web = Bus(
        f"{bus_name}w",
        ring_size=1 << 20,
        keepalive_interval=0,
        engine=NatsBridge(nats_url, stream=bus_name),
        create=True,
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
        source = spark.read.format("shmbus").option("nats_url", nats_url).option("nats_stream", bus_name)
        rows = source.option("channels", "/in").load().collect()
        assert [(r["message_id"], json.loads(r["data"])) for r in rows] == [(m, {"n": i}) for i, m in enumerate(ids, 1)]
        ckpt = tmp_path / "ckpt"

        def run() -> Any:
            df = (
                spark.readStream.format("shmbus")
                .option("nats_url", nats_url)
                .option("nats_stream", bus_name)
                .option("channels", "/in")
                .option("startingOffsets", "earliest")
                .load()
            )
            return _run(
                df.select(F.lit("/out").alias("channel"), F.col("data"))
                .writeStream.format("shmbus")
                .option("nats_url", nats_url)
                .option("nats_stream", bus_name)
                .option("sinkId", "nats")
                .option("checkpointLocation", str(ckpt))
            )

        sink_30_rows_once(run, web, ckpt, deadline=30)
    finally:
        web.destroy()
