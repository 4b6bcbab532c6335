"""Bus access for the Spark data source, without any pyspark import.

Kept separate from :mod:`shmbus.adapters.spark` for two reasons: the benchmark measures this exact reader
without Spark as its baseline, and executors/planners only ever need *plain data* to build one of these
(a bus name or a Redis URL), so nothing here is pickled while open.

Two backends read the same logical thing, "messages of channel C with ``after < id <= upto``":

* :class:`ShmReader` attaches to the shared-memory segment by name (same host: ``local[*]`` or executors that
  run on the bus host);
* :class:`RedisReader` reads the message_bus gem's Redis layout (``__mb_backlog_n_<chan>`` sorted set scored by
  channel id, members ``gid|cid|chan|envelope-json``, counter ``__mb_backlog_id_n_<chan>``), which the Redis
  bridge maintains, so executors on other hosts can read a bus that lives on one host.
"""

from __future__ import annotations

from typing import Any, Protocol

from shmbus import jsonlib
from shmbus.bus import Bus
from shmbus.channels import backend_name
from shmbus.message import encode_meta
from shmbus.segment import Segment

from ..bridge.wire import required_line
from ..redis import layout
from .chunk import Chunk, Location

__all__ = ["Chunk", "Location", "LocationReader", "RedisReader", "ShmReader", "open_reader"]


class LocationReader(Protocol):
    """What the source and sink need of a backend (:class:`ShmReader` or :class:`RedisReader`)."""

    location: Location

    def epoch(self) -> int: ...

    def last_ids(self, channels: list[str]) -> dict[str, int]: ...

    def first_available(self, channel: str) -> int: ...

    def read(self, channel: str, after: int, upto: int) -> Chunk: ...

    def decode(self, payload: bytes) -> Any: ...

    def close(self) -> None: ...


class ShmReader:
    """Reads a shared-memory bus attached by name; never creates one (``create=False``)."""

    def __init__(self, location: Location) -> None:
        assert location.bus
        self.location = location
        # The Bus refuses to attach with a codec other than the segment's, so peek at it first.
        try:
            seg = Segment.open(location.bus, create=False)
        except FileNotFoundError as exc:
            raise FileNotFoundError(
                f"{exc}: Spark attaches to an existing bus and never creates one; start the application that "
                "owns the bus first (on a cluster, read through the Redis bridge with option redis_url)"
            ) from None
        codec = seg.codec_name or None
        seg.close()
        self.bus = Bus(location.bus, create=False, codec=codec, keepalive_interval=0)
        self.seg = self.bus.segment
        self.is_json = bool(self.bus.codec.is_json)

    def _key(self, channel: str) -> bytes:
        return backend_name(channel, self.location.site_id).encode()

    def epoch(self) -> int:
        return self.seg.read_epoch()

    def last_ids(self, channels: list[str]) -> dict[str, int]:
        return {ch: self.seg.last_id(self._key(ch)) for ch in channels}

    def first_available(self, channel: str) -> int:
        key = self._key(channel)
        last, _newest, trim_below, _since = self.seg.channel_state(key)
        if last == 0:
            return 1
        if self.seg.tail() == 0:
            # The ring never overwrote anything, so only the backlog limit trims: no need to walk the chain
            # (which costs ~1 s per million retained messages).
            return trim_below + 1
        _, _, first = self.seg.channel_backlog(key, trim_below, upto=trim_below)
        return first

    def read(self, channel: str, after: int, upto: int) -> Chunk:
        columns = getattr(self.seg, "channel_columns", None)
        if columns is not None:  # the bulk read (no Record per message): ~2.5x faster
            mids, gids, stamps, payloads, metas, last, first = columns(self._key(channel), after, upto)
            return Chunk(
                message_ids=mids,
                global_ids=gids,
                timestamps=list(stamps),
                payloads=payloads,
                metas=metas,
                first_available=first,
                last_id=last,
                is_json=self.is_json,
                sparse=self.seg.sparse_ids,
            )
        recs, last, first = self.seg.channel_backlog(self._key(channel), after, upto=upto)
        return Chunk(
            message_ids=[r.message_id for r in recs],
            global_ids=[r.global_id for r in recs],
            timestamps=[r.timestamp for r in recs],
            payloads=[r.payload for r in recs],
            metas=[r.meta for r in recs],
            first_available=first,
            last_id=last,
            is_json=self.is_json,
            sparse=self.seg.sparse_ids,
        )

    def decode(self, payload: bytes) -> Any:
        return self.bus.codec.decode(payload)

    def close(self) -> None:
        self.bus.close()


