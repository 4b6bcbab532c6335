"""What a Spark reader returns (:class:`Chunk`) and where the bus is (:class:`Location`): plain data, apart from the
readers (:mod:`.readers`, :mod:`.nats_reader`, :mod:`.rabbit_reader`) so each reader module imports them without
importing the others."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Chunk", "Location"]


@dataclass
class Chunk:
    """Columns of one channel range, oldest first, plus what the store said about the range.

    ``payloads`` are codec bytes (JSON text when ``is_json``); ``metas`` are shmbus targeting blobs (``b""`` for
    untargeted messages); ``timestamps`` are epoch seconds (None where the store keeps none, i.e. Redis).
    ``first_available`` is the oldest id the store still had at or after ``after + 1``: above ``after + 1`` means
    messages in the range are gone.
    """

    message_ids: list[int] = field(default_factory=list)
    global_ids: list[int] = field(default_factory=list)
    timestamps: list[float | None] = field(default_factory=list)
    payloads: list[bytes] = field(default_factory=list)
    metas: list[bytes] = field(default_factory=list)
    first_available: int = 0
    last_id: int = 0
    is_json: bool = True
    sparse: bool = False  # message ids are global ids (PostgreSQL): a channel's ids have gaps


@dataclass(frozen=True)
class Location:
    """Where the bus is, as plain picklable data (what crosses process and host boundaries)."""

    bus: str | None = None
    redis_url: str | None = None
    redis_prefix: str = ""
    site_id: str | None = None
    postgres_dsn: str | None = None
    postgres_channel: str | None = None  # the bridge's notify channel (default: the gem's _message_bus_0)
    nats_url: str | None = None
    nats_stream: str | None = None  # the NATS bridge's stream (default "shmbus")
    rabbitmq_url: str | None = None
    rabbitmq_stream: str | None = None  # the RabbitMQ bridge's stream (default: message_bus)

    @property
    def remote(self) -> bool:
        """Read or write through a shared backend (a cluster) rather than this host's segment."""
        return bool(self.redis_url or self.postgres_dsn or self.nats_url or self.rabbitmq_url)

    def describe(self) -> str:
        if self.postgres_dsn:
            from ..postgres.bridge import redact_dsn

            return f"postgres {redact_dsn(self.postgres_dsn)}"
        if self.rabbitmq_url:
            from ..rabbitmq.errors import redact_url as redact_amqp

            return f"rabbitmq {redact_amqp(self.rabbitmq_url)} stream {self.rabbitmq_stream or 'message_bus'!r}"
        if self.nats_url:
            from ..nats.errors import redact_url

            return f"nats {redact_url(self.nats_url)} stream {self.nats_stream or 'shmbus'!r}"
        return f"redis {self.redis_url}" if self.redis_url else f"bus {self.bus!r}"
