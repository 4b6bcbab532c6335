"""The sink: publishing rows to the bus, exactly once per (batch, partition) across retries."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSourceStreamWriter,
    DataSourceWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    StructType,
)

from shmbus import jsonlib
from shmbus.channels import check_channel

from .options import (
    SINK_BACKLOG,
    SparkOptions,
    sink_channel,
)

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------- writing
@dataclass
class SinkCommit(WriterCommitMessage):
    """What a write task reports to the driver-side ``commit``."""

    partition: int
    rows: int
    skipped: bool = False


def _plain(value: Any) -> Any:
    """Spark Row/struct values -> plain dicts/lists the codec can encode."""
    if hasattr(value, "asDict"):
        return {k: _plain(v) for k, v in value.asDict().items()}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _ids(value: Any) -> list[Any] | None:
    if value is None:
        return None
    out = list(value)
    return out or None


class _BusWriterBase:
    """Publishes each row ``(channel, data[, user_ids, group_ids, client_ids, site_id])``.

    ``dataFormat``: ``json`` (default; a string ``data`` is JSON text and is published as the value it encodes,
    the inverse of the reader), ``text`` (strings are published as strings), ``binary`` (bytes are stored as the
    bus codec's encoded bytes, verbatim). Non-string columns (numbers, structs, maps, arrays) are published as
    their plain Python value.
    """

    def __init__(self, opts: SparkOptions, schema: StructType) -> None:
        if not opts.location.bus and not opts.location.remote:
            raise ValueError(
                "the shmbus sink needs .option('bus', NAME) (same host), .option('redis_url', URL), "
                ".option('postgres_dsn', DSN) or .option('nats_url', URL) (a cluster: rows go to the shared store, "
                "and every host's bridge relay copies them into its bus)"
            )
        names = schema.fieldNames()
        if "data" not in names:
            raise ValueError(f"the shmbus sink needs a 'data' column; got {names}")
        if "channel" not in names and not opts.channel:
            raise ValueError("the shmbus sink needs a 'channel' column or .option('channel', '/name')")
        if opts.channel:
            check_channel(opts.channel, reserved=False)  # a typed InvalidChannel before any row is read
        self.opts = opts
        self.columns = tuple(names)

    def _publish_rows(self, bus: Any, rows: Iterator[Any]) -> int:
        opts = self.opts
        cols = set(self.columns)
        has_channel = "channel" in cols
        targeted = [c for c in ("user_ids", "group_ids", "client_ids") if c in cols]
        has_site = "site_id" in cols
        fmt = opts.write_format
        extra: dict[str, Any] = {}
        if opts.max_backlog_size:
            extra["max_backlog_size"] = opts.max_backlog_size
        if opts.max_backlog_age:
            extra["max_backlog_age"] = opts.max_backlog_age
        n = 0
        for row in rows:
            channel = row["channel"] if has_channel else opts.channel
            if channel is None:
                channel = opts.channel
            if not channel:
                raise ValueError(f"row without a channel (no 'channel' value and no channel option): {row!r}")
            # the one channel rule, and never the bus's own /__ channels (a row could forge a DistributedCache
            # operation or a sink's progress record): an InvalidChannel fails the task, nothing of the row is sent
            check_channel(channel, reserved=False)
            data = row["data"]
            options = dict(extra)
            for column in targeted:
                ids = _ids(row[column])
                if ids is not None:
                    options[column] = ids
            if has_site and row["site_id"]:
                options["site_id"] = row["site_id"]
            # through the bus's engine: the segment itself, or Redis when the sink writes through the bridge
            if isinstance(data, (bytes, bytearray)) and fmt == "binary":
                bus.publish_encoded(channel, bytes(data), **options)
            else:
                data = jsonlib.loads(data) if isinstance(data, str) and fmt == "json" else _plain(data)
                bus.publish(channel, data, **options)
            n += 1
        return n

    def _open_bus(self) -> Any:
        loc = self.opts.location
        if loc.bus:
            from .readers import ShmReader

            return ShmReader(loc).bus
        if loc.postgres_dsn:
            return _BridgeSinkBus.postgres(loc.postgres_dsn, loc.postgres_channel)
        if loc.nats_url:
            return _BridgeSinkBus.nats(loc.nats_url, loc.nats_stream)
        if loc.rabbitmq_url:
            return _BridgeSinkBus.rabbitmq(loc.rabbitmq_url, loc.rabbitmq_stream)
        return _BridgeSinkBus.redis(loc.redis_url or "")

    def _sink_markers(self, bus: Any, sink: str) -> list[Any]:
        """The sink channel's progress records, oldest first (from Redis when writing through it)."""
        if isinstance(bus, _BridgeSinkBus):
            from .readers import open_reader

            reader = open_reader(self.opts.location)
            try:
                last = reader.last_ids([sink])[sink]
                chunk = reader.read(sink, 0, last)
                return [reader.decode(p) for p in chunk.payloads]
            finally:
                reader.close()
        return [m.data for m in bus.backlog(sink, 0)]


class BusBatchWriter(_BusWriterBase, DataSourceWriter):
    """``df.write.format("shmbus").mode("append").save()``: publish every row (at-least-once on task retry)."""

    def write(self, iterator: Iterator[Any]) -> SinkCommit:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        bus = self._open_bus()
        try:
            n = self._publish_rows(bus, iterator)
        finally:
            bus.close()
        return SinkCommit(ctx.partitionId() if ctx else 0, n)


class BusStreamWriter(_BusWriterBase, DataSourceStreamWriter):
    """``df.writeStream.format("shmbus")``.

    With ``sinkId`` set, a batch already recorded on ``/__shmbus_spark/sink/<sinkId>`` is not published again
    when Spark replays it after a driver crash: ``commit`` records the batch id, and each task also records
    ``(batch, partition)`` after publishing, so a replay skips finished partitions. A task that dies *while*
    publishing still republishes its partition's rows on retry: at-least-once within a partition.
    """

    def write(self, iterator: Iterator[Any]) -> SinkCommit:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        partition = ctx.partitionId() if ctx else 0
        raw_batch = ctx.getLocalProperty("streaming.sql.batchId") if ctx else None
        batch_id = int(raw_batch) if raw_batch not in (None, "") else None
        bus = self._open_bus()
        try:
            sink = sink_channel(self.opts.sink_id) if self.opts.sink_id else None
            if (
                sink is not None
                and batch_id is not None
                and _already_done(self._sink_markers(bus, sink), batch_id, partition)
            ):
                for _ in iterator:  # drain: Spark expects the input consumed
                    pass
                return SinkCommit(partition, 0, skipped=True)
            n = self._publish_rows(bus, iterator)
            if sink is not None and batch_id is not None:
                bus.publish(
                    sink,
                    {"kind": "task", "batch_id": batch_id, "partition": partition, "rows": n},
                    max_backlog_size=SINK_BACKLOG,
                )
        finally:
            bus.close()
        return SinkCommit(partition, n)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if not self.opts.sink_id:
            return
        rows = sum(m.rows for m in messages if isinstance(m, SinkCommit))
        skipped = sum(1 for m in messages if isinstance(m, SinkCommit) and m.skipped)
        bus = self._open_bus()
        try:
            bus.publish(
                sink_channel(self.opts.sink_id),
                {"kind": "commit", "batch_id": int(batchId), "rows": rows, "skipped_tasks": skipped},
                max_backlog_size=SINK_BACKLOG,
            )
        finally:
            bus.close()

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Say what happened to the batch's rows (in the log and, with ``sinkId``, on the sink channel).

        Rows already published cannot be taken back. With ``sinkId``, the rerun of this batch skips the tasks
        that finished, so their rows reach the bus once; without it, the rerun publishes them again.
        """
        done = [m for m in messages if isinstance(m, SinkCommit)]
        rows = sum(m.rows for m in done)
        sink_id = self.opts.sink_id
        log.warning(
            "shmbus sink %s: batch %s aborted; %d of its %d tasks had finished and published %d rows, which stay "
            "published; %s",
            sink_id or "(no sinkId)",
            batchId,
            len(done),
            len(messages),
            rows,
            "a rerun of the batch skips those tasks"
            if sink_id
            else "a rerun of the batch publishes them again (set sinkId to prevent that)",
        )
        if not sink_id:
            return
        bus = self._open_bus()
        try:
            bus.publish(
                sink_channel(sink_id),
                {"kind": "abort", "batch_id": int(batchId), "tasks_finished": len(done), "rows_published": rows},
                max_backlog_size=SINK_BACKLOG,
            )
        finally:
            bus.close()


def _already_done(markers: list[Any], batch_id: int, partition: int) -> bool:
    """True when ``batch_id`` was committed, or this partition of it finished, according to the sink channel."""
    for d in reversed(markers):
        if not isinstance(d, dict):
            continue
        b = int(d.get("batch_id", -1))
        if d.get("kind") == "commit":
            if b >= batch_id:
                return True
            if b < batch_id - 1:
                # markers older than the last commit before this batch cannot concern it
                return False
        elif d.get("kind") == "task" and b == batch_id and d.get("partition") == partition:
            return True
    return False


class _BridgeSinkBus:
    """What an executor publishes through when the sink writes via a cluster (``redis_url`` or ``postgres_dsn``):
    a private, throwaway segment whose engine is that bridge with relaying off, so rows go to Redis or the gem's
    PostgreSQL table with the ids they assign (the gem's layout), in round trips of up to 1000 rows in order, and
    each bus host's relay copies them into its own segment. Destroyed when the task ends."""

    def __init__(self, bridge: Any) -> None:
        import uuid

        from shmbus import Bus

        self.bridge = bridge
        self.bus = Bus(
            f"spark-sink-{os.getpid()}-{uuid.uuid4().hex[:8]}",
            ring_size=1 << 20,
            max_channels=1024,
            keepalive_interval=0,
            engine=bridge,
            create=True,  # a private segment of this task
        )
        self._batch = bridge.batch()
        self._batch.__enter__()  # pipelined

    @classmethod
    def redis(cls, url: str) -> _BridgeSinkBus:
        from ..redis import RedisBridge

        return cls(RedisBridge(url, relay=False, local_wait=0))

    @classmethod
    def postgres(cls, dsn: str, notify_channel: str | None) -> _BridgeSinkBus:
        from ..postgres import PostgresBridge

        return cls(PostgresBridge(dsn, notify_channel=notify_channel, relay=False, local_wait=0))

    @classmethod
    def nats(cls, url: str, stream: str | None) -> _BridgeSinkBus:
        from ..nats import NatsBridge

        return cls(NatsBridge(url, stream=stream, relay=False, local_wait=0))

    @classmethod
    def rabbitmq(cls, url: str, stream: str | None) -> _BridgeSinkBus:
        from ..rabbitmq import RabbitBridge

        return cls(RabbitBridge(url, stream=stream, relay=False, local_wait=0))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.bus, name)

    def close(self) -> None:
        try:
            self._batch.__exit__(None, None, None)  # sends what is queued; raises if the bridge refused it
        finally:
            self.bus.destroy()


def last_committed_batch(bus: Any, sink_id: str) -> int | None:
    """The newest batch id sink ``sink_id`` committed on ``bus`` (for monitoring and tests)."""
    for msg in reversed(bus.backlog(sink_channel(sink_id), 0)):
        d = msg.data
        if isinstance(d, dict) and d.get("kind") == "commit":
            return int(d["batch_id"])
    return None