class RedisReader:
    """Reads the gem's Redis layout (what the Redis bridge writes) with ZRANGEBYSCORE ... LIMIT pages.

    Redis has no bus epoch: a flush is only visible as ids going backwards, so :meth:`epoch` returns 0 and the
    source relies on the ids-went-backwards check. The gem stores no timestamp; an envelope ``timestamp`` field
    is used when present.
    """

    PAGE = 20_000

    def __init__(self, location: Location) -> None:
        import redis

        assert location.redis_url
        self.location = location
        self.client = redis.Redis.from_url(location.redis_url)
        self.is_json = True

    def _chan(self, channel: str) -> str:
        return backend_name(channel, self.location.site_id)

    def backlog_key(self, channel: str) -> str:
        return self.location.redis_prefix + layout.backlog_key(self._chan(channel))

    def id_key(self, channel: str) -> str:
        return self.location.redis_prefix + layout.backlog_id_key(self._chan(channel))

    def epoch(self) -> int:
        return 0

    def last_ids(self, channels: list[str]) -> dict[str, int]:
        if not channels:
            return {}
        values = self.client.mget([self.id_key(ch) for ch in channels])
        return {ch: int(v or 0) for ch, v in zip(channels, values, strict=True)}

    def first_available(self, channel: str) -> int:
        got = self.client.zrange(self.backlog_key(channel), 0, 0, withscores=True)
        if got:
            return int(got[0][1])
        return self.last_ids([channel])[channel] + 1

    def read(self, channel: str, after: int, upto: int) -> Chunk:
        key = self.backlog_key(channel)
        out = Chunk(is_json=True)
        cur = after
        first: int | None = None
        while cur < upto:
            page: list[bytes] = self.client.zrangebyscore(  # type: ignore[assignment]
                key, cur + 1, upto, start=0, num=self.PAGE
            )
            if not page:
                break
            for member in page:
                line = required_line(member)
                cid = line.message_id
                if first is None:
                    first = cid
                envelope = jsonlib.loads(line.value or b"")
                out.message_ids.append(cid)
                out.global_ids.append(line.global_id)
                ts = envelope.get("timestamp")
                out.timestamps.append(float(ts) if ts is not None else None)
                out.payloads.append(jsonlib.dumps_lenient(envelope.get("data")))
                c, u, g = envelope.get("client_ids"), envelope.get("user_ids"), envelope.get("group_ids")
                out.metas.append(encode_meta(c, u, g) if (c or u or g) else b"")
                cur = cid
            if len(page) < self.PAGE:
                break
        out.last_id = self.last_ids([channel])[channel]
        out.first_available = first if first is not None else out.last_id + 1
        return out

    def decode(self, payload: bytes) -> Any:
        return jsonlib.loads(payload)

    def close(self) -> None:
        self.client.close()


