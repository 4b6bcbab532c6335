"""Redis bridge: many hosts share one bus through Redis; every read is still served from shared memory.

``bus = Bus("app", engine=RedisBridge("redis://redis:6379/0"))``

* **Publish** runs one Lua script (EVALSHA) that assigns the global and channel ids, stores the message in the
  gem's Redis backlogs and PUBLISHes it: the key layout and line format are message_bus's Redis backend, so a
  Ruby app running message_bus on the same Redis sees the same messages with the same ids, and vice versa.
  The publisher then stores its own message locally when that keeps the segment contiguous (read-your-writes
  without waiting), else it waits briefly for the relay.
* **One relay per host** is elected with an OFD byte-range lock on the bus's segment file, taken on a file
  descriptor each process opens itself (after fork), so the kernel releases it when the holder dies; the other
  processes retry every ``election_interval`` seconds. The relay SUBSCRIBEs to ``_message_bus_<db>`` and
  writes every message into the segment with Redis's ids; on takeover or reconnect it catches up from Redis's
  global backlog after the segment's last global id, so nothing is lost or doubled.
* **Reads** (``backlog``, ``last_id``, long polls) come from the segment. Only a gap in the segment (older
  than it holds) is filled from Redis (``RedisBridge.backlog``, called by ``Bus.backlog``).
* **Faults**: an unreachable Redis makes ``publish`` raise :class:`RedisUnavailable` (or queue, with
  ``queue_in_memory=True``); a read-only replica raises :class:`RedisReadOnly` (or queues); a flushed or
  restarted Redis (ids went backwards, or the message at the segment's last id is another one) resets the
  segment's epoch so clients resynchronise, as the gem's clients do. ``health()`` reports all of it.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Literal

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from shmbus.engines import Engine, Envelope
from shmbus.errors import EngineError

from . import layout
from .election import relay_held_by_other
from .relay import Relay
from .urls import redact_url

if TYPE_CHECKING:
    from shmbus.bus import Bus
    from shmbus.segment import Segment

__all__ = ["RedisBridge", "RedisBridgeError", "RedisReadOnly", "RedisUnavailable"]

_GROUP = 250  # messages per run of the batch script: bounds how long one script blocks Redis
log = logging.getLogger("shmbus.redis")

_PAGE = 1000  # catch-up page size (global backlog entries per round trip)


#: The publish side's state, as ``health()`` reports it.
PublishState = Literal["unknown", "ok", "unreachable", "readonly", "error"]
#: The relay side's state in this process.
RelayState = Literal["standby", "connecting", "relaying", "reconnecting", "off"]


class RedisBridgeError(EngineError):
    """The Redis bridge could not carry out a publish; the message was not stored (unless said otherwise)."""


class RedisUnavailable(RedisBridgeError):
    """Redis could not be reached (or the connection broke mid-publish: the outcome is then unknown)."""


class RedisReadOnly(RedisBridgeError):
    """Redis answered READONLY: the bridge points at a replica (e.g. right after a failover)."""


class Batch:
    """What ``RedisBridge.batch()`` yields: publishes inside the block are sent in pipelined round trips on
    exit; ``ids`` then holds each one's channel id (None for a queued one), in publish order."""

    def __init__(self, bus: Bus | None) -> None:
        self.bus = bus
        self.envelopes: list[Envelope] = []
        self.ids: list[int | None] = []


