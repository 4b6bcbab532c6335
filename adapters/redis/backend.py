"""The Redis side of the bridge kit (:class:`~shmbus.adapters.bridge.backend.Backend`): the gem's key layout.

Publish runs one Lua script (EVALSHA) that assigns the ids, stores the line in the gem's backlogs and PUBLISHes it and
its seal; the relay stores a line whose seal verifies, else reads Redis's global backlog (pointers) and the channel
backlogs (the lines): any other PUBLISHed line is only a doorbell. Every global id up to ``__mb_global_id_n`` was a
message (Redis draws ids inside the script), so an id the global backlog no longer holds is a trimmed one: lost for a
host that had not read it.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
from typing import TYPE_CHECKING, Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from shmbus.bus import Backlog
from shmbus.channels import backend_name, split_backend_name
from shmbus.codecs import Codec, get_codec
from shmbus.message import Message
from shmbus.perprocess import Birth
from shmbus.segment import BridgeRecord

from ..bridge.backend import Acknowledged, Page, Row
from ..bridge.outcome import ReplyLost, cause_text, note_unknown, outcome_unknown
from ..bridge.status import BridgeStatus
from ..bridge.wire import decode_envelope, parse_line, required_line
from . import layout
from .commands import DirectCommands
from .doorbell import RedisDoorbell
from .errors import RedisBridgeError, RedisReadOnly, RedisUnavailable
from .urls import redact_url

if TYPE_CHECKING:
    from shmbus.engines import BacklogGap, Envelope
    from shmbus.host import BusHost
    from shmbus.segment import Segment

__all__ = ["RedisBackend"]

_GROUP = 250  # messages per run of the batch script: bounds how long one script blocks Redis


class RedisBackend:
    """Redis with the gem's keys (see the module doc); ``status`` is the bridge's, for the publish state."""

    kind = "redis"
    sparse_ids = False
    seal_hash = "sha1"  # what Redis's Lua has (redis.sha1hex)
    errors: tuple[type[BaseException], ...] = (redis.exceptions.RedisError,)
    unreachable: tuple[type[BaseException], ...] = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)

    def __init__(
        self, url: str, pubsub_channel: str, status: BridgeStatus, socket_timeout: float, connect_timeout: float
    ) -> None:
        self.url = url
        self.pubsub_channel = pubsub_channel
        self.status = status
        self.socket_timeout = socket_timeout
        self.connect_timeout = connect_timeout
        self.redis_role: str | None = None
        self._client: redis.Redis | None = None
        self._direct: DirectCommands | None = None  # the single publish's connections (made with _client)
        self._birth = Birth()  # where _client was made
        self._gone = 0
        self._newest = 0
        self._seal_key: bytes | None = None
        self._codec: Codec = get_codec(None)

    # ------------------------------------------------------------------ connections
    @property
    def client(self) -> redis.Redis:
        """This process's command connection pool (publish, catch-up, gap reads). No automatic retries: a retried
        EVALSHA whose reply was lost would publish twice."""
        c = self._client
        if c is None or not self._birth.here:
            c = redis.Redis.from_url(
                self.url,
                socket_timeout=self.socket_timeout,
                socket_connect_timeout=self.connect_timeout,
                retry=Retry(NoBackoff(), 0),
                health_check_interval=0,
                protocol=2,
            )  # RESP2: pub/sub replies are plain
            self._client = c
            self._direct = DirectCommands(c)
            self._birth.renew()
        return c

    @property
    def direct(self) -> DirectCommands:
        """This process's connections for single publishes (:mod:`.commands`), made like ``client``'s."""
        d = self._direct
        if d is None or not self._birth.here:
            _ = self.client  # (re)makes both, in this process
            d = self._direct
            assert d is not None
        return d

    def record(self) -> BridgeRecord:
        password = redis.connection.parse_url(self.url).get("password") if "://" in self.url else None
        public = redact_url(self.url).replace(":***@", "@") if password else self.url
        return BridgeRecord(self.kind, public, bool(password), {"pubsub_channel": self.pubsub_channel})

    def check(self, bus: BusHost) -> None:
        self._codec = bus.codec

    def after_fork(self) -> None:
        self._client = self._direct = None  # the parent's sockets are left alone
        self._birth.renew()

    def close(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None
        if self._direct is not None:
            self._direct.close()
            self._direct = None

    def describe(self) -> dict[str, Any]:
        return {"redis_url": redact_url(self.url), "pubsub_channel": self.pubsub_channel, "redis_role": self.redis_role}

    # ------------------------------------------------------------------ publish
    def publish(self, bus: BusHost, envelopes: list[Envelope]) -> Acknowledged:
        """One EVALSHA, or the batch script's runs in one round trip. A failure once the request was written
        raises :class:`~shmbus.errors.PublishOutcomeUnknown` (never retried here: it may have run)."""
        args = [layout.script_args(e, bus.codec, bus.max_global_backlog_size, self.pubsub_channel) for e in envelopes]
        try:
            if len(args) == 1:
                return self._eval_one(args[0])
            return self._eval_many(args)
        except ReplyLost as lost:
            self.status.set_state("unreachable" if isinstance(lost.cause, self.unreachable) else "error", lost.cause)
            raise outcome_unknown(self.kind, redact_url(self.url), envelopes, lost) from lost.cause
        except BaseException as exc:
            if not isinstance(exc, Exception):
                note_unknown(exc, self.kind)
            raise

    def _eval_one(self, args: list[Any]) -> Acknowledged:
        try:
            try:
                res = self.direct.execute("EVALSHA", layout.PUBLISH_SHA, *args)
            except redis.exceptions.NoScriptError:
                self.client.script_load(layout.PUBLISH_SCRIPT)
                res = self.direct.execute("EVALSHA", layout.PUBLISH_SHA, *args)
        except (redis.exceptions.RedisError, OSError) as exc:  # nothing sent (ReplyLost, the caller's own pass)
            raise self._publish_error(exc) from exc
        return Acknowledged([(int(res[0]), int(res[1]))], int(res[2]))

    def _eval_many(self, args: list[list[Any]]) -> Acknowledged:
        """One round trip; each group of up to ``_GROUP`` messages is ONE run of the batch script (far less
        per-call work in Redis than one EVALSHA per message). NOSCRIPT loads the script and re-sends."""
        groups = [args[i : i + _GROUP] for i in range(0, len(args), _GROUP)]
        results: list[Any] = [None] * len(groups)
        todo = list(range(len(groups)))
        for _attempt in range(2):
            commands = [("EVALSHA", layout.PUBLISH_MANY_SHA, *layout.many_script_args(groups[g])) for g in todo]
            try:
                got = self.direct.execute_many(commands)
            except (redis.exceptions.RedisError, OSError) as exc:
                raise self._publish_error(exc) from exc
            again = []
            for g, r in zip(todo, got, strict=True):
                if isinstance(r, redis.exceptions.NoScriptError):
                    again.append(g)
                elif isinstance(r, Exception):
                    raise self._publish_error(r)  # READONLY and friends: the whole batch fails alike
                else:
                    results[g] = r
            if not again:
                break
            with contextlib.suppress(redis.exceptions.RedisError):
                self.client.script_load(layout.PUBLISH_MANY_SCRIPT)
            todo = again
        else:
            raise RedisBridgeError("Redis keeps answering NOSCRIPT for the publish script")
        flat = [int(x) for r in results for x in r[:-1]]
        histories = {int(r[-1]) for r in results}  # several groups straddling a FLUSHDB: -1, land none
        history = histories.pop() if len(histories) == 1 else -1
        return Acknowledged(list(zip(flat[0::2], flat[1::2], strict=True)), history)

    def _publish_error(self, exc: BaseException) -> RedisBridgeError:
        """A definite refusal (nothing was stored): the cause is named, never an empty reason."""
        if isinstance(exc, RedisBridgeError):
            return exc
        msg, where = cause_text(exc), redact_url(self.url)
        if isinstance(exc, redis.exceptions.ReadOnlyError) or (
            isinstance(exc, redis.exceptions.ResponseError) and "READONLY" in msg
        ):
            self.status.set_state("readonly", exc)
            return RedisReadOnly(f"Redis at {where} is a read-only replica; message not published ({msg})")
        if isinstance(exc, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)):
            self.status.set_state("unreachable", exc)
            return RedisUnavailable(f"Redis at {where} is unreachable; message not published: {msg}")
        self.status.set_state("error", exc)
        return RedisBridgeError(f"Redis at {where} refused the publish: {msg}")

    # ------------------------------------------------------------------ the relay's reads
    def open_doorbell(self) -> RedisDoorbell:
        bell = RedisDoorbell(
            self.client, self.pubsub_channel, layout.seal_channel(self.pubsub_channel), self.socket_timeout
        )
        try:
            role = self.client.execute_command("ROLE")
            self.redis_role = role[0].decode() if isinstance(role[0], bytes) else str(role[0])
        except redis.exceptions.ResponseError:
            self.redis_role = None
        if self.redis_role in ("slave", "replica"):
            self.status.log.warning(
                "shmbus redis bridge: %s is a read-only replica; publishes fail until failover ends",
                redact_url(self.url),
            )
        return bell

    def history_id(self) -> int:
        """The history key (set when missing), and with it the seal key (set when missing: a FLUSHDB drops both)."""
        fresh, key = secrets.randbits(63) or 1, secrets.token_hex(32)
        pipe = self.client.pipeline(transaction=False)
        pipe.eval(layout.HISTORY_SCRIPT, 2, layout.HISTORY_KEY, layout.SEAL_KEY, fresh, key)
        pipe.get(layout.GLOBAL_ID_KEY)
        got = pipe.execute()
        self._newest = int(got[1] or 0)
        self._seal_key = bytes(got[0][1]) if got[0][1] else None
        return int(got[0][0])

    def seal_key(self) -> bytes | None:
        return self._seal_key

    def history_continues(self, seg: Segment, changed: bool, mark: int) -> bool:
        """A changed identity: Redis lost its keys (FLUSHDB, a restart without persistence). Unknown (an older
        segment): Redis's ids went back, or its message at the mark is another one."""
        if changed:
            return False
        gid = mark
        recs = seg.global_backlog(gid - 1, limit=1)
        if self._newest < gid:
            return False
        r = self.client
        ptrs: list[bytes] = r.zrangebyscore(layout.GLOBAL_BACKLOG_KEY, gid, gid)  # type: ignore[assignment]
        if not ptrs or not recs or recs[0].global_id != gid:
            return True
        cid, chan = layout.parse_pointer(ptrs[0])
        lines: list[bytes] = r.zrangebyscore(layout.backlog_key(chan), cid, cid)  # type: ignore[assignment]
        rec = recs[0]
        if not lines:
            return True
        if rec.message_id != cid or backend_name(rec.channel.decode(), rec.site.decode() or None) != chan:
            return False
        line = parse_line(lines[0])
        if line is None or line.value is None:
            return True
        try:
            payload, _ = decode_envelope(self._codec, line.value)
            return bool(self._codec.decode(payload) == self._codec.decode(rec.payload))
        except (ValueError, TypeError):
            return True

    def read_after(self, after: int, limit: int) -> Page:
        """One script run (:data:`~.layout.READ_AFTER_SCRIPT`): the history key and the newest id (read first:
        every id up to it that the global backlog misses is gone), then each entry after ``after`` with its
        channel's line. (A missing history key reads as 0, unknown: the next history check sets one.)"""
        args = (3, layout.HISTORY_KEY, layout.GLOBAL_ID_KEY, layout.GLOBAL_BACKLOG_KEY, after, limit)
        try:
            got = self.client.execute_command("EVALSHA", layout.READ_AFTER_SHA, *args, layout.BACKLOG_KEY_PREFIX)
        except redis.exceptions.NoScriptError:
            self.client.script_load(layout.READ_AFTER_SCRIPT)
            got = self.client.execute_command("EVALSHA", layout.READ_AFTER_SHA, *args, layout.BACKLOG_KEY_PREFIX)
        history, self._newest = int(got[0] or 0), int(got[1] or 0)
        rows = []
        for i in range(2, len(got), 3):
            gid = int(got[i])
            cid, chan = layout.parse_pointer(got[i + 1])
            d = required_line(got[i + 2]) if got[i + 2] else None
            if d is not None and d.global_id != gid:  # the channel's id now names another message (ids restarted)
                d = None
            rows.append(Row(gid, cid, chan, bytes(d.value) if d is not None and d.value is not None else None))
        self._gone = max(self._newest, rows[-1].global_id) if rows else self._newest
        return Page(history, rows)

    def gone_upto(self) -> int:
        return self._gone

    def settle(self, stop: threading.Event) -> bool:
        return True  # Redis draws and stores an id in one script: nothing is ever in flight

    def newest_id(self) -> int:
        return self._newest

    def maintain(self, bus: BusHost, position: int, active: dict[str, int]) -> None:
        return None  # the publish script trims

    # ------------------------------------------------------------------ reads older than the segment
    def fill_backlog(self, bus: BusHost, gap: BacklogGap) -> Backlog | None:
        """Fill a gap in the segment's backlog from Redis's channel backlog. Only ids Redis can still hold are asked
        for (it trims to ``max_backlog_size`` like the segment), so a client that is simply too far behind costs
        no Redis command. None: nothing better than ``partial``."""
        channel, site_id, after_id, upto, limit, partial = gap
        last = partial.last_id
        lo = max(after_id, last - bus.max_backlog_size)
        hi = partial.first_available - 1
        if upto is not None:
            hi = min(hi, upto)
        if hi <= lo:
            return None
        key = layout.backlog_key(backend_name(channel, site_id))
        try:
            lines: list[bytes] = self.client.zrangebyscore(key, lo + 1, hi)  # type: ignore[assignment]
        except redis.exceptions.RedisError as exc:
            self.status.log.warning("shmbus redis bridge: could not read the older backlog of %r: %s", channel, exc)
            return None
        epoch = bus.segment.read_epoch()
        older = []
        for line in lines:
            d = required_line(line)
            payload, meta = decode_envelope(bus.codec, d.value or b"")
            channel, site = split_backend_name(d.channel)
            older.append(
                Message(d.global_id, d.message_id, channel, payload, bus.codec, site_id=site, meta=meta, epoch=epoch)
            )
        if not older:
            return None
        merged = older + list(partial)
        if limit is not None:
            del merged[limit:]
        return Backlog(merged, after_id=after_id, last_id=last, first_available=older[0].message_id)
