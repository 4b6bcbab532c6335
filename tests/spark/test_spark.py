"""The "shmbus" PySpark data source against a real local[2] Spark (one session for the module, see conftest).

Covers the batch reader, the streaming reader (admission control, availableNow), the writers, a driver killed
mid-stream and restarted (exactly-once rows), data loss and bus-reset detection, the idempotent sink, and the
Redis-backlog read path.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest

from shmbus import Bus

pytestmark = pytest.mark.spark

JOB = Path(__file__).with_name("stream_job.py")
STOP_JOB = Path(__file__).with_name("stop_job.py")


@pytest.fixture
def bus(bus_name: str) -> Any:
    b = Bus(bus_name, ring_size=16 << 20, max_backlog_size=100_000, keepalive_interval=0, create=True)
    assert b.segment  # create it now: Spark's processes only ever attach to an existing bus
    try:
        yield b
    finally:
        b.destroy()


def _source(spark: Any, bus: Bus, channels: str, **options: str) -> Any:
    reader = spark.readStream.format("shmbus").option("bus", bus.name).option("channels", channels)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def _run(writer: Any) -> Any:
    """Start an availableNow query, wait for it, surface its error, and return it (stopped)."""
    q = writer.trigger(availableNow=True).start()
    try:
        q.awaitTermination(120)
    finally:
        q.stop()
    return q


def sink_30_rows_once(run: Callable[[], Any], web: Bus, ckpt: Path, deadline: float) -> None:
    """A cluster round trip: ``run()`` streams the 30 rows of ``/in`` into ``/out`` through the sink; they reach the
    ``web`` host (within ``deadline`` s), in order; a batch replayed after its last commit is dropped is not
    published twice; the sink's private bus is gone."""
    q = run()
    assert sum(n for _, n in _batches(q)) == 30

    def out() -> list[Any]:
        return [m.data for m in web.backlog("/out", 0)]

    until = time.monotonic() + deadline
    while len(out()) < 30:
        assert time.monotonic() < until, f"rows did not reach the web host: {out()}"
        time.sleep(0.05)
    assert out() == [{"n": i} for i in range(1, 31)]
    replayed = _drop_last_commit(ckpt)
    q = run()
    assert _batches(q)[0][0] == replayed, "Spark did not replay the batch: the test would prove nothing"
    time.sleep(0.5)
    assert len(out()) == 30, "a replayed batch was published twice"
    assert not [f for f in os.listdir("/dev/shm") if f.startswith("shmbus.spark-sink-")], "sink bus left"