class RedisBridge(Relay, Engine):
    """Engine that makes Redis the source of ids and history, shared by every host (see the module doc).

    ``url``: the Redis URL (``redis://[:password@]host:port/db``). ``pubsub_channel``: defaults to the gem's
    ``_message_bus_<db>`` with the URL's db (a Ruby app configured with ``url:`` only uses db 0's name: pass
    ``"_message_bus_0"`` to share with it). ``queue_in_memory``: queue publishes while Redis is unreachable or
    read-only (at most ``max_in_memory_publish_backlog``, oldest dropped) and flush them in order when it is
    back, instead of raising. ``relay=False``: this process never relays (e.g. a cron script).
    ``election_interval``: how often a standby process tries the relay lock. ``reconnect_max``: cap of the
    relay's reconnect backoff.
    ``local_wait``: how long a publish waits for the relay to store it locally when it cannot do so itself.
    ``autostart``: start the election thread when attached (False: call :meth:`start`).
    """

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        pubsub_channel: str | None = None,
        queue_in_memory: bool = False,
        max_in_memory_publish_backlog: int = 1000,
        relay: bool = True,
        election_interval: float = 0.25,
        reconnect_max: float = 1.0,
        socket_timeout: float = 5.0,
        connect_timeout: float = 2.0,
        local_wait: float = 1.0,
        autostart: bool = True,
    ) -> None:
        self.url = url
        self.queue_in_memory = queue_in_memory
        self.max_in_memory_publish_backlog = max_in_memory_publish_backlog
        self.relay = relay
        self.election_interval = election_interval
        self.reconnect_max = reconnect_max
        self.socket_timeout = socket_timeout
        self.connect_timeout = connect_timeout
        self.local_wait = local_wait
        self.autostart = autostart
        db = redis.connection.parse_url(url).get("db", 0) if url.startswith(("redis", "unix")) else 0
        self.pubsub_channel = pubsub_channel or f"_message_bus_{db or 0}"
        self._bus: Bus | None = None
        self._started = False
        self._closed = False
        self._init_process_state()
        # health (counters survive fork: they describe the bridge, not the process)
        self.state: PublishState = "unknown"
        self.relay_state: RelayState = "standby"
        self.last_error: str | None = None
        self.last_error_at: float | None = None
        self.redis_role: str | None = None
        self.published = 0
        self.relayed = 0
        self.relay_lost = 0
        self.unrelayable = 0
        self.resets = 0
        self.takeovers = 0
        self.dropped = 0

    def _init_process_state(self) -> None:
        """Everything that must not cross a fork: sockets, threads, locks, the lock fd, the queue."""
        self._pid = os.getpid()
        self._client: redis.Redis | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._flusher: threading.Thread | None = None
        self._state_lock = threading.Lock()
        self._queue_lock = threading.Lock()
        self._queue: collections.deque[Envelope] = collections.deque()
        self._tls = threading.local()
        self._lock_fd = -1
        self._is_relay = False
        self._pubsub_conn: Any = None
        self._highest = 0  # the newest global id the relay has handled (stored, or skipped as already there)
        self.backend_newest = 0  # the newest global id the relay knows Redis holds (metrics: the relay's lag)
        self._dup = (0, 0)

    # ------------------------------------------------------------------ engine hooks
    def attached(self, bus: Bus) -> None:
        if self._bus is not None and self._bus is not bus:
            raise ValueError(f"this RedisBridge already serves {self._bus!r}; create one bridge per bus")
        self._bus = bus
        self._closed = False
        if self.autostart:
            self.start()

    def detached(self, bus: Bus) -> None:
        if bus.default is not self:
            self.close()

    def after_fork(self, bus: Bus) -> None:
        """In the child: the parent's threads are gone; its lock fd and sockets must not be used/unlocked."""
        if self._pid == os.getpid():
            return
        if self._lock_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)  # closing our copy keeps the parent's lock (the OFD lives on there)
        started = self._started
        self._init_process_state()
        self._started = False
        self.relay_state = "standby"
        if started and not self._closed:
            self.start()

    def close(self) -> None:
        """Stop relaying and electing, release the relay lock, drop connections. Idempotent."""
        self._closed = True
        self._stop.set()
        conn = self._pubsub_conn
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.disconnect()  # wakes the relay out of its read at once
        for t in (self._thread, self._flusher):
            if t is not None and t is not threading.current_thread() and self._pid == os.getpid():
                t.join(10)
        self._thread = self._flusher = None
        self._release_lock()
        if self._lock_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)
            self._lock_fd = -1
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None
        self._started = False
        self.relay_state = "off"

    def start(self) -> None:
        """Start this process's election thread (the relay runs in it while this process holds the lock)."""
        if self._started or not self.relay:
            return
        self._started = True
        self._stop = threading.Event()
        name = self._bus.name if self._bus is not None else "?"
        t = threading.Thread(target=self._elect_loop, name=f"shmbus-redis-relay-{name}", daemon=True)
        self._thread = t
        t.start()

    def __repr__(self) -> str:
        return f"RedisBridge({redact_url(self.url)!r})"

    # ------------------------------------------------------------------ connections
    @property
    def client(self) -> redis.Redis:
        """This process's command connection pool (publish, catch-up, gap reads). No automatic retries: a
        retried EVALSHA whose reply was lost would publish twice."""
        c = self._client
        if c is None or self._pid != os.getpid():
            c = redis.Redis.from_url(
                self.url,
                socket_timeout=self.socket_timeout,
                socket_connect_timeout=self.connect_timeout,
                retry=Retry(NoBackoff(), 0),
                health_check_interval=0,
                protocol=2,
            )  # RESP2: pub/sub replies are plain
            self._client = c
        return c

    def _set_state(self, state: PublishState, error: BaseException | None = None) -> None:
        self._record(error)
        if state != self.state:
            old, self.state = self.state, state
            detail = state != "ok" and self.last_error is not None
            self._log_transition(logging.INFO if state == "ok" else logging.WARNING, "publish", old, state, detail)

    def _set_relay_state(self, state: RelayState, error: BaseException | None = None) -> None:
        self._record(error)
        if state != self.relay_state:
            old, self.relay_state = self.relay_state, state
            level = logging.WARNING if state == "reconnecting" else logging.INFO
            self._log_transition(level, f"relay (pid {os.getpid()})", old, state, error is not None)

    def _record(self, error: BaseException | None) -> None:
        if error is not None:
            self.last_error = f"{type(error).__name__}: {error}"
            self.last_error_at = time.time()

    def _log_transition(self, level: int, side: str, old: str, new: str, with_error: bool) -> None:
        suffix = f" ({self.last_error})" if with_error and self.last_error else ""
        log.log(level, "shmbus redis bridge %s: %s state %s -> %s%s", redact_url(self.url), side, old, new, suffix)

    # ------------------------------------------------------------------ publish
    def _bus_of(self, bus: Bus | None) -> Bus:
        b = bus or self._bus
        if b is None:
            raise RuntimeError("RedisBridge is not attached to a bus")
        return b

    def publish(self, bus: Bus, envelope: Envelope) -> int | None:
        """Store ``envelope`` in Redis (ids from Redis) and locally; the channel id, or None if queued."""
        if self._bus is None:
            self.attached(bus)
        batch: Batch | None = getattr(self._tls, "batch", None)
        if batch is not None:
            batch.bus = bus
            batch.envelopes.append(envelope)
            return None
        if self._queue and self._enqueue_if_queueing(envelope):
            return None
        try:
            gid, cid = self._eval(bus, envelope)
        except RedisBridgeError:
            if self.queue_in_memory:
                self._enqueue(envelope)
                return None
            raise
        self._land(bus, [(envelope, gid, cid)])
        return cid

    @contextlib.contextmanager
    def batch(self) -> Iterator[Batch]:
        """Pipeline every ``bus.publish`` made by this thread inside the block (one round trip per 1000)."""
        if getattr(self._tls, "batch", None) is not None:
            raise RuntimeError("RedisBridge.batch() blocks do not nest")
        b = Batch(self._bus)
        self._tls.batch = b
        try:
            yield b
        finally:
            self._tls.batch = None
        if b.envelopes:
            b.ids = self._publish_envelopes(self._bus_of(b.bus), b.envelopes)

    def publish_many(self, bus: Bus, items: Iterable[tuple[Any, ...]]) -> list[int | None]:
        """Publish ``(channel, data)`` or ``(channel, data, {publish kwargs})`` items, pipelined, in order."""
        with self.batch() as b:
            for item in items:
                bus.publish(item[0], item[1], **(item[2] if len(item) > 2 else {}), engine=self)
        return b.ids

    def _publish_envelopes(self, bus: Bus, envs: list[Envelope]) -> list[int | None]:
        out: list[int | None] = []
        for i in range(0, len(envs), 1000):
            chunk = envs[i : i + 1000]
            if self._queue and self._enqueue_if_queueing(*chunk):
                out.extend([None] * len(chunk))
                continue
            try:
                ids = self._eval_many(bus, chunk)
            except RedisBridgeError:
                if not self.queue_in_memory:
                    raise
                self._enqueue(*chunk)
                out.extend([None] * len(chunk))
                continue
            self._land(bus, [(e, g, c) for e, (g, c) in zip(chunk, ids, strict=True)])
            out.extend(c for _, c in ids)
        return out

    def _args(self, bus: Bus, env: Envelope) -> list[Any]:
        return layout.script_args(env, bus.codec, bus.max_global_backlog_size, self.pubsub_channel)

    def _eval(self, bus: Bus, env: Envelope) -> tuple[int, int]:
        args = self._args(bus, env)
        try:
            try:
                res = self.client.execute_command("EVALSHA", layout.PUBLISH_SHA, *args)
            except redis.exceptions.NoScriptError:
                self.client.script_load(layout.PUBLISH_SCRIPT)
                res = self.client.execute_command("EVALSHA", layout.PUBLISH_SHA, *args)
        except Exception as exc:
            raise self._publish_error(exc) from exc
        self.published += 1
        self._set_state("ok")
        return int(res[0]), int(res[1])

    def _eval_many(self, bus: Bus, envs: list[Envelope]) -> list[tuple[int, int]]:
        """One pipelined round trip; each group of up to ``_GROUP`` messages is ONE run of the batch script (far
        less per-call work in Redis than one EVALSHA per message). NOSCRIPT loads the script and re-sends."""
        args = [self._args(bus, e) for e in envs]
        groups = [args[i : i + _GROUP] for i in range(0, len(args), _GROUP)]
        results: list[Any] = [None] * len(groups)
        todo = list(range(len(groups)))
        for _attempt in range(2):
            try:
                pipe = self.client.pipeline(transaction=False)
                for g in todo:
                    pipe.execute_command("EVALSHA", layout.PUBLISH_MANY_SHA, *layout.many_script_args(groups[g]))
                got = pipe.execute(raise_on_error=False)
            except Exception as exc:
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
        self.published += len(envs)
        self._set_state("ok")
        flat = [int(x) for r in results for x in r]
        return list(zip(flat[0::2], flat[1::2], strict=True))

    def _publish_error(self, exc: BaseException) -> RedisBridgeError:
        if isinstance(exc, RedisBridgeError):
            return exc
        msg = str(exc)
        if isinstance(exc, redis.exceptions.ReadOnlyError) or (
            isinstance(exc, redis.exceptions.ResponseError) and "READONLY" in msg
        ):
            self._set_state("readonly", exc)
            return RedisReadOnly(
                f"Redis at {redact_url(self.url)} is a read-only replica; message not published ({msg})"
            )
        if isinstance(exc, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)):
            self._set_state("unreachable", exc)
            return RedisUnavailable(
                f"Redis at {redact_url(self.url)} is unreachable; message not published "
                f"(or, if the connection broke mid-reply, outcome unknown): {msg}"
            )
        self._set_state("error", exc)
        return RedisBridgeError(f"Redis at {redact_url(self.url)} refused the publish: {msg}")

    # ------------------------------------------------------------------ local store after publish
    def _land(self, bus: Bus, items: list[tuple[Envelope, int, int]]) -> None:
        """Make our messages visible locally before publish returns (read-your-writes).

        A message directly follows the segment's last global id? Append it ourselves (atomic check in the
        segment). Otherwise another message sits in between: wait for the relay, which writes them in order.
        """
        seg = bus.segment
        for env, gid, cid in items:
            if seg.global_id() >= gid:
                continue
            try:
                if bus.store(env, global_id=gid, message_id=cid, expect_global_id=gid - 1):
                    continue
            except Exception:
                log.exception("shmbus redis bridge: storing published message %d locally failed", gid)
            self._wait_local(seg, items[-1][1])
            return

    def _wait_local(self, seg: Segment, gid: int) -> None:
        if self.local_wait <= 0 or not self._relay_running():
            return
        deadline = time.monotonic() + self.local_wait
        epoch = seg.read_epoch()
        while True:
            word = seg.futex_word()
            if seg.global_id() >= gid or seg.read_epoch() != epoch:
                return
            left = deadline - time.monotonic()
            if left <= 0:
                return
            seg.wait(word, min(left, 0.05))

    def _relay_running(self) -> bool:
        if self._is_relay:
            return True
        fd = self._ensure_lock_fd()
        try:
            return fd >= 0 and relay_held_by_other(fd)
        except OSError:
            return False

    # ------------------------------------------------------------------ in-memory queue
    def _enqueue_if_queueing(self, *envs: Envelope) -> bool:
        with self._queue_lock:
            if not self._queue:
                return False
            self._push(envs)
        return True

    def _enqueue(self, *envs: Envelope) -> None:
        with self._queue_lock:
            self._push(envs)
        if self._flusher is None or not self._flusher.is_alive():
            t = threading.Thread(target=self._flush_loop, name="shmbus-redis-flush", daemon=True)
            self._flusher = t
            t.start()

    def _push(self, envs: Iterable[Envelope]) -> None:
        for env in envs:
            self._queue.append(env)
            if len(self._queue) > self.max_in_memory_publish_backlog:
                self._queue.popleft()
                self.dropped += 1
                log.warning(
                    "shmbus redis bridge: in-memory publish queue full (%d); dropped the oldest message",
                    self.max_in_memory_publish_backlog,
                )

    def _flush_loop(self) -> None:
        """Republish queued messages in order once Redis takes writes again (probing once a second)."""
        bus = self._bus_of(None)
        while not self._stop.is_set():
            with self._queue_lock:
                if not self._queue:
                    return
                env = self._queue[0]
            try:
                gid, cid = self._eval(bus, env)
            except RedisBridgeError:
                self._stop.wait(1.0)
                continue
            with self._queue_lock:
                if self._queue and self._queue[0] is env:
                    self._queue.popleft()
            with contextlib.suppress(Exception):
                self._land(bus, [(env, gid, cid)])

    # ------------------------------------------------------------------ health
    def health(self) -> dict[str, Any]:
        """This process's side of the bridge (``bus.health()`` includes it under ``engine_health``)."""
        return {
            "redis_url": redact_url(self.url),
            "pubsub_channel": self.pubsub_channel,
            "state": self.state,
            "relay": self._is_relay,
            "relay_state": self.relay_state,
            "redis_role": self.redis_role,
            "last_error": self.last_error,
            "last_error_at": self.last_error_at,
            "published": self.published,
            "queued": len(self._queue),
            "dropped_from_queue": self.dropped,
            "relayed": self.relayed,
            "relay_highest_global_id": self._highest,
            "relay_backend_global_id": self.backend_newest,
            "relay_lost": self.relay_lost,
            "unrelayable": self.unrelayable,
            "resets": self.resets,
            "takeovers": self.takeovers,
        }
