"""The PostgreSQL side of the bridge kit (:class:`~shmbus.adapters.bridge.backend.Backend`): the gem's table.

Publishes call the ``shmbus_send`` procedures (which seal their notices); the relay LISTENs (any role with CONNECT may
``pg_notify``: an unsealed notice is only a doorbell) and reads the table after its position. Ids are drawn at INSERT
and appear at COMMIT, so a missing id may be in flight: :meth:`PostgresBackend.settle` waits for the table's writers
(``pg_locks``). Trims record the newest id they deleted (``shmbus_trimmed``): a missing id at or below it is a lost
message, not a rolled-back id; and per channel (``shmbus_trimmed_channels``): whether a channel's backlog from 0 is
whole. Every statement has a client-side timeout (``command_timeout``): a frozen server raises
:class:`PostgresUnavailable`, never blocks a publisher or the relay for the length of the freeze.
"""

from __future__ import annotations

import contextlib
import math
import secrets
import threading
from typing import TYPE_CHECKING, Any

import psycopg

from shmbus.channels import backend_name
from shmbus.perprocess import Birth
from shmbus.segment import BridgeRecord

from ..bridge.backend import Acknowledged, Page, Row
from ..bridge.outcome import ReplyLost, cause_text, note_unknown, outcome_unknown
from ..bridge.status import BridgeStatus
from ..bridge.wire import PIPE_ESCAPE, decode_envelope, encode_envelope
from . import sql
from .connection import TimedConnection
from .direct import call_publish, forget_prepared
from .doorbell import PostgresDoorbell
from .errors import PostgresBridgeError, PostgresReadOnly, PostgresUnavailable, redact_dsn
from .gaps import fill_backlog
from .writers import WriterWait

if TYPE_CHECKING:
    from shmbus.bus import Backlog
    from shmbus.engines import BacklogGap, Envelope
    from shmbus.host import BusHost
    from shmbus.segment import Segment

__all__ = ["PostgresBackend"]

_MISSING = (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedFunction)  # our objects were dropped


