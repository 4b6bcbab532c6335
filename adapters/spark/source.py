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

import json
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from shmbus.message import decode_meta

from .readers import Chunk, Location, open_reader

try:  # 4.2+: admission control and Trigger.AvailableNow
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
except ImportError as exc:  # pragma: no cover - guarded by the extra's version floor
    raise ImportError("shmbus.adapters.spark needs pyspark >= 4.2 (pip install 'shmbus[spark]')") from exc

__all__ = [
    "SINK_CHANNEL_PREFIX",
    "BusDataLossError",
    "ShmbusDataSource",
    "decode_offset",
    "encode_offset",
    "register",
    "schema_for",
    "sink_channel",
    "spark_session",
]

log = logging.getLogger("shmbus.spark")

FORMAT_NAME = "shmbus"
#: Where the idempotent sink records its progress: ``/__shmbus_spark/sink/<sinkId>``.
SINK_CHANNEL_PREFIX = "/__shmbus_spark/sink/"
#: Task and commit markers kept per sink channel (a replayed batch must still find its batch's markers).
SINK_BACKLOG = 4096
DEFAULT_MAX_RECORDS_PER_PARTITION = 250_000
DEFAULT_ARROW_BATCH = 65_536

_LIST_STR = pa.list_(pa.string())


class BusDataLossError(RuntimeError):
    """Messages the query needs are no longer on the bus (trimmed, overwritten, expired, or the bus was reset).

    Raised when ``failOnDataLoss`` is true (the default), as Spark's Kafka source does; with
    ``failOnDataLoss=false`` the same condition is logged and the missing messages are skipped.
    """


# ---------------------------------------------------------------------------------------------- helpers
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


def sink_channel(sink_id: str) -> str:
    """The bus channel where sink ``sink_id`` records which batches it published."""
    return SINK_CHANNEL_PREFIX + sink_id


def encode_offset(epoch: int, ids: dict[str, int]) -> dict[str, Any]:
    """The offset dict Spark logs: fixed top-level key order and sorted channels (see module docstring)."""
    return {"epoch": int(epoch), "ids": {ch: int(ids[ch]) for ch in sorted(ids)}}


def decode_offset(offset: dict[str, Any] | str) -> tuple[int, dict[str, int]]:
    """``(epoch, ids)`` from an offset dict (or its JSON text)."""
    data: dict[str, Any] = json.loads(offset) if isinstance(offset, str) else offset
    return int(data.get("epoch", 0)), {str(k): int(v) for k, v in (data.get("ids") or {}).items()}


def schema_for(data_format: str = "string") -> StructType:
    """The source schema; ``data`` is the message's JSON text (``string``) or its stored codec bytes (``binary``)."""
    data_type = BinaryType() if data_format == "binary" else StringType()
    return StructType([
        StructField("channel", StringType(), False),
        StructField("message_id", LongType(), False),
        StructField("global_id", LongType(), False),
        StructField("data", data_type, True),
        StructField("timestamp", TimestampType(), True),
        StructField("site_id", StringType(), True),
        StructField("user_ids", ArrayType(StringType()), True),
        StructField("group_ids", ArrayType(StringType()), True),
        StructField("client_ids", ArrayType(StringType()), True),
    ])


def _bool(value: Any, default: bool) -> bool:
    if value is None:
        return default
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"expected true/false, got {value!r}")


def _int(options: Any, key: str, default: int | None) -> int | None:
    value = options.get(key)
    if value is None or str(value).strip() == "":
        return default
    n = int(str(value).strip())
    if n <= 0:
        raise ValueError(f"option {key} must be a positive integer, got {value!r}")
    return n


def _channels(value: Any) -> tuple[str, ...]:
    """``"/a,/b"`` or a JSON list; order-insensitive and deduplicated (offsets sort them anyway)."""
    if value is None:
        return ()
    text = str(value).strip()
    items = json.loads(text) if text.startswith("[") else text.split(",")
    return tuple(sorted({str(c).strip() for c in items if str(c).strip()}))