def _drop_last_commit(checkpoint: Path) -> int:
    """Delete the newest ``commits/N`` (and its .crc), as if the driver died before committing batch N."""
    commits = sorted(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    n = commits[-1]
    (checkpoint / "commits" / str(n)).unlink()
    crc = checkpoint / "commits" / f".{n}.crc"
    if crc.exists():
        crc.unlink()
    return n


def _batches(q: Any) -> list[tuple[int, int]]:
    return [(p["batchId"], p["numInputRows"]) for p in q.recentProgress]


# ---------------------------------------------------------------------------------------------- no Spark needed
def test_offsets_have_stable_key_order() -> None:
    from shmbus.adapters.spark import decode_offset, encode_offset

    a = encode_offset(7, {"/b": 2, "/a": 1, "/c": 3})
    b = encode_offset(7, {"/c": 3, "/a": 1, "/b": 2})
    assert json.dumps(a) == json.dumps(b) == '{"epoch": 7, "ids": {"/a": 1, "/b": 2, "/c": 3}}'
    assert decode_offset(json.dumps(a)) == (7, {"/a": 1, "/b": 2, "/c": 3})


def test_fair_share_does_not_starve_small_channels() -> None:
    from shmbus.adapters.spark.reading import _fair_share

    assert _fair_share({"/a": 1000, "/b": 100, "/c": 0}, 300) == {"/a": 200, "/b": 100, "/c": 0}
    assert _fair_share({"/a": 1000, "/b": 1000}, 300) == {"/a": 150, "/b": 150}
    assert _fair_share({"/a": 5, "/b": 5}, 300) == {"/a": 5, "/b": 5}
    assert sum(_fair_share({"/a": 7, "/b": 9, "/c": 11}, 10).values()) == 10


# ---------------------------------------------------------------------------------------------- batch reader
def test_batch_reader_reads_backlog_with_all_columns(spark: Any, bus: Bus) -> None:
    t0 = time.time()
    for i in range(1, 101):
        bus.publish("/a", {"i": i})
    bus.publish("/b", "hello", user_ids=[1, 2], group_ids=["staff"], client_ids=["c1"])
    df = spark.read.format("shmbus").option("bus", bus.name).option("channels", "/a,/b").load()
    assert df.columns == [
        "channel",
        "message_id",
        "global_id",
        "data",
        "timestamp",
        "site_id",
        "user_ids",
        "group_ids",
        "client_ids",
    ]
    rows = sorted(df.collect(), key=lambda r: r.global_id)
    assert [(r.channel, r.message_id) for r in rows] == [("/a", i) for i in range(1, 101)] + [("/b", 1)]
    assert [json.loads(r.data) for r in rows[:3]] == [{"i": 1}, {"i": 2}, {"i": 3}]
    assert [r.global_id for r in rows] == list(range(1, 102))
    last = rows[-1]
    assert (last.data, last.user_ids, last.group_ids, last.client_ids) == ('"hello"', ["1", "2"], ["staff"], ["c1"])
    assert rows[0].user_ids is None and rows[0].site_id is None
    assert abs(rows[0].timestamp.timestamp() - t0) < 60

    # explicit ranges (Kafka-style JSON offsets: last id already consumed) and binary data
    part = (
        spark.read.format("shmbus")
        .option("bus", bus.name)
        .option("channels", "/a")
        .option("startingOffsets", '{"/a": 10}')
        .option("endingOffsets", '{"/a": 15}')
        .option("dataFormat", "binary")
        .option("maxRecordsPerPartition", "2")
        .load()
    )
    got = sorted((r.message_id, bytes(r.data)) for r in part.collect())
    assert got == [(i, json.dumps({"i": i}, separators=(",", ":")).encode()) for i in range(11, 16)]
    assert part.rdd.getNumPartitions() == 3  # 5 ids in chunks of 2


def test_data_loss_is_detected(spark: Any, bus_name: str) -> None:
    small = Bus(bus_name, ring_size=1 << 20, max_backlog_size=100, keepalive_interval=0, create=True)
    try:
        for i in range(1, 251):
            small.publish("/a", i)

        def load(fail: str) -> Any:
            return (
                spark.read.format("shmbus")
                .option("bus", bus_name)
                .option("channels", "/a")
                .option("startingOffsets", '{"/a": 0}')
                .option("failOnDataLoss", fail)
                .load()
            )

        with pytest.raises(Exception, match=r"data loss on '/a'.*expected ids 1\.\.250, the bus holds 151\.\.250"):
            load("true").collect()
        kept = sorted(r.message_id for r in load("false").collect())
        assert kept == list(range(151, 251))
        # "earliest" means the oldest retained message, so it is not a loss
        earliest = spark.read.format("shmbus").option("bus", bus_name).option("channels", "/a").load()
        assert earliest.count() == 100
    finally:
        small.destroy()


# ---------------------------------------------------------------------------------------------- stream reader
def test_stream_reader_admission_control_and_available_now(spark: Any, bus: Bus, tmp_path: Path) -> None:
    for i in range(1, 1001):
        bus.publish("/big", i)
    for i in range(1, 101):
        bus.publish("/small", i)
    out, ckpt = str(tmp_path / "out"), str(tmp_path / "ckpt")
    df = _source(spark, bus, "/big,/small", startingOffsets="earliest", maxRecordsPerTrigger="300")

    def run() -> Any:
        return _run(
            df.select("channel", "message_id")
            .writeStream.format("parquet")
            .option("path", out)
            .option("checkpointLocation", ckpt)
        )

    q = run()
    sizes = [n for _, n in _batches(q) if n]
    assert sizes == [300, 300, 300, 200], sizes  # 1100 rows, never more than 300 a batch
    got = Counter((r.channel, r.message_id) for r in spark.read.parquet(out).collect())
    assert set(got.values()) == {1} and len(got) == 1100
    # /small is not starved behind /big: it is fully read in the first batch (fair share 150 each)
    first = json.loads(q.recentProgress[0]["sources"][0]["endOffset"])
    assert first["ids"] == {"/big": 200, "/small": 100}

    # new data after the query stopped: a restart from the checkpoint reads only that
    for i in range(1001, 1011):
        bus.publish("/big", i)
    q2 = run()
    assert [n for _, n in _batches(q2) if n] == [10]
    assert spark.read.parquet(out).count() == 1110
    name = f"m_{uuid4().hex[:8]}"
    latest = _run(_source(spark, bus, "/big").writeStream.format("memory").queryName(name + "c"))
    assert sum(n for _, n in _batches(latest)) == 0  # default startingOffsets=latest


def test_restart_after_kill_is_exactly_once(spark: Any, bus: Bus, procs: Any, tmp_path: Path) -> None:
    per_channel = 6000
    for i in range(1, per_channel + 1):
        bus.publish("/x", {"i": i})
        bus.publish("/y", {"i": i})
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    log = (tmp_path / "job.log").open("w")
    proc = procs.spawn(
        [sys.executable, str(JOB), bus.name, "/x,/y", str(out), str(ckpt), "500"], stdout=log, stderr=subprocess.STDOUT
    )
    commits = ckpt / "commits"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if commits.exists() and sum(p.name.isdigit() for p in commits.iterdir()) >= 4:
            break
        time.sleep(0.05)
    assert proc.poll() is None, f"the job ended before it could be killed:\n{(tmp_path / 'job.log').read_text()}"
    os.killpg(proc.pid, signal.SIGKILL)  # driver, JVM and Python workers: no shutdown of any kind
    proc.wait(30)
    done = sum(p.name.isdigit() for p in commits.iterdir())
    assert done < 2 * per_channel // 500, "every batch was committed before the kill: nothing to test"
    offsets = sorted(int(p.name) for p in (ckpt / "offsets").iterdir() if p.name.isdigit())
    committed = sorted(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    # the kill landed mid-batch: Spark must re-run that logged, uncommitted batch; or between batches: make Spark
    # replay the last one by dropping its commit
    replayed = offsets[-1] if offsets[-1] > committed[-1] else _drop_last_commit(ckpt)

    q = _run(
        spark.readStream.format("shmbus")
        .option("bus", bus.name)
        .option("channels", "/x,/y")
        .option("startingOffsets", "earliest")
        .option("maxRecordsPerTrigger", "500")
        .load()
        .select("channel", "message_id", "data")
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(ckpt))
    )
    assert _batches(q)[0][0] == replayed, "Spark did not re-run the uncommitted batch: the test would prove nothing"
    rows = spark.read.parquet(str(out)).collect()
    got = Counter((r.channel, r.message_id) for r in rows)
    dupes = [k for k, n in got.items() if n > 1]
    assert not dupes, f"duplicated rows after restart: {dupes[:5]}"
    for ch in ("/x", "/y"):
        ids = sorted(mid for c, mid in got if c == ch)
        assert ids == list(range(1, per_channel + 1)), f"{ch}: gap or missing rows"
    assert all(json.loads(r.data) == {"i": r.message_id} for r in rows)


def test_bus_reset_is_detected(spark: Any, bus: Bus, tmp_path: Path) -> None:
    for i in range(1, 51):
        bus.publish("/r", i)
    ckpt = str(tmp_path / "ckpt")

    def run(fail: str) -> Any:
        return _run(
            _source(spark, bus, "/r", startingOffsets="earliest", failOnDataLoss=fail)
            .select("message_id", "data")
            .writeStream.format("parquet")
            .option("path", str(tmp_path / "out"))
            .option("checkpointLocation", ckpt)
        )

    run("true")
    bus.reset()
    for i in range(1, 61):  # the new ids pass the checkpointed 50: only the epoch tells them apart
        bus.publish("/r", 1000 + i)
    with pytest.raises(Exception, match="was reset"):
        run("true")
    run("false")  # accepted: continues with the new epoch from its first message
    data = sorted(int(r.data) for r in spark.read.parquet(str(tmp_path / "out")).collect())
    assert data == list(range(1, 51)) + list(range(1001, 1061))


# ---------------------------------------------------------------------------------------------- writers
def test_batch_writer_publishes_rows_with_targets(spark: Any, bus: Bus) -> None:
    df = spark.createDataFrame(
        [("/w", '{"a": 1}', [1, 2], None, None), ("/w", '"two"', None, ["g"], ["c9"]), ("/v", "[3]", None, None, None)],
        "channel string, data string, user_ids array<int>, group_ids array<string>, client_ids array<string>",
    ).coalesce(1)
    df.write.format("shmbus").option("bus", bus.name).mode("append").save()
    w = bus.backlog("/w", 0)
    assert [m.data for m in w] == [{"a": 1}, "two"]
    assert (w[0].user_ids, w[0].group_ids, w[1].group_ids, w[1].client_ids) == ([1, 2], None, ["g"], ["c9"])
    assert [m.data for m in bus.backlog("/v", 0)] == [[3]]
    # a fixed channel option, plain-text strings, and struct columns published as objects
    spark.createDataFrame([("hi",), ("there",)], "data string").coalesce(1).write.format("shmbus").option(
        "bus", bus.name
    ).option("channel", "/t").option("dataFormat", "text").mode("append").save()
    assert [m.data for m in bus.backlog("/t", 0)] == ["hi", "there"]
    spark.sql("select '/s' as channel, named_struct('k', 1, 'l', array('x')) as data").write.format("shmbus").option(
        "bus", bus.name
    ).mode("append").save()
    assert [m.data for m in bus.backlog("/s", 0)] == [{"k": 1, "l": ["x"]}]


def test_stream_sink_is_idempotent_per_batch(spark: Any, bus: Bus, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    from shmbus.adapters.spark import last_committed_batch

    for i in range(1, 31):
        bus.publish("/in", {"n": i})
    ckpt = tmp_path / "ckpt"

    def run(sink_id: str | None) -> Any:
        df = _source(spark, bus, "/in", startingOffsets="earliest", maxRecordsPerTrigger="10")
        w = (
            df.select(F.lit("/out").alias("channel"), F.col("data"))
            .writeStream.format("shmbus")
            .option("bus", bus.name)
            .option("checkpointLocation", str(ckpt))
        )
        if sink_id:
            w = w.option("sinkId", sink_id)
        return _run(w)

    q = run("agg")
    assert [n for _, n in _batches(q)] == [10, 10, 10]
    assert [m.data for m in bus.backlog("/out", 0)] == [{"n": i} for i in range(1, 31)]
    assert last_committed_batch(bus, "agg") == 2

    replayed = _drop_last_commit(ckpt)  # the driver "died" after the sink committed batch 2
    q = run("agg")
    assert _batches(q)[0] == (replayed, 10), "Spark did not replay the batch: the test would prove nothing"
    assert bus.last_id("/out") == 30, "a replayed batch was published twice"

    # control: the same replay without sinkId publishes again (what the batch record prevents)
    _drop_last_commit(ckpt)
    run(None)
    assert bus.last_id("/out") == 40


def test_stop_gracefully_under_load_logs_no_error_and_loses_nothing(bus: Bus, procs: Any, tmp_path: Path) -> None:
    """A stop while rows keep arriving lands between micro-batches: the driver logs no ERROR (Spark's abort
    lines) and no sink abort warning, and with a restart from the checkpoint every row reaches the sink once.

    Run by hand with ``plain`` instead of ``graceful``, the same job logs "... is aborting" at ERROR."""
    log_path = tmp_path / "job.log"
    with log_path.open("w") as log:
        proc = procs.spawn(
            [sys.executable, str(STOP_JOB), bus.name, str(tmp_path / "ckpt"), "graceful"],
            stdout=subprocess.PIPE,
            stderr=log,
        )
        out, _ = proc.communicate(timeout=240)
    err = log_path.read_text()
    assert proc.returncode == 0, err[-3000:]
    result = json.loads(out.decode().strip().splitlines()[-1])
    assert result["graceful"], "the query never paused between batches"
    assert " ERROR " not in err, err[-3000:]
    assert "aborted" not in err, err[-3000:]
    got = Counter(m.data["n"] for m in bus.backlog("/out", 0))
    assert result["sent"] > 0
    assert got == Counter(range(1, result["sent"] + 1)), "rows lost or duplicated across a graceful stop"


def test_a_failed_batch_says_what_happened_to_its_rows(spark: Any, bus: Bus, tmp_path: Path) -> None:
    """A real failure (a row the bus refuses) aborts the batch; the abort is recorded on the sink channel with
    the rows that finished tasks published, so monitoring can tell what reached the bus."""
    from pyspark.sql import functions as F

    for i in range(10):
        bus.publish("/good", {"n": i})
        bus.publish("/bad", {"n": i})
    q = (
        _source(spark, bus, "/good,/bad", startingOffsets="earliest")
        .select(
            F.when(F.col("channel") == "/good", F.lit("/out")).otherwise(F.lit("/bad$|$site")).alias("channel"),
            F.col("data"),
        )
        .writeStream.format("shmbus")
        .option("bus", bus.name)
        .option("sinkId", "failing")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        with pytest.raises(Exception, match="site separator"):
            q.awaitTermination(120)
    finally:
        q.stop()
    markers = [m.data for m in bus.backlog("/__shmbus_spark/sink/failing", 0)]
    aborts = [m for m in markers if m.get("kind") == "abort"]
    assert len(aborts) == 1, markers
    assert aborts[0]["batch_id"] == 0
    assert aborts[0]["rows_published"] in (0, 10)
    assert aborts[0]["rows_published"] <= bus.last_id("/out")
    assert not any(m.get("kind") == "commit" for m in markers)


def test_hold_tokens_expire(tmp_path: Path, monkeypatch: Any) -> None:
    """A stop that died mid-way cannot hold sources for ever: its token names its own deadline."""
    from shmbus.adapters.spark import stopping

    monkeypatch.setattr(stopping.tempfile, "gettempdir", lambda: str(tmp_path))
    hold = tmp_path / "shmbus-spark-hold-4242"
    assert not stopping.is_held(4242)
    hold.mkdir()
    (hold / "1000.000-abc").touch()
    assert stopping.is_held(4242, now=999.0)
    assert not stopping.is_held(4242, now=1001.0)
    assert not stopping.is_held(4243, now=999.0)


# ---------------------------------------------------------------------------------------------- Redis path
def test_redis_backlog_read_path(spark: Any, redis_url: str) -> None:
    import redis

    r = redis.Redis.from_url(redis_url)
    chan = f"/spark_{uuid4().hex[:10]}/r"
    keys = [f"__mb_backlog_n_{chan}", f"__mb_backlog_id_n_{chan}"]
    try:
        members = {}
        for cid in range(1, 51):
            env = {"data": {"i": cid}, "user_ids": [7] if cid == 50 else None, "group_ids": None, "client_ids": None}
            members[f"{900 + cid}|{cid}|{chan}|{json.dumps(env)}"] = cid
        r.zadd(keys[0], members)
        r.set(keys[1], 50)

        def load(**options: str) -> Any:
            reader = spark.read.format("shmbus").option("redis_url", redis_url).option("channels", chan)
            for k, v in options.items():
                reader = reader.option(k, v)
            return reader.load()

        rows = sorted(load(maxRecordsPerPartition="20").collect(), key=lambda x: x.message_id)
        assert [(x.message_id, x.global_id, json.loads(x.data)) for x in rows] == [
            (i, 900 + i, {"i": i}) for i in range(1, 51)
        ]
        assert rows[-1].user_ids == ["7"] and rows[0].user_ids is None and rows[0].timestamp is None

        r.zremrangebyscore(keys[0], 1, 10)  # the backlog was trimmed past a consumer at id 5
        with pytest.raises(Exception, match="data loss"):
            load(startingOffsets=json.dumps({chan: 5})).collect()
        assert load(startingOffsets=json.dumps({chan: 5}), failOnDataLoss="false").count() == 40

        stream = (
            spark.readStream.format("shmbus")
            .option("redis_url", redis_url)
            .option("channels", chan)
            .option("startingOffsets", "earliest")
            .load()
        )
        name = f"r_{uuid4().hex[:8]}"
        _run(stream.writeStream.format("memory").queryName(name))
        assert sorted(x.message_id for x in spark.sql(f"select message_id from {name}").collect()) == list(
            range(11, 51)
        )
    finally:
        r.delete(*keys)
        r.close()


def test_sink_through_redis_reaches_bridged_hosts_once(spark: Any, bus: Bus, redis_server: Any, tmp_path: Path) -> None:
    """The cluster path of the sink: executors publish through Redis (the bridge, relay off, ids from Redis), and a
    web host whose bus is bridged to the same Redis gets every row once, with the same ids; a replayed batch is
    skipped using the sink records kept in Redis."""
    from pyspark.sql import functions as F

    from shmbus.adapters.redis import RedisBridge

    web = Bus(
        f"{bus.name}w", ring_size=1 << 20, keepalive_interval=0, engine=RedisBridge(redis_server.url), create=True
    )
    try:
        deadline = time.monotonic() + 20
        while not web.health()["engine_health"]["relay"]:  # the web host's relay is up before anything is sent
            assert time.monotonic() < deadline, "no relay on the web host"
            time.sleep(0.05)
        for i in range(1, 31):
            bus.publish("/in", {"n": i})
        ckpt = tmp_path / "ckpt"

        def run() -> Any:
            df = _source(spark, bus, "/in", startingOffsets="earliest", maxRecordsPerTrigger="10")
            return _run(
                df.select(F.lit("/out").alias("channel"), F.col("data"))
                .writeStream.format("shmbus")
                .option("redis_url", redis_server.url)
                .option("sinkId", "agg")
                .option("checkpointLocation", str(ckpt))
            )

        q = run()
        assert [n for _, n in _batches(q)] == [10, 10, 10]

        def out() -> list[Any]:
            return [(m.message_id, m.data) for m in web.backlog("/out", 0)]

        deadline = time.monotonic() + 20
        while len(out()) < 30:
            assert time.monotonic() < deadline, f"rows did not reach the web host: {out()}"
            time.sleep(0.05)
        assert out() == [(i, {"n": i}) for i in range(1, 31)]  # Redis's ids, in order, once

        replayed = _drop_last_commit(ckpt)
        q = run()
        assert _batches(q)[0] == (replayed, 10), "Spark did not replay the batch: the test would prove nothing"
        time.sleep(0.5)
        assert web.last_id("/out") == 30, "a replayed batch was published twice"
        import redis

        assert redis.Redis.from_url(redis_server.url).get("__mb_backlog_id_n_/out") == b"30"
        assert not [f for f in os.listdir("/dev/shm") if f.startswith("shmbus.spark-sink-")], "sink bus left"
    finally:
        web.destroy()


def test_postgres_source_and_sink_reach_bridged_hosts_once(
    spark: Any, bus: Bus, database_url: str, bus_name: str, tmp_path: Path
) -> None:
    """``postgres_dsn`` on both sides: the source reads the gem's table (ids sparse within a channel: no false data
    loss), the sink writes rows into it (the bridge with relay off), and a web host bridged to the table gets every
    row once with the table's ids; a replayed batch is skipped using the sink records kept in the table."""
    import psycopg
    from pyspark.sql import functions as F

    from shmbus.adapters.postgres import PostgresBridge

    schema = f"s_{bus_name}".lower()
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    dsn = psycopg.conninfo.make_conninfo(database_url, options=f"-c search_path={schema}")
    web = Bus(
        f"{bus.name}w",
        ring_size=1 << 20,
        keepalive_interval=0,
        engine=PostgresBridge(dsn, notify_channel=f"_mb_{bus_name}"),
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
            web.publish("/noise", i)  # the table's ids: /in gets every other one
        rows = spark.read.format("shmbus").option("postgres_dsn", dsn).option("channels", "/in").load().collect()
        assert [(r["message_id"], json.loads(r["data"])) for r in rows] == [(m, {"n": i}) for i, m in enumerate(ids, 1)]
        ckpt = tmp_path / "ckpt"

        def run() -> Any:
            df = (
                spark.readStream.format("shmbus")
                .option("postgres_dsn", dsn)
                .option("channels", "/in")
                .option("startingOffsets", "earliest")
                .load()
            )
            return _run(
                df.select(F.lit("/out").alias("channel"), F.col("data"))
                .writeStream.format("shmbus")
                .option("postgres_dsn", dsn)
                .option("postgres_notify_channel", f"_mb_{bus_name}")
                .option("sinkId", "pg")
                .option("checkpointLocation", str(ckpt))
            )

        sink_30_rows_once(run, web, ckpt, deadline=20)
    finally:
        web.destroy()
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
