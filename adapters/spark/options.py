"""Options of the ``shmbus`` data source, offsets, schemas, and the names every part shares."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from shmbus.channels import check_channel

from .readers import Location

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
    return StructType(
        [
            StructField("channel", StringType(), False),
            StructField("message_id", LongType(), False),
            StructField("global_id", LongType(), False),
            StructField("data", data_type, True),
            StructField("timestamp", TimestampType(), True),
            StructField("site_id", StringType(), True),
            StructField("user_ids", ArrayType(StringType()), True),
            StructField("group_ids", ArrayType(StringType()), True),
            StructField("client_ids", ArrayType(StringType()), True),
        ]
    )


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
class SparkOptions:
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
    def parse(cls, options: Any) -> SparkOptions:
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
                postgres_dsn=get("postgres_dsn") or get("postgresDsn") or None,
                postgres_channel=get("postgres_notify_channel") or get("postgresNotifyChannel") or None,
                nats_url=get("nats_url") or get("natsUrl") or None,
                nats_stream=get("nats_stream") or get("natsStream") or None,
                rabbitmq_url=get("rabbitmq_url") or get("rabbitmqUrl") or None,
                rabbitmq_stream=get("rabbitmq_stream") or get("rabbitmqStream") or None,
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
        if not self.location.remote and not self.location.bus:
            raise ValueError(
                "the shmbus source needs .option('bus', NAME) (same host), .option('redis_url', URL), "
                ".option('postgres_dsn', DSN), .option('nats_url', URL) or .option('rabbitmq_url', URL)"
            )
        if not self.channels:
            raise ValueError("the shmbus source needs .option('channels', '/a,/b') (comma list or JSON list)")
        for channel in self.channels:
            check_channel(channel)  # the bus's one rule: a typed InvalidChannel now, not an empty stream
        if self.data_format not in ("string", "binary"):
            raise ValueError(f"the shmbus source's dataFormat must be 'string' or 'binary', got {self.data_format!r}")
