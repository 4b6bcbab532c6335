"""Reading: planning partitions from offsets, and turning a channel's messages into Arrow record batches."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.types import (
    StructType,
)

from shmbus.message import decode_meta

from .readers import Chunk, LocationReader, open_reader
from .stopping import is_held

try:  # 4.2+: admission control and Trigger.AvailableNow
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
except ImportError as exc:  # pragma: no cover - guarded by the extra's version floor
    raise ImportError("shmbus.adapters.spark needs pyspark >= 4.2 (pip install 'shmbus[spark]')") from exc

from .options import (
    _LIST_STR,
    BusDataLossError,
    SparkOptions,
    decode_offset,
    encode_offset,
)

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------- reading
@dataclass
class BusPartition(InputPartition):
    """One task: messages of ``channel`` with ``after < id <= upto`` in bus epoch ``epoch``."""

    channel: str
    after: int
    upto: int
    epoch: int


def _resolve_start(
    opts: SparkOptions, reader: LocationReader, channels: Sequence[str], spec: str, default: str
) -> dict[str, int]:
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


def _plan(opts: SparkOptions, start_ids: dict[str, int], end_ids: dict[str, int], epoch: int) -> list[BusPartition]:
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


def _loss(opts: SparkOptions, message: str) -> None:
    if opts.fail_on_data_loss:
        raise BusDataLossError(
            message + " (set failOnDataLoss=false to skip lost messages instead, or delete the "
            "query's checkpoint directory to start over from the bus as it is now)"
        )
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


def _to_arrow(
    opts: SparkOptions, reader: LocationReader, channel: str, chunk: Chunk, schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    """Columns -> RecordBatches of the source schema (about 2x faster in Spark than yielding tuples)."""
    import pyarrow.compute as pc  # here, not at the top: the planner process never needs it (~50 ms to import)

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
            data = pa.array(
                [json.dumps(reader.decode(p), separators=(",", ":"), default=_jsonable) for p in payloads], pa.string()
            )
        ts = chunk.timestamps[lo:hi]
        if ts and ts[0] is not None and None not in ts:
            micros = pc.cast(pc.multiply(pa.array(ts, pa.float64()), 1e6), pa.int64(), safe=False)
            ts_arr = micros.cast(pa.timestamp("us", tz="UTC"))
        else:
            ts_arr = pa.array([None if t is None else int(t * 1e6) for t in ts], pa.int64()).cast(
                pa.timestamp("us", tz="UTC")
            )
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


def read_partition(opts: SparkOptions, schema: StructType, part: BusPartition) -> Iterator[pa.RecordBatch]:
    """What every executor task runs: attach, read ``(after, upto]``, check it is complete, detach, yield."""
    reader = open_reader(opts.location)
    try:
        epoch = reader.epoch()
        if epoch != part.epoch:
            _loss(
                opts,
                f"{opts.location.describe()} was reset (epoch {part.epoch} -> {epoch}) before ids "
                f"{part.after + 1}..{part.upto} of {part.channel!r} were read",
            )
            return
        chunk = reader.read(part.channel, part.after, part.upto)
        if reader.epoch() != part.epoch:  # reset while we read: what we got may belong to the new epoch
            _loss(opts, f"{opts.location.describe()} was reset while reading {part.channel!r}")
            return
    finally:
        reader.close()
    expected = part.upto - part.after
    got = len(chunk.message_ids)
    if chunk.sparse:  # ids are global ids: the count is unknown, the store says whether anything is gone
        if chunk.first_available > part.after + 1:
            _loss(
                opts,
                f"data loss on {part.channel!r} ({opts.location.describe()}): messages after id {part.after} "
                f"are gone (the store holds {chunk.first_available}..{chunk.last_id})",
            )
    elif got != expected or (got and chunk.message_ids[0] != part.after + 1):
        _loss(
            opts,
            f"data loss on {part.channel!r} ({opts.location.describe()}): expected ids "
            f"{part.after + 1}..{part.upto}, the bus holds {chunk.first_available}..{chunk.last_id} "
            f"(backlog trimmed, ring overwritten or channel expired); {expected - got} message(s) lost",
        )
    if got:
        yield from _to_arrow(opts, reader, part.channel, chunk, _arrow_schema(schema))


class BusBatchReader(DataSourceReader):
    """``spark.read.format("shmbus")``: the backlog between ``startingOffsets`` (default earliest) and
    ``endingOffsets`` (default latest), snapshotted when the query is planned."""

    def __init__(self, opts: SparkOptions, schema: StructType) -> None:
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

    def __init__(self, opts: SparkOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema
        self._reader: LocationReader | None = None
        self._target: tuple[int, dict[str, int]] | None = None
        self._initial: dict[str, Any] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_reader"] = None
        return state

    def _reader_open(self) -> LocationReader:
        if self._reader is None:
            self._reader = open_reader(self.opts.location)
        return self._reader

    def initialOffset(self) -> dict[str, Any]:
        # Spark calls this more than once for a new query (for the first batch's start, then again when
        # planning it): resolve "latest"/"earliest" once, or the two calls could disagree.
        if self._initial is None:
            reader = self._reader_open()
            ids = _resolve_start(self.opts, reader, self.opts.channels, self.opts.starting, "latest")
            self._initial = encode_offset(reader.epoch(), ids)
        return self._initial

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_records_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        reader = self._reader_open()
        self._target = (reader.epoch(), reader.last_ids(list(self.opts.channels)))

    def reportLatestOffset(self) -> dict[str, Any] | None:
        reader = self._reader_open()
        return encode_offset(reader.epoch(), reader.last_ids(list(self.opts.channels)))

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        if self._target is None and is_held():  # stop_gracefully() is waiting: plan no batch (see .stopping)
            return start
        reader = self._reader_open()
        epoch = reader.epoch()
        start_epoch, start_ids = decode_offset(start)
        chans = list(self.opts.channels)
        if start_epoch != epoch:
            _loss(
                self.opts,
                f"{self.opts.location.describe()} was reset: the checkpoint is from epoch "
                f"{start_epoch}, the bus is at epoch {epoch}; messages not yet read are gone",
            )
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
            _loss(
                self.opts,
                f"message ids went backwards on {self.opts.location.describe()} (channel expired or "
                f"store flushed): {back}",
            )
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
