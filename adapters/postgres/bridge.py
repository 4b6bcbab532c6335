"""PostgreSQL bridge: many hosts share one bus through the gem's ``message_bus`` table; reads stay in shared memory.

``bus = Bus("app", engine=PostgresBridge("postgresql://app@db/app"))``

* **Publish** calls one server-side procedure (``shmbus_send``, created next to the table) that runs the gem's
  publish statements in one round trip and in the gem's order: INSERT ... RETURNING id, COMMIT, then ``pg_notify``
  of the gem's line in a transaction of its own (a notifying transaction holds PostgreSQL's cluster-wide notify
  lock through its commit's WAL flush; apart, inserts commit in groups). Rows may therefore commit out of id
  order, which the relay waits out (below). The gem's
  trims (global backlog, channel backlogs, expiry) run in each host's relay every ``trim_interval`` seconds
  rather than inside every publish (the gem's per-publish trims make every insert walk the dead rows of earlier
  trims). The table, indexes, value format and notify channel are the gem's, so a Ruby app on the gem's postgres
  backend and a Python app on shmbus share one bus, with the same ids. The id is the row id: a message's channel
  id *is* its global id (a channel's ids have gaps), so the bridge marks the segment as holding sparse ids.
* **One relay per host** (the Redis bridge's election: an OFD lock on the segment file that the kernel releases
  when the holder dies) LISTENs on a dedicated connection and copies every message into the segment with the
  table's ids; on takeover or reconnect it catches up from the table after the segment's last id. A missing id
  below a committed one (a hole) is waited for until the transactions then writing to the table have ended.
* **Reads** come from the segment; only a gap (older than the segment holds) is filled from the table.
* **Faults**: an unreachable server makes ``publish`` raise :class:`PostgresUnavailable`; a read-only server (a
  standby after failover) :class:`PostgresReadOnly`, and ``health()`` says so (the relay checks for recovery
  before LISTEN); a table whose ids went back (reset, ``TRUNCATE ... RESTART IDENTITY``, dropped) or that lost the
  segment's newest message, or was truncated under load (its storage file changed and nothing is left at or below
  the relay's id of a second before), resets the bus's epoch; a dropped table or procedure is recreated.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import math
import os
import threading
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Literal

import psycopg
from psycopg import sql as pgsql

from shmbus.bus import Backlog
from shmbus.channels import backend_name, split_backend_name
from shmbus.engines import BacklogGap, Engine, Envelope
from shmbus.errors import EngineError
from shmbus.message import Message

from ..redis.election import relay_held_by_other, relay_lock_op
from ..redis.layout import PIPE_ESCAPE, decode_envelope, encode_envelope, parse_line
from . import sql
from .writers import WriterWait

if TYPE_CHECKING:
    from shmbus.bus import Bus
    from shmbus.segment import Segment

__all__ = ["PostgresBridge", "PostgresBridgeError", "PostgresReadOnly", "PostgresUnavailable"]

log = logging.getLogger("shmbus.postgres")

_PAGE = 1000  # catch-up page (rows per query)
_MISSING = (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedFunction)  # our objects were dropped
_GROUP = 1000  # messages per batched statement

PublishState = Literal["unknown", "ok", "unreachable", "readonly", "error"]
RelayState = Literal["standby", "connecting", "relaying", "reconnecting", "off"]


class PostgresBridgeError(EngineError):
    """The PostgreSQL bridge could not carry out a publish; the message was not stored."""


class PostgresUnavailable(PostgresBridgeError):
    """PostgreSQL could not be reached (or the connection broke mid-publish: the outcome is then unknown)."""


class PostgresReadOnly(PostgresBridgeError):
    """PostgreSQL refused the write as read-only: the bridge points at a standby (e.g. after a failover)."""


def redact_dsn(dsn: str) -> str:
    """The DSN without its password (for logs and ``health()``)."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparseable dsn>"
    info.pop("password", None)
    return psycopg.conninfo.make_conninfo("", **{k: v for k, v in info.items() if v is not None})