class PostgresReader:
    """Reads the gem's PostgreSQL table (what the PostgreSQL bridge writes) in pages of the gem's channel backlog
    statement. Ids are the table's (sparse within a channel); the table has no epoch (0), like Redis."""

    PAGE = 20_000
    #: How long :meth:`last_ids` waits for the transactions writing to the table when it reads the newest ids.
    SETTLE_TIMEOUT = 5.0

    def __init__(self, location: Location) -> None:
        import psycopg

        assert location.postgres_dsn
        self.location = location
        self.conn = psycopg.connect(location.postgres_dsn, autocommit=True)
        self.is_json = True
        from ..postgres.writers import WriterWait

        self._writers = WriterWait(self.SETTLE_TIMEOUT)

    def _chan(self, channel: str) -> str:
        return backend_name(channel, self.location.site_id)

    def epoch(self) -> int:
        return 0

    def last_ids(self, channels: list[str]) -> dict[str, int]:
        if not channels:
            return {}
        names = {self._chan(ch): ch for ch in channels}
        rows = self.conn.execute(  # the gem's max_channel_ids
            "SELECT channel, max(id) FROM message_bus WHERE (channel = ANY(%s)) GROUP BY channel", (list(names),)
        ).fetchall()
        out = dict.fromkeys(channels, 0)
        for chan, mx in rows:
            out[names[chan]] = int(mx or 0)
        self._settle()
        return out

    def _settle(self) -> None:
        """Wait until the transactions writing to the table when the newest ids were read have ended, so every
        row below those ids that will ever commit has (:class:`~shmbus.adapters.postgres.writers.WriterWait`). A
        batch read up to these ids then misses nothing still in flight. Bounded by SETTLE_TIMEOUT."""
        self._writers.settle(self.conn)

    def first_available(self, channel: str) -> int:
        row = self.conn.execute("SELECT min(id) FROM message_bus WHERE channel = %s", (self._chan(channel),)).fetchone()
        if row and row[0] is not None:
            return int(row[0])
        return self.last_ids([channel])[channel] + 1

    def read(self, channel: str, after: int, upto: int) -> Chunk:
        chan = self._chan(channel)
        out = Chunk(is_json=True, sparse=True)
        cur = after
        held = after == 0
        if not held:  # the row at or before ``after`` still there: nothing after it was trimmed
            held = (
                self.conn.execute(
                    "SELECT 1 FROM message_bus WHERE channel = %s AND id <= %s LIMIT 1", (chan, after)
                ).fetchone()
                is not None
            )
        while cur < upto:
            rows = self.conn.execute(
                "SELECT id, value, extract(epoch from added_at) FROM message_bus "
                "WHERE channel = %s AND id > %s AND id <= %s ORDER BY id LIMIT %s",
                (chan, cur, upto, self.PAGE),
            ).fetchall()
            for gid, value, ts in rows:
                envelope = jsonlib.loads(value)
                out.message_ids.append(int(gid))
                out.global_ids.append(int(gid))
                out.timestamps.append(float(ts) if ts is not None else None)
                out.payloads.append(jsonlib.dumps_lenient(envelope.get("data")))
                c, u, g = envelope.get("client_ids"), envelope.get("user_ids"), envelope.get("group_ids")
                out.metas.append(encode_meta(c, u, g) if (c or u or g) else b"")
                cur = int(gid)
            if len(rows) < self.PAGE:
                break
        out.last_id = self.last_ids([channel])[channel]
        if held:
            out.first_available = after + 1
        else:
            out.first_available = out.message_ids[0] if out.message_ids else out.last_id + 1
        return out

    def decode(self, payload: bytes) -> Any:
        return jsonlib.loads(payload)

    def close(self) -> None:
        self.conn.close()


def open_reader(location: Location) -> LocationReader:
    """Open the backend ``location`` names (RabbitMQ, Redis or PostgreSQL when given, else the segment by name)."""
    if location.rabbitmq_url:
        from .rabbit_reader import RabbitReader

        return RabbitReader(location)
    if location.postgres_dsn:
        return PostgresReader(location)
    if location.nats_url:
        from .nats_reader import NatsReader

        return NatsReader(location)
    if location.redis_url:
        return RedisReader(location)
    if not location.bus:
        raise ValueError("the shmbus source needs option 'bus' (a bus name) or 'redis_url'")
    return ShmReader(location)