class PostgresBackend:
    """The gem's ``message_bus`` table (see the module doc); ``status`` is the bridge's, for the publish state."""

    kind = "postgres"
    sparse_ids = True
    seal_hash = "sha256"  # what PostgreSQL has without extensions
    errors: tuple[type[BaseException], ...] = (psycopg.Error, PostgresBridgeError)
    unreachable: tuple[type[BaseException], ...] = (psycopg.OperationalError,)

    def __init__(
        self,
        dsn: str,
        notify_channel: str,
        status: BridgeStatus,
        *,
        hole_timeout: float,
        connect_timeout: float,
        command_timeout: float,
        synchronous_commit: bool,
    ) -> None:
        self.dsn = dsn
        self.notify_channel = notify_channel
        self.status = status
        self.hole_timeout = hole_timeout
        self.connect_timeout = connect_timeout
        self.command_timeout = command_timeout
        self.synchronous_commit = synchronous_commit
        self.in_recovery: bool | None = None
        self.after_fork()

    def after_fork(self) -> None:
        """What must not cross a fork: connections (the parent's are abandoned, never closed: its sockets)."""
        self._birth = Birth()  # where these connections are made
        self._tls = threading.local()
        self._conns: list[psycopg.Connection[Any]] = []
        self._conns_lock = threading.Lock()
        self._ready = False  # the table and the procedures exist (checked once per process)
        self._read_only = False
        self._writers = WriterWait(self.hole_timeout)
        self._trimmed_below = 0  # the global trim's previous bound (rows at or below it are gone)
        self._newest = 0
        self._history: int | None = None
        self._seal_key: bytes | None = None
        self.noticed: set[str] = set()  # channels named by notices since the last trim pass (published here too)

    # ------------------------------------------------------------------ connections
    def connect(self) -> TimedConnection:
        conn = TimedConnection.connect(
            self.dsn, autocommit=True, connect_timeout=max(1, math.ceil(self.connect_timeout))
        )
        conn.command_timeout = self.command_timeout
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
        """Create the table, its indexes, the trim record and the procedures where missing (once per process, and
        again after a statement found one gone). On a read-only server whose table exists this only notes it."""
        try:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(hashtext('shmbus.setup.' || current_schema()))")
                for stmt in (*sql.CREATE_TABLE, *sql.CREATE_TRIMMED, *sql.CREATE_SEAL_KEY):
                    conn.execute(stmt)
                conn.execute(sql.INSERT_SEAL_KEY, (secrets.token_hex(32),))
                conn.execute(sql.CREATE_PROCEDURE)
                conn.execute(sql.CREATE_MANY_PROCEDURE)
        except psycopg.errors.ReadOnlySqlTransaction as exc:
            self.status.set_state("readonly", exc)
            row = conn.execute("SELECT to_regclass('message_bus') IS NOT NULL").fetchone()
            if not (row and row[0]):
                raise
            return  # _ready stays False: a writable server gets the objects on the next connection
        self._ready = True

    def conn(self) -> TimedConnection:
        """This thread's command connection (publish, the relay's reads, gap reads), made on first use."""
        if not self._birth.here:
            self.after_fork()
        conn: TimedConnection | None = getattr(self._tls, "conn", None)
        if conn is None or conn.closed:
            conn = self.connect()
            self._tls.conn = conn
            with self._conns_lock:
                self._conns.append(conn)
        return conn

    def drop_conn(self) -> None:
        conn = getattr(self._tls, "conn", None)
        self._tls.conn = None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def close(self) -> None:
        if self._birth.here:
            with self._conns_lock:
                conns, self._conns = self._conns, []
            for c in conns:
                with contextlib.suppress(Exception):
                    c.close()
        self._tls = threading.local()
        self._ready = False

    def record(self) -> BridgeRecord:
        try:
            secret = bool(psycopg.conninfo.conninfo_to_dict(self.dsn).get("password"))
        except psycopg.ProgrammingError:
            secret = True
        public = redact_dsn(self.dsn) if secret else self.dsn
        return BridgeRecord(self.kind, public, secret, {"notify_channel": self.notify_channel})

    def check(self, bus: BusHost) -> None:
        if not bus.codec.is_json:
            raise ValueError("the PostgreSQL bridge stores values as text (the gem's format): use the json codec")
        self._codec = bus.codec

    def describe(self) -> dict[str, Any]:
        return {"dsn": redact_dsn(self.dsn), "notify_channel": self.notify_channel, "in_recovery": self.in_recovery}

    # ------------------------------------------------------------------ publish
    def publish(self, bus: BusHost, envelopes: list[Envelope]) -> Acknowledged:
        """The procedures do not return the table's identity (it would change their signatures under running
        publishers): ``history`` is None. A plain TRUNCATE keeps the sequence going, so the new history's ids continue
        the old one's and a message landed before the relay's reset is the one it stores after (same id, same
        data); ``TRUNCATE ... RESTART IDENTITY`` restarts the ids: the README's limitation."""
        rows = []
        for env in envelopes:
            chan = backend_name(env.channel, env.site_id)
            rows.append(
                (chan, encode_envelope(bus.codec, env.payload, env.meta).decode(), chan.replace("|", PIPE_ESCAPE))
            )
        try:
            if len(rows) == 1:
                new_id = self._call_one((rows[0][0], rows[0][1], self.notify_channel, rows[0][2]))
                ids = [new_id] if new_id is not None else []
            else:
                params = ([r[0] for r in rows], [r[1] for r in rows], self.notify_channel, [r[2] for r in rows])
                row = self._execute(sql.PUBLISH_MANY, params).fetchone()
                ids = [int(i) for i in (row[0] if row is not None else None) or ()]
        except ReplyLost as lost:
            self.drop_conn()
            self.status.set_state("unreachable" if isinstance(lost.cause, self.unreachable) else "error", lost.cause)
            raise outcome_unknown(self.kind, redact_dsn(self.dsn), envelopes, lost) from lost.cause
        except (psycopg.Error, PostgresBridgeError, OSError) as exc:  # nothing sent, or refused whole
            raise self._publish_error(exc) from exc
        except BaseException as exc:
            if not isinstance(exc, Exception):
                note_unknown(exc, self.kind)
            raise
        return Acknowledged([(g, g) for g in ids], None)

    def _publish_conn(self) -> TimedConnection:
        """This thread's connection, replaced first when the server closed it while idle (``pg_terminate_backend``,
        ``idle_session_timeout``, a restart): the publish then goes on a new one instead of failing."""
        conn = self.conn()
        if conn.closed_while_idle():
            self.drop_conn()
            conn = self.conn()
        return conn

    def _call_one(self, params: tuple[str, str, str, str]) -> int | None:
        """One message: the prepared CALL on libpq directly (:mod:`.direct`); a NUL byte goes through psycopg,
        whose clear error (PostgreSQL text cannot hold one) the C strings of the direct call would not give."""
        if any("\x00" in p for p in params):
            row = self._execute(sql.PUBLISH, params).fetchone()
            return int(row[0]) if row is not None else None
        conn = self._publish_conn()
        try:
            return call_publish(conn, params)
        except _MISSING:
            self._ready = False
            forget_prepared(conn)
            self._create_objects(conn)
            return call_publish(conn, params)

    def _execute(self, query: str, params: tuple[Any, ...]) -> psycopg.Cursor[Any]:
        """Run a publish statement through psycopg; when the table or a procedure is gone (a plain ``DROP TABLE
        message_bus``) recreate them and run it once more (the failed statement changed nothing). A connection
        lost or timed out once the statement went out is :class:`ReplyLost` (psycopg does not say whether it was
        sent: it may have run)."""
        conn = self._publish_conn()
        try:
            try:
                return conn.execute(query, params, prepare=True)
            except _MISSING:
                self._ready = False
                self._create_objects(conn)
                return conn.execute(query, params, prepare=True)
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            raise ReplyLost(exc, sent=None) from exc
        except psycopg.Error:
            raise  # an error reply: the statement did not run
        except Exception as exc:
            raise ReplyLost(exc, sent=None) from exc

    def _publish_error(self, exc: BaseException) -> PostgresBridgeError:
        """A definite refusal (nothing was stored): the cause is named, never an empty reason."""
        if isinstance(exc, PostgresBridgeError):
            return exc
        where, text = redact_dsn(self.dsn), cause_text(exc)
        if isinstance(exc, psycopg.errors.ReadOnlySqlTransaction):
            self.status.set_state("readonly", exc)
            return PostgresReadOnly(f"PostgreSQL at {where} is read-only (a standby?); message not published: {text}")
        self.drop_conn()
        if isinstance(exc, (psycopg.OperationalError, OSError)):
            self.status.set_state("unreachable", exc)
            return PostgresUnavailable(f"PostgreSQL at {where} is unreachable; message not published: {text}")
        self.status.set_state("error", exc)
        return PostgresBridgeError(f"PostgreSQL at {where} refused the publish: {text}")

    # ------------------------------------------------------------------ the server's role
    def check_server(self, conn: psycopg.Connection[Any]) -> None:
        """Note whether the server is a standby or read-only; raise :class:`PostgresReadOnly` for a standby, where
        LISTEN is refused (the relay retries with backoff; ``health()`` says ``readonly``)."""
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
        if self._read_only and self.status.state != "readonly":
            what = "in recovery (a standby)" if in_recovery else "read-only (transaction_read_only is on)"
            self.status.set_state("readonly", PostgresReadOnly(f"the server is {what}"))
        elif was and not self._read_only and self.status.state == "readonly":
            self.status.set_state("unknown")  # writable again (e.g. failed back): the next publish tells

    # ------------------------------------------------------------------ the relay's reads
    def open_doorbell(self) -> PostgresDoorbell:
        return PostgresDoorbell(self)

    def _relay_query(self, query: str, params: tuple[Any, ...] = ()) -> list[Any]:
        try:
            return self.conn().execute(query, params, prepare=True).fetchall()
        except _MISSING:
            self._ready = False  # the table or a procedure was dropped: recreate on the next connection
            self.drop_conn()
            raise
        except psycopg.OperationalError:
            self.drop_conn()
            raise

    def read_seal_key(self, conn: psycopg.Connection[Any]) -> None:
        """Read the seal key (on the doorbell's connection, when it opens); a role that may not read it relays
        from the table only."""
        try:
            row = conn.execute(sql.SELECT_SEAL_KEY).fetchone()
        except (psycopg.errors.InsufficientPrivilege, psycopg.errors.UndefinedTable):
            row = None
        self._seal_key = row[0].encode() if row else None

    def seal_key(self) -> bytes | None:
        return self._seal_key

    def history_id(self) -> int:
        (history, newest, in_recovery, read_only) = self._relay_query(sql.SELECT_HISTORY)[0]
        self._newest = int(newest or 0)
        self._note_server(bool(in_recovery), bool(read_only))
        if history != self._history:
            self._history, self._trimmed_below = history, 0  # another table (or file): trims start over
        return int(history or 0)

    def history_continues(self, seg: Segment, changed: bool, mark: int) -> bool:
        """The segment's message at ``mark`` against the table's row of that id: the same channel and data means the
        same history (VACUUM FULL or CLUSTER change the identity and keep the rows). No such row: after an identity
        change (TRUNCATE, a recreated table) another history (also, wrongly, after a VACUUM FULL that followed a
        trim of the mark: the host was that far behind); with none recorded (an older segment), another history
        only if the table's ids went back below the mark."""
        recs = seg.global_backlog(mark - 1, limit=1)
        rows = self._relay_query("SELECT channel, value FROM message_bus WHERE id = %s", (mark,))
        if not rows:
            return not changed and self._newest >= mark
        if not recs or recs[0].global_id != mark:
            return True  # the ring no longer holds it: the row's presence is all there is to go by
        rec = recs[0]
        chan, value = rows[0]
        if chan != backend_name(rec.channel.decode(), rec.site.decode() or None):
            return False
        try:  # a recreated table's row may have the same id and channel: compare the data too
            return bool(decode_envelope(self._codec, value.encode())[0] == rec.payload)
        except (ValueError, TypeError):
            return True

    def read_after(self, after: int, limit: int) -> Page:
        rows = self._relay_query(sql.SELECT_PAGE, (after, limit))
        out = [Row(int(gid), int(gid), chan, value.encode()) for gid, chan, value, _ in rows]
        if out:
            self._newest = max(self._newest, out[-1].global_id)
        return Page(int(rows[0][3] or 0) if rows else 0, out)

    def gone_upto(self) -> int:
        return int(self._relay_query(sql.SELECT_GONE_UPTO)[0][0])

    def settle(self, stop: threading.Event) -> bool:
        """Wait until every transaction that may hold a missing id has ended; False after ``hole_timeout``. A
        transaction that drew a missing id took RowExclusiveLock on the table before drawing it and holds it until
        it ends: if it had not ended when the read's snapshot was taken, it is among the holders listed now."""
        if self._writers.settle(self.conn(), pause=stop.wait, stopped=stop.is_set):
            return True
        if self._writers.outlived:
            self.status.log.warning(
                "shmbus postgres bridge: %d transaction(s) writing to message_bus still open after hole_timeout "
                "(%.1f s); the ids missing below the newest read count as lost",
                len(self._writers.outlived),
                self.hole_timeout,
            )
        return False

    def newest_id(self) -> int:
        return self._newest

    def maintain(self, bus: BusHost, position: int, active: dict[str, int]) -> None:
        """The gem's trims: the global backlog (above the previous pass's bound), rows older than
        ``max_backlog_age`` (through the added_at index), and each channel seen since the last pass (stored by the
        relay, or named by a notice: its publisher may have stored it) down to its newest ``max_backlog_size`` rows;
        each records the newest id it deleted."""
        if self._read_only:
            return  # a read-only server refuses DELETE; its primary's relays trim
        conn = self.conn()
        keep = bus.max_global_backlog_size
        if position > keep and position - keep > self._trimmed_below:
            conn.execute(sql.TRIM_GLOBAL, (position - keep, self._trimmed_below), prepare=True)
            self._trimmed_below = position - keep
        with conn.transaction():
            conn.execute("SET LOCAL enable_seqscan = off")  # the added_at index: never a scan of dead rows
            conn.execute(sql.TRIM_EXPIRE, (max(1, math.ceil(bus.max_backlog_age)),), prepare=True)
        noticed, self.noticed = self.noticed, set()
        for chan in noticed.union(active):  # up to the relay's position: every id at or below it is settled
            conn.execute(sql.TRIM_CHANNEL, (chan, chan, position, bus.max_backlog_size), prepare=True)

    def fill_backlog(self, bus: BusHost, gap: BacklogGap) -> Backlog | None:
        try:
            return fill_backlog(self.conn(), bus, gap)
        except psycopg.Error as exc:
            self.status.log.warning("shmbus postgres bridge: could not read the older backlog of %r: %s", gap[0], exc)
            self.drop_conn()
            return None