@dataclass(frozen=True)
class Options:
    """Every option parsed once (Spark passes them as strings, keys case-insensitive) into plain data."""

    location: Location
    channels: tuple[str, ...]
    starting: str
    ending: str
    max_records_per_trigger: int | None
    max_records_per_partition: int
    fail_on_data_loss: bool
    data_format: str
    arrow_batch_size: int
    # writer
    channel: str | None
    sink_id: str | None
    write_format: str
    max_backlog_size: int | None
    max_backlog_age: float | None

    @classmethod
    def parse(cls, options: Any) -> Options:
        get = options.get
        data_format = str(get("dataFormat", "string")).lower()
        write_format = str(get("dataFormat", "json")).lower()
        write_format = {"string": "json"}.get(write_format, write_format)
        age = get("maxBacklogAge")
        return cls(
            location=Location(
                bus=get("bus") or None,
                redis_url=get("redis_url") or get("redisUrl") or None,
                redis_prefix=get("redisKeyPrefix") or "",
                site_id=get("siteId") or get("site_id") or None,
            ),
            channels=_channels(get("channels") or get("channel")),
            starting=str(get("startingOffsets") or "").strip(),
            ending=str(get("endingOffsets") or "latest").strip(),
            max_records_per_trigger=_int(options, "maxRecordsPerTrigger", None),
            max_records_per_partition=_int(options, "maxRecordsPerPartition", DEFAULT_MAX_RECORDS_PER_PARTITION)
            or DEFAULT_MAX_RECORDS_PER_PARTITION,
            fail_on_data_loss=_bool(get("failOnDataLoss"), True),
            data_format=data_format,
            arrow_batch_size=_int(options, "arrowBatchSize", DEFAULT_ARROW_BATCH) or DEFAULT_ARROW_BATCH,
            channel=get("channel") or None,
            sink_id=get("sinkId") or None,
            write_format=write_format,
            max_backlog_size=_int(options, "maxBacklogSize", None),
            max_backlog_age=float(age) if age else None,
        )

    def require_source(self) -> None:
        if not self.location.bus and not self.location.redis_url:
            raise ValueError("the shmbus source needs .option('bus', NAME) (same host) or .option('redis_url', URL)")
        if not self.channels:
            raise ValueError("the shmbus source needs .option('channels', '/a,/b') (comma list or JSON list)")
        if self.data_format not in ("string", "binary"):
            raise ValueError(f"the shmbus source's dataFormat must be 'string' or 'binary', got {self.data_format!r}")


