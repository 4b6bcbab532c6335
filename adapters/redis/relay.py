"""The Redis -> segment direction of the bridge: the relay election, the relay itself (SUBSCRIBE, store with
Redis's ids, catch up after a takeover or reconnect) and backlog reads older than the segment holds."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Any

import redis

from shmbus.bus import Backlog, Bus
from shmbus.channels import backend_name
from shmbus.engines import BacklogGap, Envelope
from shmbus.message import Message
from shmbus.segment import Segment

from . import layout
from .election import relay_lock_op
from .urls import redact_url

if TYPE_CHECKING:
    from .bridge import RelayState

__all__ = ["Relay"]

log = logging.getLogger("shmbus.redis")

_PAGE = 1000  # catch-up page size (global backlog entries per round trip)


class Relay:
    """Part of :class:`~.bridge.RedisBridge`: everything that moves Redis's messages into this host's segment."""

    url: str
    pubsub_channel: str
    election_interval: float
    reconnect_max: float
    socket_timeout: float
    redis_role: str | None
    relayed: int
    relay_lost: int
    unrelayable: int
    resets: int
    takeovers: int
    _pid: int
    _stop: threading.Event
    _lock_fd: int
    _is_relay: bool
    _pubsub_conn: Any
    _highest: int
    backend_newest: int
    _dup: tuple[int, int]

    if TYPE_CHECKING:

        @property
        def client(self) -> redis.Redis: ...

        def _bus_of(self, bus: Bus | None) -> Bus: ...

        def _set_relay_state(self, state: RelayState, error: BaseException | None = None) -> None: ...

    # ------------------------------------------------------------------ election
    def _ensure_lock_fd(self) -> int:
        if self._lock_fd < 0:
            bus = self._bus_of(None)
            self._lock_fd = os.open(bus.segment.path, os.O_RDWR | os.O_CLOEXEC)
        return self._lock_fd

    def _try_lock(self) -> bool:
        try:
            relay_lock_op(self._ensure_lock_fd(), fcntl.F_OFD_SETLK, fcntl.F_WRLCK)
            return True
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                return False
            raise

    def _release_lock(self) -> None:
        if self._is_relay and self._lock_fd >= 0 and self._pid == os.getpid():
            with contextlib.suppress(OSError):
                relay_lock_op(self._lock_fd, fcntl.F_OFD_SETLK, fcntl.F_UNLCK)
        self._is_relay = False

    def _elect_loop(self) -> None:
        stop = self._stop
        while not stop.is_set():
            try:
                if self._try_lock():
                    self._is_relay = True
                    self.takeovers += 1
                    try:
                        self._relay_loop()
                    finally:
                        self._release_lock()
                        if not stop.is_set():
                            self._set_relay_state("standby")
            except Exception as exc:
                if stop.is_set():
                    return
                log.exception("shmbus redis bridge: election/relay error (retrying)")
                self._set_relay_state("standby", exc)
            stop.wait(self.election_interval)

    # ------------------------------------------------------------------ relay
    def _relay_loop(self) -> None:
        """Subscribe, catch up, pump; on any Redis error reconnect with capped backoff. Runs until stopped."""
        stop = self._stop
        backoff = 0.05
        self._set_relay_state("connecting")
        while not stop.is_set():
            conn = None
            try:
                conn = self._subscribe()
                self._catch_up()
                self._set_relay_state("relaying")
                backoff = 0.05
                self._pump(conn)
            except Exception as exc:
                if stop.is_set():
                    return
                if not isinstance(exc, (redis.exceptions.RedisError, OSError, ValueError)):
                    log.exception("shmbus redis bridge: relay error")
                self._set_relay_state("reconnecting", exc)
                stop.wait(backoff)
                backoff = min(backoff * 2, self.reconnect_max)
            finally:
                self._pubsub_conn = None
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.disconnect()

    def _subscribe(self) -> Any:
        pool = self.client.connection_pool
        conn = pool.connection_class(**pool.connection_kwargs)
        self._pubsub_conn = conn
        conn.connect()
        try:
            role = self.client.execute_command("ROLE")
            self.redis_role = role[0].decode() if isinstance(role[0], bytes) else str(role[0])
        except redis.exceptions.ResponseError:
            self.redis_role = None
        if self.redis_role in ("slave", "replica"):
            log.warning(
                "shmbus redis bridge: %s is a read-only replica; publishes fail until failover ends",
                redact_url(self.url),
            )
        conn.send_command("SUBSCRIBE", self.pubsub_channel)
        reply = conn.read_response()
        if not reply or reply[0] != b"subscribe":
            raise redis.exceptions.ConnectionError(f"unexpected SUBSCRIBE reply {reply!r}")
        return conn

    def _pump(self, conn: Any) -> None:
        stop = self._stop
        idle_since = time.monotonic()
        ping_sent = 0.0
        while not stop.is_set():
            if not conn.can_read(timeout=0.25):
                now = time.monotonic()
                if ping_sent and now - ping_sent > self.socket_timeout:
                    raise redis.exceptions.TimeoutError("no PING reply on the subscription connection")
                if not ping_sent and now - idle_since > 5.0:
                    conn.send_command("PING")  # detects a silently dead connection (no RST)
                    ping_sent = now
                continue
            while True:
                reply = conn.read_response()
                kind = reply[0]
                if kind == b"message":
                    self._on_line(reply[2])
                elif kind == b"pong":
                    ping_sent = 0.0
                if not conn.can_read(timeout=0):
                    break
            idle_since = time.monotonic()

    def _on_line(self, line: bytes) -> None:
        gid = int(line[: line.index(b"|")])
        if gid > self.backend_newest:
            self.backend_newest = gid  # Redis has it, whether or not it is stored yet (the relay's lag)
        if gid == self._highest + 1:
            self._store(line, gid)
        elif self._dup[0] < gid <= self._dup[1]:
            return  # published between SUBSCRIBE and the catch-up read: already stored by the catch-up
        else:
            self._catch_up()  # a gap, or ids went backwards (flush/restart): the backlog decides (as the gem)

    def _store(self, line: bytes, gid: int) -> None:
        bus = self._bus_of(None)
        self._highest = gid
        try:
            d = layout.parse_line(line)
            payload, meta = layout.decode_envelope(bus.codec, d.envelope)
            env = Envelope(d.channel, d.site_id, payload, meta, bus.max_backlog_size, bus.max_backlog_age)
            stored = bus.store(env, global_id=d.global_id, message_id=d.message_id, timestamp=time.time())
        except (ValueError, UnicodeDecodeError, TypeError) as exc:
            self.unrelayable += 1
            log.warning("shmbus redis bridge: cannot store message %d locally (%s); skipped", gid, exc)
            return
        if stored:  # 0: already there (its publisher on this host stored it itself)
            self.relayed += 1

    def _catch_up(self) -> None:
        """Bring the segment up to Redis: reset it if Redis's history is another one, then walk the global
        backlog after the segment's last global id (the gem's catch-up, but seeded from shared memory, so a
        new relay continues exactly where the dead one stopped)."""
        bus = self._bus_of(None)
        seg = bus.segment
        r = self.client
        before = highest = seg.global_id()
        redis_gid = int(r.get(layout.GLOBAL_ID_KEY) or 0)
        self.backend_newest = redis_gid  # what Redis holds, before storing any of it: the lag is the difference
        if highest and (redis_gid < highest or not self._same_history(seg, highest)):
            self.resets += 1
            log.warning(
                "shmbus redis bridge: Redis's ids went backwards or its history changed (flush or "
                "restart; Redis global id %d, bus %d): resetting bus %r so clients resynchronise",
                redis_gid,
                highest,
                bus.name,
            )
            bus.reset()
            before = highest = 0
        first = True
        while True:
            ptrs: list[Any] = r.zrangebyscore(
                layout.GLOBAL_BACKLOG_KEY, highest + 1, "+inf", start=0, num=_PAGE, withscores=True
            )
            if not ptrs:
                break
            pipe = r.pipeline(transaction=False)
            parsed = []
            for member, score in ptrs:
                cid, chan = layout.parse_pointer(member)
                parsed.append((int(score), cid))
                pipe.zrangebyscore(layout.backlog_key(chan), cid, cid)
            for (gid, _cid), lines in zip(parsed, pipe.execute(), strict=True):
                if first and gid > highest + 1 and highest:
                    self.relay_lost += gid - highest - 1
                    log.warning(
                        "shmbus redis bridge: %d messages after global id %d are no longer in "
                        "Redis's global backlog; bus %r misses them",
                        gid - highest - 1,
                        highest,
                        bus.name,
                    )
                first = False
                if lines:  # else trimmed from its channel since: the gem drops it too
                    self._store(lines[0], gid)
                highest = gid
        self._highest = max(highest, before)
        self.backend_newest = max(self.backend_newest, self._highest)
        self._dup = (before, self._highest)

    def _same_history(self, seg: Segment, gid: int) -> bool:
        """Is the segment's message ``gid`` the one Redis has under that id? Unknown counts as yes."""
        bus = self._bus_of(None)
        r = self.client
        ptrs: list[bytes] = r.zrangebyscore(layout.GLOBAL_BACKLOG_KEY, gid, gid)  # type: ignore[assignment]
        recs = seg.global_backlog(gid - 1)
        if not ptrs or not recs or recs[0].global_id != gid:
            return True
        cid, chan = layout.parse_pointer(ptrs[0])
        lines: list[bytes] = r.zrangebyscore(layout.backlog_key(chan), cid, cid)  # type: ignore[assignment]
        if not lines:
            return True
        rec = recs[0]
        local_chan = backend_name(rec.channel.decode(), rec.site.decode() or None)
        if rec.message_id != cid or local_chan != chan:
            return False
        try:
            payload, _ = layout.decode_envelope(bus.codec, layout.parse_line(lines[0]).envelope)
            return bool(bus.codec.decode(payload) == bus.codec.decode(rec.payload))
        except (ValueError, TypeError):
            return True

    # ------------------------------------------------------------------ reads older than the segment
    def backlog(self, bus: Bus, gap: BacklogGap) -> Backlog | None:
        """Fill a gap in the segment's backlog from Redis's channel backlog (called by ``Bus.backlog``).

        Only ids Redis can still hold are asked for (it trims to ``max_backlog_size`` like the segment), so a
        client that is simply too far behind costs no Redis command. None: nothing better than ``partial``.
        """
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
            log.warning("shmbus redis bridge: could not read the older backlog of %r from Redis: %s", channel, exc)
            return None
        epoch = bus.segment.read_epoch()
        older = []
        for line in lines:
            d = layout.parse_line(line)
            payload, meta = layout.decode_envelope(bus.codec, d.envelope)
            older.append(
                Message(
                    d.global_id, d.message_id, d.channel, payload, bus.codec, site_id=d.site_id, meta=meta, epoch=epoch
                )
            )
        if not older:
            return None
        merged = older + list(partial)
        if limit is not None:
            del merged[limit:]
        return Backlog(merged, after_id=after_id, last_id=last, first_available=older[0].message_id)