class PostgresBridge(Engine):
    """Engine that makes PostgreSQL (the gem's table) the source of ids and history (see the module doc).

    ``dsn``: a libpq connection string or URL (``search_path`` in ``options`` picks the schema). ``db``: the gem's
    ``db`` option, naming the notify channel ``_message_bus_<db>``; ``notify_channel`` overrides it (apps sharing
    a database with separate tables need separate channels, as with the gem). ``relay=False``: this process never
    relays (a script). ``election_interval``, ``reconnect_max``: as the Redis bridge. ``local_wait``: how long a
    publish waits for the relay to store it locally when it cannot itself. ``hole_timeout``: how long the relay
    waits for the transactions that may hold a missing id (a row drawn before a committed one but not committed
    yet) before counting the id as lost and moving past it; holes whose writers have ended are skipped at once.
    ``trim_interval``: how often the relay runs the gem's trims with the bus's ``max_global_backlog_size``,
    ``max_backlog_size`` (per channel it saw messages on) and ``max_backlog_age`` (0: never; per-publish limits
    apply to the segment only). ``connect_timeout``: seconds.
    ``synchronous_commit=False`` sets it off for this bridge's publishes: a publish no longer waits for the WAL
    flush (2-3x the rate where commits are fsync-bound), and a server crash may lose the last fraction of a second
    of acknowledged messages (never corrupt the table). The default keeps the server's setting.
    """

    sparse_ids = True

    def __init__(
        self,
        dsn: str = "postgresql://postgres@127.0.0.1:5432/postgres",
        *,
        db: int = 0,
        notify_channel: str | None = None,
        relay: bool = True,
        election_interval: float = 0.25,
        reconnect_max: float = 1.0,
        local_wait: float = 1.0,
        hole_timeout: float = 5.0,
        trim_interval: float = 1.0,
        connect_timeout: float = 3.0,
        synchronous_commit: bool = True,
        autostart: bool = True,
    ) -> None:
        self.dsn = dsn
        self.notify_channel = notify_channel or f"_message_bus_{db}"
        self.relay = relay
        self.election_interval = election_interval
        self.reconnect_max = reconnect_max
        self.local_wait = local_wait
        self.hole_timeout = hole_timeout
        self.trim_interval = trim_interval
        self.connect_timeout = connect_timeout
        self.synchronous_commit = synchronous_commit
        self.autostart = autostart
        self._bus: Bus | None = None
        self._started = False
        self._closed = False
        self._init_process_state()
        self.state: PublishState = "unknown"
        self.relay_state: RelayState = "standby"
        self.last_error: str | None = None
        self.last_error_at: float | None = None
        self.in_recovery: bool | None = None
        self.published = 0
        self.relayed = 0
        self.relay_lost = 0
        self.unrelayable = 0
        self.resets = 0
        self.takeovers = 0

    def _init_process_state(self) -> None:
        """What must not cross a fork: connections, threads, the lock fd."""
        self._pid = os.getpid()
        self._tls = threading.local()
        self._conns: list[psycopg.Connection[Any]] = []
        self._conns_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock_fd = -1
        self._is_relay = False
        self._listen_conn: psycopg.Connection[Any] | None = None
        self._highest = 0
        self.backend_newest = 0  # the newest id the relay knows the table holds (metrics: the relay's lag)
        self._ready = False  # the table and the function exist (checked once per process)
        self._active: dict[str, int] = {}  # channel -> newest id relayed since the last trim pass
        self._trimmed_below = 0  # the global trim's previous bound (rows at or below it are gone)
        self._next_trim = 0.0
        self._writers = WriterWait(self.hole_timeout)  # a hole's writers, waited for (never twice past the timeout)
        self._read_only = False  # the server refuses writes (a standby, or default_transaction_read_only)
        self._filenode: int | None = None  # the table's storage file: TRUNCATE gives it a new one
        self._mark = 0  # the relay's newest id at the previous rewrite check
        self._next_rewrite_check = 0.0

    # ------------------------------------------------------------------ engine hooks
    def attached(self, bus: Bus) -> None:
        if self._bus is not None and self._bus is not bus:
            raise ValueError(f"this PostgresBridge already serves {self._bus!r}; create one bridge per bus")
        if not bus.codec.is_json:
            raise ValueError("the PostgreSQL bridge stores values as text (the gem's format): use the json codec")
        self._bus = bus
        self._closed = False
        bus.segment.set_sparse_ids()
        if self.autostart:
            self.start()

    def detached(self, bus: Bus) -> None:
        if bus.default is not self:
            self.close()

    def after_fork(self, bus: Bus) -> None:
        if self._pid == os.getpid():
            return
        if self._lock_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)  # the parent's lock lives on in the parent's open file description
        started = self._started
        self._init_process_state()  # the parent's connections are abandoned, never closed (its sockets)
        self._started = False
        self.relay_state = "standby"
        if started and not self._closed:
            self.start()

    def start(self) -> None:
        """Start this process's election thread (the relay runs in it while this process holds the lock)."""
        if self._started or not self.relay:
            return
        self._started = True
        self._stop = threading.Event()
        name = self._bus.name if self._bus is not None else "?"
        t = threading.Thread(target=self._elect_loop, name=f"shmbus-postgres-relay-{name}", daemon=True)
        self._thread = t
        t.start()

    def close(self) -> None:
        """Stop relaying, release the relay lock, close connections. Idempotent."""
        self._closed = True
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread() and self._pid == os.getpid():
            t.join(10)
        self._thread = None
        self._release_lock()
        if self._lock_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)
            self._lock_fd = -1
        if self._pid == os.getpid():
            with self._conns_lock:
                conns, self._conns = self._conns, []
            for c in conns:
                with contextlib.suppress(Exception):
                    c.close()
        self._tls = threading.local()
        self._started = False
        self.relay_state = "off"
        self._ready = False

    def __repr__(self) -> str:
        return f"PostgresBridge({redact_dsn(self.dsn)!r})"

    # ------------------------------------------------------------------ connections
    def _connect(self) -> psycopg.Connection[Any]:
        conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=max(1, math.ceil(self.connect_timeout)))
        if not self.synchronous_commit:
            conn.execute("SET synchronous_commit = off")
        if not self._ready:
            try:
                self._create_objects(conn)
            except BaseException:
                conn.close()
                raise
        return conn

    def _create_objects(self, conn: psycopg.Connection[Any]) -> None:
        """Create the table, its indexes and the publish functions where missing (once per process, and again
        after a statement found one gone: ``_ready`` is cleared on UndefinedTable/UndefinedFunction). On a
        read-only server whose table exists this only notes the state: a relay can still read."""
        try:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(hashtext('shmbus.setup.' || current_schema()))")
                for stmt in sql.CREATE_TABLE:
                    conn.execute(stmt)
                conn.execute(sql.CREATE_PROCEDURE)
                conn.execute(sql.CREATE_MANY_PROCEDURE)
        except psycopg.errors.ReadOnlySqlTransaction as exc:
            self._set_state("readonly", exc)
            row = conn.execute("SELECT to_regclass('message_bus') IS NOT NULL").fetchone()
            if not (row and row[0]):
                raise
            return  # _ready stays False: a writable server gets the objects on the next connection
        self._ready = True

    def _conn(self) -> psycopg.Connection[Any]:
        """This thread's command connection (publish, catch-up, gap reads), made on first use."""
        if self._pid != os.getpid():
            self._init_process_state()
        conn: psycopg.Connection[Any] | None = getattr(self._tls, "conn", None)
        if conn is None or conn.closed:
            conn = self._connect()
            self._tls.conn = conn
            with self._conns_lock:
                self._conns.append(conn)
        return conn

    def _drop_conn(self) -> None:
        conn = getattr(self._tls, "conn", None)
        self._tls.conn = None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    # ------------------------------------------------------------------ publish
    def _bus_of(self, bus: Bus | None) -> Bus:
        b = bus or self._bus
        if b is None:
            raise RuntimeError("PostgresBridge is not attached to a bus")
        return b

    def _row(self, bus: Bus, env: Envelope) -> tuple[str, str, str]:
        chan = backend_name(env.channel, env.site_id)
        value = encode_envelope(bus.codec, env.payload, env.meta).decode()
        return chan, value, chan.replace("|", PIPE_ESCAPE)

    def publish(self, bus: Bus, envelope: Envelope) -> int | None:
        """Insert ``envelope`` (the id comes from the table), notify, trim; store it locally; return its id."""
        if self._bus is None:
            self.attached(bus)
        batch: list[Envelope] | None = getattr(self._tls, "batch", None)
        if batch is not None:  # inside publish_many: collected, sent together
            batch.append(envelope)
            return None
        chan, value, line_chan = self._row(bus, envelope)
        params = (chan, value, self.notify_channel, line_chan)
        try:
            row = self._execute(sql.PUBLISH, params).fetchone()
        except Exception as exc:
            raise self._publish_error(exc) from exc
        assert row is not None
        gid = int(row[0])
        self.published += 1
        self._set_state("ok")
        self._land(bus, [(envelope, gid)])
        return gid

    def publish_many(self, bus: Bus, items: Iterable[tuple[Any, ...]]) -> list[int]:
        """Publish ``(channel, data)`` or ``(channel, data, {publish kwargs})`` items: one statement (one round
        trip, one transaction) per 1000, in order. Returns their ids. Targeting kwargs are honoured."""
        envs: list[Envelope] = []
        self._tls.batch = envs
        try:  # the bus validates and encodes each item as for publish, then hands it to publish() above
            for item in items:
                bus.publish(item[0], item[1], **(item[2] if len(item) > 2 else {}), engine=self)
        finally:
            self._tls.batch = None
        return self.publish_envelopes(bus, envs)

    @contextlib.contextmanager
    def batch(self) -> Iterator[list[int]]:
        """Collect every ``bus.publish`` this thread makes inside the block; on exit send them in statements of up
        to 1000 (one round trip each). The yielded list then holds their ids, in publish order."""
        if getattr(self._tls, "batch", None) is not None:
            raise RuntimeError("PostgresBridge.batch() blocks do not nest")
        envs: list[Envelope] = []
        ids: list[int] = []
        self._tls.batch = envs
        try:
            yield ids
        finally:
            self._tls.batch = None
        if envs:
            ids.extend(self.publish_envelopes(self._bus_of(None), envs))

    def publish_envelopes(self, bus: Bus, envs: list[Envelope]) -> list[int]:
        out: list[int] = []
        for i in range(0, len(envs), _GROUP):
            chunk = envs[i : i + _GROUP]
            rows = [self._row(bus, e) for e in chunk]
            params = ([r[0] for r in rows], [r[1] for r in rows], self.notify_channel, [r[2] for r in rows])
            try:
                row = self._execute(sql.PUBLISH_MANY, params).fetchone()
                ids = [int(i) for i in (row[0] if row is not None else None) or ()]
            except Exception as exc:
                raise self._publish_error(exc) from exc
            self.published += len(ids)
            self._set_state("ok")
            self._land(bus, list(zip(chunk, ids, strict=True)))
            out.extend(ids)
        return out

    def _execute(self, query: str, params: tuple[Any, ...]) -> psycopg.Cursor[Any]:
        """Run a publish statement; when the table or a function is gone (a plain ``DROP TABLE message_bus``, a
        dropped function) recreate them and run it once more (the failed statement changed nothing)."""
        conn = self._conn()
        try:
            return conn.execute(query, params, prepare=True)
        except _MISSING:
            self._ready = False
            self._create_objects(conn)
            return conn.execute(query, params, prepare=True)

    def _publish_error(self, exc: BaseException) -> PostgresBridgeError:
        if isinstance(exc, PostgresBridgeError):
            return exc
        where = redact_dsn(self.dsn)
        if isinstance(exc, psycopg.errors.ReadOnlySqlTransaction):
            self._set_state("readonly", exc)
            return PostgresReadOnly(f"PostgreSQL at {where} is read-only (a standby?); message not published: {exc}")
        if isinstance(exc, (psycopg.OperationalError, OSError)):
            self._drop_conn()
            self._set_state("unreachable", exc)
            return PostgresUnavailable(
                f"PostgreSQL at {where} is unreachable; message not published (or, if the connection broke "
                f"mid-reply, outcome unknown): {exc}"
            )
        self._drop_conn()
        self._set_state("error", exc)
        return PostgresBridgeError(f"PostgreSQL at {where} refused the publish: {exc}")

    def _land(self, bus: Bus, items: list[tuple[Envelope, int]]) -> None:
        """Read-your-writes: append our messages ourselves when they directly follow the segment's last id,
        else wait (up to ``local_wait``) for the relay, which stores everything in id order."""
        seg = bus.segment
        for env, gid in items:
            if seg.global_id() >= gid:
                continue
            try:
                if bus.store(env, global_id=gid, message_id=gid, expect_global_id=gid - 1):
                    continue
            except Exception:
                log.exception("shmbus postgres bridge: storing published message %d locally failed", gid)
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
        try:
            return relay_held_by_other(self._ensure_lock_fd())
        except OSError:
            return False

    # ------------------------------------------------------------------ state
    def _set_state(self, state: PublishState, error: BaseException | None = None) -> None:
        self._record(error)
        if state != self.state:
            old, self.state = self.state, state
            level = logging.INFO if state == "ok" else logging.WARNING
            log.log(
                level,
                "shmbus postgres bridge %s: publish %s -> %s%s",
                redact_dsn(self.dsn),
                old,
                state,
                f" ({self.last_error})" if error is not None else "",
            )

    def _set_relay_state(self, state: RelayState, error: BaseException | None = None) -> None:
        self._record(error)
        if state != self.relay_state:
            old, self.relay_state = self.relay_state, state
            level = logging.WARNING if state == "reconnecting" else logging.INFO
            log.log(
                level,
                "shmbus postgres bridge %s: relay (pid %d) %s -> %s%s",
                redact_dsn(self.dsn),
                os.getpid(),
                old,
                state,
                f" ({self.last_error})" if error is not None else "",
            )

    def _record(self, error: BaseException | None) -> None:
        if error is not None:
            self.last_error = f"{type(error).__name__}: {error}"
            self.last_error_at = time.time()

    def health(self) -> dict[str, Any]:
        """This process's side of the bridge (``bus.health()`` includes it)."""
        return {
            "dsn": redact_dsn(self.dsn),
            "notify_channel": self.notify_channel,
            "state": self.state,
            "error": self.last_error if self.state in ("readonly", "unreachable", "error") else None,
            "relay": self._is_relay,
            "relay_state": self.relay_state,
            "in_recovery": self.in_recovery,
            "last_error": self.last_error,
            "last_error_at": self.last_error_at,
            "published": self.published,
            "relayed": self.relayed,
            "relay_highest_global_id": self._highest,
            "relay_backend_global_id": self.backend_newest,
            "relay_lost": self.relay_lost,
            "unrelayable": self.unrelayable,
            "resets": self.resets,
            "takeovers": self.takeovers,
        }

    # ------------------------------------------------------------------ election (the Redis bridge's lock)
    def _ensure_lock_fd(self) -> int:
        if self._lock_fd < 0:
            self._lock_fd = os.open(self._bus_of(None).segment.path, os.O_RDWR | os.O_CLOEXEC)
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
                log.exception("shmbus postgres bridge: election/relay error (retrying)")
                self._set_relay_state("standby", exc)
            stop.wait(self.election_interval)

    # ------------------------------------------------------------------ relay
    def _relay_loop(self) -> None:
        stop = self._stop
        backoff = 0.05
        self._set_relay_state("connecting")
        while not stop.is_set():
            conn = None
            try:
                conn = self._connect()
                self._listen_conn = conn
                self._check_server(conn)  # a standby refuses LISTEN: say read-only rather than only "reconnecting"
                conn.execute(pgsql.SQL("LISTEN {}").format(pgsql.Identifier(self.notify_channel)))
                self._check_history(self._conn())
                self._catch_up(self._conn())
                self._set_relay_state("relaying")
                backoff = 0.05
                self._pump(conn)
            except Exception as exc:
                if stop.is_set():
                    return
                if not isinstance(exc, (psycopg.Error, OSError, ValueError, PostgresBridgeError)):
                    log.exception("shmbus postgres bridge: relay error")
                if isinstance(exc, psycopg.errors.ReadOnlySqlTransaction):  # SQLSTATE 25006
                    self._set_state("readonly", exc)
                if isinstance(exc, _MISSING):  # the table or a function was dropped: recreate on reconnect
                    self._ready = False
                    self._drop_conn()
                self._set_relay_state("reconnecting", exc)
                stop.wait(backoff)
                backoff = min(backoff * 2, self.reconnect_max)
            finally:
                self._listen_conn = None
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.close()

    def _pump(self, conn: psycopg.Connection[Any]) -> None:
        """Wait for notices on the LISTEN connection; store each line (queries go over the relay thread's command
        connection: the LISTEN connection is busy inside ``notifies()``)."""
        stop = self._stop
        idle_since = time.monotonic()
        while not stop.is_set():
            # returns as soon as one notice arrives, with every notice received in the same read
            lines = [n.payload for n in conn.notifies(timeout=0.25, stop_after=1)]
            for line in lines:
                self._on_line(line)
            now = time.monotonic()
            if now >= self._next_rewrite_check:
                self._next_rewrite_check = now + 1.0
                self._check_rewrite(self._conn())
            if self.trim_interval > 0 and now >= self._next_trim:
                self._next_trim = now + self.trim_interval
                self._trim(self._conn())
            if lines:
                idle_since = now
            elif now - idle_since > 5.0:  # quiet: check the server (alive, standby, table still ours), and
                conn.execute("SELECT 1")  # pick up rows whose notice never came (written without one)
                self._check_history(self._conn())
                self._catch_up(self._conn())
                idle_since = now

    def _on_line(self, payload: str) -> None:
        line = payload.encode()
        try:
            gid = int(line[: line.index(b"|")])
        except ValueError:
            return  # not one of ours (the gem's unsubscribe marker, or noise)
        self.backend_newest = max(self.backend_newest, gid)
        if gid <= self._highest:
            if not self._is_stored(gid, line):  # ids went back: the table was reset or recreated
                self._check_history(self._conn())
                self._catch_up(self._conn())
            return  # else stored already (by the catch-up, or by its publisher)
        if gid <= self._bus_of(None).segment.global_id():
            # its publisher, on this host, stored it (publishers store only right after the segment's last id,
            # the relay only settled ids, so every id up to the segment's last is settled): no decode, no store
            self._highest = gid
            chan = _line_channel(line)
            if chan is not None:
                self._active[chan] = gid
            return
        d = None
        if gid == self._highest + 1:
            try:
                d = parse_line(line)
            except ValueError:
                d = None
        if d is None or not d.envelope:  # a gap, or a line cut at NOTIFY's limit: the table decides
            self._catch_up(self._conn())
            return
        self._store(gid, backend_name(d.channel, d.site_id), d.envelope)

    def _is_stored(self, gid: int, line: bytes) -> bool:
        """Is message ``gid`` of this line's channel in the segment? (A notice at or below the relay's last id
        is normally one the catch-up stored already; after a table reset it is a new message.)"""
        recs = self._bus_of(None).segment.global_backlog(gid - 1, limit=1)
        if not recs or recs[0].global_id != gid:
            return False
        try:
            d = parse_line(line)
            rec = recs[0]
            if rec.channel.decode() != d.channel or (rec.site.decode() or None) != d.site_id:
                return False
            return not d.envelope or decode_envelope(self._bus_of(None).codec, d.envelope)[0] == rec.payload
        except (ValueError, TypeError):
            return True

    def _store(self, gid: int, chan: str, value: bytes) -> None:
        """Store one message; ``_highest`` advances once it is stored, or skipped as unstorable (an error from
        the segment propagates with ``_highest`` unchanged: the next catch-up tries it again)."""
        bus = self._bus_of(None)
        try:
            channel, site = split_backend_name(chan)
            payload, meta = decode_envelope(bus.codec, value)
            env = Envelope(channel, site, payload, meta, bus.max_backlog_size, bus.max_backlog_age)
            stored = bus.store(env, global_id=gid, message_id=gid, timestamp=time.time())
        except (ValueError, UnicodeDecodeError, TypeError) as exc:
            self.unrelayable += 1
            log.warning("shmbus postgres bridge: cannot store message %d locally (%s); skipped", gid, exc)
            self._highest = gid
            return
        self._highest = gid
        if stored:
            self.relayed += 1
        self._active[chan] = gid

    def _trim(self, conn: psycopg.Connection[Any]) -> None:
        """The gem's trims, once per ``trim_interval`` (see the module doc): the global backlog (above the previous
        pass's bound), rows older than ``max_backlog_age`` (through the added_at index), and each channel seen
        since the last pass down to its newest ``max_backlog_size`` rows."""
        if self._read_only:
            return  # a read-only server refuses DELETE; its primary's relays trim
        bus = self._bus_of(None)
        top = self._highest
        keep = bus.max_global_backlog_size
        if top > keep and top - keep > self._trimmed_below:
            conn.execute(sql.TRIM_GLOBAL, (top - keep, self._trimmed_below), prepare=True)
            self._trimmed_below = top - keep
        with conn.transaction():
            conn.execute("SET LOCAL enable_seqscan = off")  # the added_at index: never a scan of dead rows
            conn.execute(sql.TRIM_EXPIRE, (_age(bus.max_backlog_age),), prepare=True)
        active, self._active = self._active, {}
        for chan, newest in active.items():
            conn.execute(sql.TRIM_CHANNEL, (chan, chan, newest, bus.max_backlog_size), prepare=True)

    def _catch_up(self, conn: psycopg.Connection[Any]) -> None:
        """Store every row after the segment's last id, in id order, waiting out holes (see :meth:`_settle`).

        A missing id below a committed one (a hole) is either a row not yet committed (ids are drawn at INSERT,
        rows appear at COMMIT, and the gem's INSERTs or a slow commit may finish out of id order), or final
        (rolled back, or trimmed before this relay read it). Rows after a hole wait behind it: the segment holds
        ascending ids. Every hole of a page is settled with one wait, so final holes cost no wait each."""
        bus = self._bus_of(None)
        highest = max(self._highest, bus.segment.global_id())
        settled = highest  # missing ids at or below this one were checked: final (or lost, below ``lost_upto``)
        lost_upto = 0
        while not self._stop.is_set():
            rows = conn.execute(sql.SELECT_AFTER, (highest, _PAGE), prepare=True).fetchall()
            hole = False
            for gid, chan, value in rows:
                gid = int(gid)
                if highest and gid != highest + 1:
                    if gid - 1 > settled:
                        hole = True
                        break
                    self._skip_hole(highest + 1, gid - 1, lost_upto)
                self._store(gid, chan, value.encode())
                highest = gid
            if hole:
                top = int(rows[-1][0])  # every id missing below it was drawn before it was
                if not self._settle(conn):
                    lost_upto = top
                settled = top
                continue  # read again: rows committed meanwhile fill their holes, the rest are final
            if len(rows) < _PAGE:
                break
        self._highest = max(self._highest, highest)
        self.backend_newest = max(self.backend_newest, self._highest)

    def _settle(self, conn: psycopg.Connection[Any]) -> bool:
        """Wait until every transaction that may hold a missing id has ended; False after ``hole_timeout``.

        Called right after a read showed a hole. A transaction that drew a missing id took RowExclusiveLock on
        the table before drawing it (so before the later, committed id was drawn) and holds it until it ends: if
        it had not ended when the read's snapshot was taken, it is among the holders listed now (or it ended in
        between, and the next read sees its row if it committed). No holder: the holes are final at once."""
        if self._writers.settle(conn, pause=self._stop.wait, stopped=self._stop.is_set):
            return True
        if self._writers.outlived:
            log.warning(
                "shmbus postgres bridge: %d transaction(s) writing to message_bus still open after hole_timeout "
                "(%.1f s); the ids missing below the newest read count as lost",
                len(self._writers.outlived),
                self.hole_timeout,
            )
        return False

    def _skip_hole(self, first: int, last: int, lost_upto: int) -> None:
        """Move past ids ``first``..``last``, which a settled read still misses: final holes (rolled back,
        trimmed) are no loss; those whose transaction outlived ``hole_timeout`` are counted as lost."""
        lost = max(0, min(last, lost_upto) - first + 1)
        if lost:
            self.relay_lost += lost
            log.warning(
                "shmbus postgres bridge: ids %d..%d were still uncommitted after hole_timeout; moving on (%d lost "
                "if they commit later)",
                first,
                min(last, lost_upto),
                lost,
            )
        else:
            log.debug("shmbus postgres bridge: ids %d..%d never committed (rolled back or trimmed)", first, last)

    def _check_server(self, conn: psycopg.Connection[Any]) -> None:
        """Note whether the server is a standby (in recovery) or read-only; raise :class:`PostgresReadOnly` for a
        standby, where LISTEN is refused (the relay retries with backoff; ``health()`` says ``readonly``)."""
        row = conn.execute("SELECT pg_is_in_recovery(), current_setting('transaction_read_only') = 'on'").fetchone()
        assert row is not None
        self._note_server(bool(row[0]), bool(row[1]))
        if self.in_recovery:
            raise PostgresReadOnly(
                f"PostgreSQL at {redact_dsn(self.dsn)} is in recovery (a standby): it refuses LISTEN and writes"
            )

    def _note_server(self, in_recovery: bool, read_only: bool) -> None:
        was = self._read_only
        self.in_recovery = in_recovery
        self._read_only = in_recovery or read_only
        if self._read_only and self.state != "readonly":
            what = "in recovery (a standby)" if in_recovery else "read-only (transaction_read_only is on)"
            self._set_state("readonly", PostgresReadOnly(f"the server is {what}"))
        elif was and not self._read_only and self.state == "readonly":
            self._set_state("unknown")  # writable again (e.g. failed back): the next publish tells

    def _check_history(self, conn: psycopg.Connection[Any]) -> None:
        """Reset the bus when the table is no longer the history the segment holds: its ids went back (the
        gem's reset!, ``TRUNCATE ... RESTART IDENTITY``, a recreated table) or the segment's newest message is
        gone while nothing newer exists (``TRUNCATE``)."""
        bus = self._bus_of(None)
        seg = bus.segment
        row = conn.execute(
            "SELECT max(id), pg_is_in_recovery(), current_setting('transaction_read_only') = 'on' FROM message_bus"
        ).fetchone()
        assert row is not None
        table_max = int(row[0] or 0)
        self.backend_newest = table_max
        self._note_server(bool(row[1]), bool(row[2]))
        seg_max = seg.global_id()
        if not seg_max or table_max > seg_max:
            return
        same = table_max == seg_max and self._same_row(conn, seg, seg_max)
        if not same:
            self._reset_bus(f"the table's history is not the bus's (table max id {table_max}, bus {seg_max})")

    def _check_rewrite(self, conn: psycopg.Connection[Any]) -> None:
        """Notice a plain ``TRUNCATE`` under load (ids go on, so neither the ids nor a quiet moment tell): once a
        second, when the table's storage file changed (TRUNCATE; also VACUUM FULL and CLUSTER, which keep the rows)
        and no row remains at or below the id the relay had reached at the previous check, the history the
        segment holds is gone: reset the bus, as for a table emptied while quiet. Two index probes."""
        row = conn.execute(sql.SELECT_REWRITE, (self._mark,), prepare=True).fetchone()
        assert row is not None
        filenode, kept = row[0], row[1]
        changed = self._filenode is not None and filenode != self._filenode
        self._filenode = filenode
        if changed and self._mark and kept is None and self._bus_of(None).segment.global_id():
            self._reset_bus(f"the table was truncated (nothing left at or below id {self._mark})")
        self._mark = self._highest

    def _reset_bus(self, why: str) -> None:
        bus = self._bus_of(None)
        self.resets += 1
        log.warning("shmbus postgres bridge: %s: resetting bus %r so clients resynchronise", why, bus.name)
        bus.reset()
        self._highest = 0
        self._trimmed_below = 0
        self._active.clear()

    def _same_row(self, conn: psycopg.Connection[Any], seg: Segment, gid: int) -> bool:
        recs = seg.global_backlog(gid - 1)
        if not recs or recs[0].global_id != gid:
            return True  # nothing to compare with: trust the ids
        rec = recs[0]
        row = conn.execute("SELECT channel, value FROM message_bus WHERE id = %s", (gid,)).fetchone()
        if row is None or row[0] != backend_name(rec.channel.decode(), rec.site.decode() or None):
            return False
        try:  # a recreated table's row may have the same id and channel: compare the data too
            return bool(decode_envelope(self._bus_of(None).codec, row[1].encode())[0] == rec.payload)
        except (ValueError, TypeError):
            return True

    # ------------------------------------------------------------------ reads older than the segment
    def backlog(self, bus: Bus, gap: BacklogGap) -> Backlog | None:
        """Fill a gap in the segment's backlog from the table (called by ``Bus.backlog``).

        The answer is the union of the table's rows and the segment's records after ``after_id``, limited to the
        newest ``max_backlog_size``. It has no gap when the table still holds a row of the channel at or before
        the client's position (trims remove a channel's oldest rows first, so nothing after it is gone) or the
        client starts from 0; otherwise the loss is reported."""
        channel, site_id, after_id, upto, limit, partial = gap
        chan = backend_name(channel, site_id)
        hi = partial.last_id if upto is None else min(upto, partial.last_id)
        keep = bus.max_backlog_size
        try:
            conn = self._conn()
            rows = conn.execute(sql.SELECT_CHANNEL_NEWEST, (chan, after_id, hi, keep + 1), prepare=True).fetchall()
            held = after_id == 0 or conn.execute(sql.SELECT_HELD, (chan, after_id), prepare=True).fetchone() is not None
        except psycopg.Error as exc:
            log.warning("shmbus postgres bridge: could not read the older backlog of %r: %s", channel, exc)
            self._drop_conn()
            return None
        epoch = bus.segment.read_epoch()
        by_id = {m.message_id: m for m in partial}
        for gid, value in rows:
            gid = int(gid)
            if gid not in by_id:
                payload, meta = decode_envelope(bus.codec, value.encode())
                by_id[gid] = Message(gid, gid, channel, payload, bus.codec, site_id=site_id, meta=meta, epoch=epoch)
        merged = [by_id[k] for k in sorted(by_id)]
        if len(merged) > keep:  # beyond the backlog limit: the oldest count as trimmed
            first = merged[-keep - 1].message_id + 1
            merged = merged[-keep:]
        elif held:
            first = after_id + 1
        else:
            first = merged[0].message_id if merged else partial.first_available
        if limit is not None:
            del merged[limit:]
        return Backlog(merged, after_id=after_id, last_id=partial.last_id, first_available=first)


def _line_channel(line: bytes) -> str | None:
    """The backend channel name of a notice line (``gid|cid|chan|...``), unescaped; None if malformed."""
    parts = line.split(b"|", 3)
    if len(parts) < 4:
        return None
    try:
        return parts[2].decode().replace(PIPE_ESCAPE, "|")
    except UnicodeDecodeError:
        return None


def _age(seconds: float) -> int:
    return max(1, math.ceil(seconds))