# ---------------------------------------------------------------------------------------------- data source
class ShmbusDataSource(DataSource):
    """``format("shmbus")``: streaming and batch reader, streaming and batch writer."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        self.opts = Options.parse(options)

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


# ---------------------------------------------------------------------------------------------- reading
@dataclass
class BusPartition(InputPartition):
    """One task: messages of ``channel`` with ``after < id <= upto`` in bus epoch ``epoch``."""

    channel: str
    after: int
    upto: int
    epoch: int


def _resolve_start(opts: Options, reader: Any, channels: Sequence[str], spec: str, default: str) -> dict[str, int]:
    """Per-channel "last id already consumed" for ``startingOffsets`` (earliest | latest | JSON)."""
    spec = spec or default
    if spec == "latest":
        return reader.last_ids(list(channels))
    if spec == "earliest":
        return {ch: max(reader.first_available(ch) - 1, 0) for ch in channels}
    given = json.loads(spec)
    if "ids" in given and isinstance(given.get("ids"), dict):
        given = given["ids"]
    heads = reader.last_ids(list(channels))
    out = {}
    for ch in channels:
        v = int(given.get(ch, -2))
        if v == -1:  # Kafka's convention: -1 latest, -2 earliest
            out[ch] = heads[ch]
        elif v == -2:
            out[ch] = max(reader.first_available(ch) - 1, 0)
        else:
            out[ch] = v
    return out


def _plan(opts: Options, start_ids: dict[str, int], end_ids: dict[str, int], epoch: int) -> list[BusPartition]:
    """Split ``(start, end]`` per channel into chunks of at most ``maxRecordsPerPartition`` ids."""
    parts: list[BusPartition] = []
    size = opts.max_records_per_partition
    for ch in sorted(end_ids):
        hi = end_ids[ch]
        lo = start_ids.get(ch, hi)  # a channel new in this batch only records where it starts
        if lo > hi:  # ids went backwards and failOnDataLoss=false accepted it: the channel restarted
            lo = 0
        while lo < hi:
            step = min(size, hi - lo)
            parts.append(BusPartition(ch, lo, lo + step, epoch))
            lo += step
    return parts


def _loss(opts: Options, message: str) -> None:
    if opts.fail_on_data_loss:
        raise BusDataLossError(message + " (set failOnDataLoss=false to skip lost messages instead, or delete the "
                               "query's checkpoint directory to start over from the bus as it is now)")
    log.warning("shmbus spark source: %s; skipping (failOnDataLoss=false)", message)


def _targets(metas: list[bytes]) -> tuple[pa.Array, pa.Array, pa.Array]:
    """``(user_ids, group_ids, client_ids)`` columns; all-null without decoding when nothing is targeted."""
    n = len(metas)
    if not any(metas):
        nulls = pa.nulls(n, _LIST_STR)
        return nulls, nulls, nulls
    clients: list[Any] = []
    users: list[Any] = []
    groups: list[Any] = []
    for meta in metas:
        c, u, g = decode_meta(meta)  # stored order: client, user, group
        for col, ids in ((clients, c), (users, u), (groups, g)):
            col.append(None if ids is None else [str(i) for i in ids])
    return pa.array(users, _LIST_STR), pa.array(groups, _LIST_STR), pa.array(clients, _LIST_STR)


def _to_arrow(opts: Options, reader: Any, channel: str, chunk: Chunk, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """Columns -> RecordBatches of the source schema (about 2x faster in Spark than yielding tuples)."""
    n_total = len(chunk.message_ids)
    step = opts.arrow_batch_size
    for lo in range(0, n_total, step):
        hi = min(lo + step, n_total)
        n = hi - lo
        payloads = chunk.payloads[lo:hi]
        if opts.data_format == "binary":
            data = pa.array(payloads, pa.binary())
        elif chunk.is_json:
            data = pa.array(payloads, pa.binary()).cast(pa.string())  # JSON text as stored: no decoding
        else:
            data = pa.array([json.dumps(reader.decode(p), separators=(",", ":"), default=_jsonable)
                             for p in payloads], pa.string())
        ts = chunk.timestamps[lo:hi]
        if ts and ts[0] is not None and None not in ts:
            micros = pc.cast(pc.multiply(pa.array(ts, pa.float64()), 1e6), pa.int64(), safe=False)
            ts_arr = micros.cast(pa.timestamp("us", tz="UTC"))
        else:
            ts_arr = pa.array([None if t is None else int(t * 1e6) for t in ts], pa.int64()).cast(
                pa.timestamp("us", tz="UTC"))
        users, groups, clients = _targets(chunk.metas[lo:hi])
        columns = [
            pa.repeat(pa.scalar(channel, pa.string()), n),
            pa.array(chunk.message_ids[lo:hi], pa.int64()),
            pa.array(chunk.global_ids[lo:hi], pa.int64()),
            data,
            ts_arr,
            pa.repeat(pa.scalar(reader.location.site_id, pa.string()), n),
            users,
            groups,
            clients,
        ]
        yield pa.RecordBatch.from_arrays(columns, schema=schema)


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, (bytes, bytearray)):
        return obj.decode("utf-8", "replace")
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def _arrow_schema(schema: StructType) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


def read_partition(opts: Options, schema: StructType, part: BusPartition) -> Iterator[pa.RecordBatch]:
    """What every executor task runs: attach, read ``(after, upto]``, check it is complete, detach, yield."""
    reader = open_reader(opts.location)
    try:
        epoch = reader.epoch()
        if epoch != part.epoch:
            _loss(opts, f"{opts.location.describe()} was reset (epoch {part.epoch} -> {epoch}) before ids "
                        f"{part.after + 1}..{part.upto} of {part.channel!r} were read")
            return
        chunk = reader.read(part.channel, part.after, part.upto)
        if reader.epoch() != part.epoch:  # reset while we read: what we got may belong to the new epoch
            _loss(opts, f"{opts.location.describe()} was reset while reading {part.channel!r}")
            return
    finally:
        reader.close()
    expected = part.upto - part.after
    got = len(chunk.message_ids)
    if got != expected or (got and chunk.message_ids[0] != part.after + 1):
        _loss(opts, f"data loss on {part.channel!r} ({opts.location.describe()}): expected ids "
                    f"{part.after + 1}..{part.upto}, the bus holds {chunk.first_available}..{chunk.last_id} "
                    f"(backlog trimmed, ring overwritten or channel expired); {expected - got} message(s) lost")
    if got:
        yield from _to_arrow(opts, reader, part.channel, chunk, _arrow_schema(schema))


class BusBatchReader(DataSourceReader):
    """``spark.read.format("shmbus")``: the backlog between ``startingOffsets`` (default earliest) and
    ``endingOffsets`` (default latest), snapshotted when the query is planned."""

    def __init__(self, opts: Options, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema

    def partitions(self) -> Sequence[InputPartition]:
        reader = open_reader(self.opts.location)
        try:
            epoch = reader.epoch()
            chans = list(self.opts.channels)
            start = _resolve_start(self.opts, reader, chans, self.opts.starting, "earliest")
            end = _resolve_start(self.opts, reader, chans, self.opts.ending, "latest")
        finally:
            reader.close()
        return _plan(self.opts, start, {ch: max(end[ch], start[ch]) for ch in chans}, epoch)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, BusPartition)
        return read_partition(self.opts, self.schema, partition)


class BusStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("shmbus")``.

    Planning methods run in one long-lived driver-side process, so the open reader is cached there (and dropped
    when pickled); ``read()`` runs on executors and opens its own.
    """

    def __init__(self, opts: Options, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema
        self._reader: Any = None
        self._target: tuple[int, dict[str, int]] | None = None
        self._initial: dict[str, Any] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_reader"] = None
        return state

    def _rd(self) -> Any:
        if self._reader is None:
            self._reader = open_reader(self.opts.location)
        return self._reader

    def initialOffset(self) -> dict[str, Any]:
        # Spark calls this more than once for a new query (for the first batch's start, then again when
        # planning it): resolve "latest"/"earliest" once, or the two calls could disagree.
        if self._initial is None:
            reader = self._rd()
            ids = _resolve_start(self.opts, reader, self.opts.channels, self.opts.starting, "latest")
            self._initial = encode_offset(reader.epoch(), ids)
        return self._initial

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_records_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        reader = self._rd()
        self._target = (reader.epoch(), reader.last_ids(list(self.opts.channels)))

    def reportLatestOffset(self) -> dict[str, Any] | None:
        reader = self._rd()
        return encode_offset(reader.epoch(), reader.last_ids(list(self.opts.channels)))

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        reader = self._rd()
        epoch = reader.epoch()
        start_epoch, start_ids = decode_offset(start)
        chans = list(self.opts.channels)
        if start_epoch != epoch:
            _loss(self.opts, f"{self.opts.location.describe()} was reset: the checkpoint is from epoch "
                             f"{start_epoch}, the bus is at epoch {epoch}; messages not yet read are gone")
            start_ids = {ch: 0 for ch in start_ids}
        heads = reader.last_ids(chans)
        if self._target is not None and self._target[0] == epoch:
            heads = {ch: min(heads[ch], self._target[1].get(ch, heads[ch])) for ch in chans}
        base = dict(start_ids)
        new = [ch for ch in chans if ch not in base]
        if new:  # channels added since the checkpoint start per startingOffsets, recorded in this offset
            base.update(_resolve_start(self.opts, reader, new, self.opts.starting, "latest"))
        back = {ch: (base[ch], heads[ch]) for ch in chans if heads[ch] < base[ch]}
        if back:
            _loss(self.opts, f"message ids went backwards on {self.opts.location.describe()} (channel expired or "
                             f"store flushed): {back}")
            for ch in back:
                base[ch] = 0
        avail = {ch: heads[ch] - base[ch] for ch in chans}
        take = _fair_share(avail, limit.max_rows) if isinstance(limit, ReadMaxRows) else avail
        end = dict(base)  # channels no longer configured stay in the offset, frozen
        for ch in chans:
            end[ch] = base[ch] + take[ch]
        return encode_offset(epoch, end)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        s_epoch, s_ids = decode_offset(start)
        e_epoch, e_ids = decode_offset(end)
        if s_epoch != e_epoch:  # a reset accepted with failOnDataLoss=false: the new epoch starts at 0
            s_ids = {ch: 0 for ch in s_ids}
        chans = set(self.opts.channels)
        return _plan(self.opts, s_ids, {ch: v for ch, v in e_ids.items() if ch in chans}, e_epoch)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, BusPartition)
        return read_partition(self.opts, self.schema, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: the bus keeps no per-consumer state (Spark's checkpoint is the consumer offset)."""

    def stop(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None


def _fair_share(avail: dict[str, int], budget: int) -> dict[str, int]:
    """Split ``budget`` rows over channels round-robin style (water filling), so a busy channel cannot starve
    the others; deterministic (sorted channels) so a replanned batch gets the same offsets."""
    take = {ch: 0 for ch in avail}
    left = budget
    active = sorted(ch for ch, n in avail.items() if n > 0)
    while left > 0 and active:
        share = max(left // len(active), 1)
        still = []
        for ch in active:
            if left <= 0:
                break
            give = min(share, avail[ch] - take[ch], left)
            take[ch] += give
            left -= give
            if take[ch] < avail[ch]:
                still.append(ch)
        active = still
    return take


# ---------------------------------------------------------------------------------------------- writing
@dataclass
class SinkCommit(WriterCommitMessage):
    """What a write task reports to the driver-side ``commit``."""

    partition: int
    rows: int
    skipped: bool = False


def _row_value(row: Any, name: str) -> Any:
    try:
        return row[name]
    except (KeyError, ValueError, IndexError):
        return None


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

    def __init__(self, opts: Options, schema: StructType) -> None:
        if not opts.location.bus and not opts.location.redis_url:
            raise ValueError("the shmbus sink needs .option('bus', NAME) (same host) or .option('redis_url', URL) "
                             "(a cluster: rows go to Redis, and every host's bridge relay copies them into its bus)")
        names = schema.fieldNames()
        if "data" not in names:
            raise ValueError(f"the shmbus sink needs a 'data' column; got {names}")
        if "channel" not in names and not opts.channel:
            raise ValueError("the shmbus sink needs a 'channel' column or .option('channel', '/name')")
        self.opts = opts
        self.columns = tuple(names)

    def _publish_rows(self, bus: Any, rows: Iterator[Any]) -> int:
        opts = self.opts
        cols = set(self.columns)
        has_channel = "channel" in cols
        targeted = [c for c in ("user_ids", "group_ids", "client_ids") if c in cols]
        has_site = "site_id" in cols
        fmt = opts.write_format
        loads: Any = json.loads
        try:
            import orjson

            loads = orjson.loads
        except ImportError:  # pragma: no cover
            pass
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
            data = row["data"]
            kw = dict(extra)
            for c in targeted:
                ids = _ids(row[c])
                if ids is not None:
                    kw[c] = ids
            if has_site and row["site_id"]:
                kw["site_id"] = row["site_id"]
            if isinstance(data, (bytes, bytearray)) and fmt == "binary":
                self._append_raw(bus, channel, bytes(data), kw)
            else:
                data = loads(data) if isinstance(data, str) and fmt == "json" else _plain(data)
                bus.publish(channel, data, **kw)
            n += 1
        return n

    @staticmethod
    def _append_raw(bus: Any, channel: str, payload: bytes, kw: dict[str, Any]) -> None:
        from shmbus.engines import Envelope
        from shmbus.message import encode_meta

        meta = b""
        if any(k in kw for k in ("user_ids", "group_ids", "client_ids")):
            meta = encode_meta(kw.get("client_ids"), kw.get("user_ids"), kw.get("group_ids"))
        # through the bus's engine: the segment itself, or Redis when the sink writes through the bridge
        bus.default.publish(bus, Envelope(channel, kw.get("site_id"), payload, meta,
                                          kw.get("max_backlog_size", bus.max_backlog_size),
                                          kw.get("max_backlog_age", bus.max_backlog_age)))

    def _open_bus(self) -> Any:
        loc = self.opts.location
        if loc.bus:
            from .readers import ShmReader

            return ShmReader(loc).bus
        return _RedisSinkBus(loc.redis_url or "")

    def _sink_markers(self, bus: Any, sink: str) -> list[Any]:
        """The sink channel's progress records, oldest first (from Redis when writing through it)."""
        if isinstance(bus, _RedisSinkBus):
            from .readers import RedisReader

            reader = RedisReader(self.opts.location)
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
            if sink is not None and batch_id is not None and _already_done(self._sink_markers(bus, sink), batch_id,
                                                                         partition):
                for _ in iterator:  # drain: Spark expects the input consumed
                    pass
                return SinkCommit(partition, 0, skipped=True)
            n = self._publish_rows(bus, iterator)
            if sink is not None and batch_id is not None:
                bus.publish(sink, {"kind": "task", "batch_id": batch_id, "partition": partition, "rows": n},
                            max_backlog_size=SINK_BACKLOG)
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
            bus.publish(sink_channel(self.opts.sink_id),
                        {"kind": "commit", "batch_id": int(batchId), "rows": rows, "skipped_tasks": skipped},
                        max_backlog_size=SINK_BACKLOG)
        finally:
            bus.close()

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("shmbus sink %s: batch %s aborted; rows published by finished tasks stay published",
                    self.opts.sink_id, batchId)


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


class _RedisSinkBus:
    """What an executor publishes through when the sink writes via ``redis_url`` (a cluster): a private, throwaway
    segment whose engine is the Redis bridge with relaying off, so rows go to Redis with Redis-assigned ids (the
    gem's layout) and each bus host's relay copies them into its own segment. Destroyed when the task ends."""

    def __init__(self, url: str) -> None:
        import uuid

        from shmbus import Bus

        from ..redis import RedisBridge

        self.bridge = RedisBridge(url, relay=False, local_wait=0)
        self.bus = Bus(f"spark-sink-{os.getpid()}-{uuid.uuid4().hex[:8]}", ring_size=1 << 20, max_channels=1024,
                       keepalive_interval=0, engine=self.bridge)
        self._batch = self.bridge.batch()
        self._batch.__enter__()  # pipelined: rows are sent in round trips of up to 1000, in order

    def __getattr__(self, name: str) -> Any:
        return getattr(self.bus, name)

    def close(self) -> None:
        try:
            self._batch.__exit__(None, None, None)  # sends what is queued; raises if Redis refused it
        finally:
            self.bus.destroy()


def last_committed_batch(bus: Any, sink_id: str) -> int | None:
    """The newest batch id sink ``sink_id`` committed on ``bus`` (for monitoring and tests)."""
    for msg in reversed(bus.backlog(sink_channel(sink_id), 0)):
        d = msg.data
        if isinstance(d, dict) and d.get("kind") == "commit":
            return int(d["batch_id"])
    return None
