"""Push subscriptions and the sender's state in PostgreSQL (the bridge's database), and the sender's election there.

Two tables in the DSN's schema (``search_path``), created on first use: ``shmbus_push_subscriptions`` (one row per
device, keyed by namespace and endpoint) and ``shmbus_push_state`` (one row per namespace: a version bumped in the
same transaction as every subscription change, the sender's term, cursor and counters). The election is a session
advisory lock on its own connection: the server releases it when that session ends, including when the holder is
killed or its connection is cut.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from typing import Any

import psycopg

from shmbus.perprocess import Birth

from .state import SenderState, StaleSender
from .subscriptions import Registration, user_key

__all__ = ["PostgresElector", "PostgresStore"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS shmbus_push_subscriptions (
    namespace text NOT NULL,
    endpoint text NOT NULL,
    user_key text NOT NULL,
    p256dh text NOT NULL,
    auth text NOT NULL,
    topics text[] NOT NULL,
    site_id text,
    created double precision NOT NULL,
    PRIMARY KEY (namespace, endpoint)
);
CREATE INDEX IF NOT EXISTS shmbus_push_subscriptions_user ON shmbus_push_subscriptions (namespace, user_key);
CREATE TABLE IF NOT EXISTS shmbus_push_state (
    namespace text PRIMARY KEY,
    version bigint NOT NULL DEFAULT 0,
    term bigint NOT NULL DEFAULT 0,
    cursor bigint,
    counters jsonb NOT NULL DEFAULT '{}',
    queue_depth bigint NOT NULL DEFAULT 0,
    leader text NOT NULL DEFAULT '',
    updated double precision NOT NULL DEFAULT 0
);
"""
_COLUMNS = "endpoint, user_key, p256dh, auth, topics, site_id, created"
_KEEPALIVES: dict[str, Any] = {"keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2, "keepalives_count": 3}


def _registration(row: tuple[Any, ...]) -> Registration:
    endpoint, ukey, p256dh, auth, topics, site_id, created = row
    return Registration(endpoint, p256dh, auth, json.loads(ukey), tuple(topics), site_id, created)


class PostgresStore:
    """The :class:`~shmbus.adapters.push.state.Store` on PostgreSQL. One connection per process (made again
    after a fork or a failure), used under a lock: each call is one short statement or transaction."""

    def __init__(self, dsn: str, namespace: str = "default", connect_timeout: float = 5.0) -> None:
        self.dsn = dsn
        self.namespace = namespace
        self.connect_timeout = connect_timeout
        self._lock = threading.Lock()
        self._conn: psycopg.Connection[Any] | None = None
        self._birth = Birth()
        self._ready = False

    def __repr__(self) -> str:
        return f"PostgresStore(namespace={self.namespace!r})"

    def _connection(self) -> psycopg.Connection[Any]:
        if not self._birth.here:
            self._birth.renew()
            self._conn = None  # the parent's socket is not ours
        if self._conn is None or self._conn.closed:
            conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=max(1, int(self.connect_timeout)))
            if not self._ready:
                with conn.transaction():
                    conn.execute("SELECT pg_advisory_xact_lock(hashtext('shmbus.push.setup.' || current_schema()))")
                    conn.execute(SCHEMA)
                    conn.execute(
                        "INSERT INTO shmbus_push_state (namespace) VALUES (%s) ON CONFLICT DO NOTHING",
                        (self.namespace,),
                    )
                self._ready = True
            self._conn = conn
        return self._conn

    def _run(self, fn: Any) -> Any:
        with self._lock:
            conn = self._connection()
            try:
                return fn(conn)
            except psycopg.OperationalError:
                conn.close()
                self._conn = None
                raise

    def _bump(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute("UPDATE shmbus_push_state SET version = version + 1 WHERE namespace = %s", (self.namespace,))

    def add(self, reg: Registration) -> None:
        def go(conn: psycopg.Connection[Any]) -> None:
            with conn.transaction():
                conn.execute(
                    f"INSERT INTO shmbus_push_subscriptions (namespace, {_COLUMNS}) VALUES (%s,%s,%s,%s,%s,%s,%s,%s) "
                    "ON CONFLICT (namespace, endpoint) DO UPDATE SET user_key = EXCLUDED.user_key, "
                    "p256dh = EXCLUDED.p256dh, auth = EXCLUDED.auth, topics = EXCLUDED.topics, "
                    "site_id = EXCLUDED.site_id, created = EXCLUDED.created",
                    (
                        self.namespace,
                        reg.endpoint,
                        user_key(reg.user_id),
                        reg.p256dh,
                        reg.auth,
                        list(reg.topics),
                        reg.site_id,
                        reg.created,
                    ),
                )
                self._bump(conn)

        self._run(go)

    def remove(self, endpoint: str, user_id: Any = None) -> bool:
        def go(conn: psycopg.Connection[Any]) -> bool:
            with conn.transaction():
                sql = "DELETE FROM shmbus_push_subscriptions WHERE namespace = %s AND endpoint = %s"
                params: tuple[Any, ...] = (self.namespace, endpoint)
                if user_id is not None:
                    sql += " AND user_key = %s"
                    params += (user_key(user_id),)
                gone = conn.execute(sql, params).rowcount > 0
                if gone:
                    self._bump(conn)
                return gone

        return bool(self._run(go))

    def of_user(self, user_id: Any) -> list[Registration]:
        sql = f"SELECT {_COLUMNS} FROM shmbus_push_subscriptions WHERE namespace = %s AND user_key = %s"
        rows = self._run(lambda c: c.execute(sql, (self.namespace, user_key(user_id))).fetchall())
        return [_registration(r) for r in rows]

    def all(self) -> list[Registration]:
        sql = f"SELECT {_COLUMNS} FROM shmbus_push_subscriptions WHERE namespace = %s"
        return [_registration(r) for r in self._run(lambda c: c.execute(sql, (self.namespace,)).fetchall())]

    def version(self) -> Any:
        sql = "SELECT version FROM shmbus_push_state WHERE namespace = %s"
        return self._run(lambda c: c.execute(sql, (self.namespace,)).fetchone()[0])

    def load(self) -> SenderState:
        sql = "SELECT cursor, term, counters, queue_depth, leader, updated FROM shmbus_push_state WHERE namespace = %s"
        row = self._run(lambda c: c.execute(sql, (self.namespace,)).fetchone())
        cursor, term, counters, depth, leader, updated = row
        return SenderState.from_json({"cursor": cursor, "term": term, "counters": counters,
                                      "queue_depth": depth, "leader": leader, "updated": updated})  # fmt: skip

    def take_over(self, leader: str) -> SenderState:
        sql = "UPDATE shmbus_push_state SET term = term + 1, leader = %s WHERE namespace = %s"
        self._run(lambda c: c.execute(sql, (leader, self.namespace)))
        return self.load()

    def save(self, state: SenderState) -> None:
        sql = (
            "UPDATE shmbus_push_state SET cursor = %s, counters = %s, queue_depth = %s, updated = %s "
            "WHERE namespace = %s AND term = %s"
        )
        params = (state.cursor, json.dumps(state.counters), state.queue_depth, state.updated, self.namespace,
                  state.term)  # fmt: skip
        if self._run(lambda c: c.execute(sql, params).rowcount) == 0:
            raise StaleSender(f"term {state.term} is over")

    def close(self) -> None:
        with self._lock:
            if self._conn is not None and self._birth.here:
                self._conn.close()
            self._conn = None


class PostgresElector:
    """One sender across every host of a namespace: ``pg_try_advisory_lock`` on a session of its own. ``held()``
    is a round trip on that session (a dead session means the lock may be someone else's now)."""

    def __init__(self, dsn: str, namespace: str = "default", connect_timeout: float = 5.0) -> None:
        self.dsn = dsn
        self.namespace = namespace
        self.connect_timeout = connect_timeout
        self._conn: psycopg.Connection[Any] | None = None
        self._birth = Birth()

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and self._birth.here:
            try:
                conn.close()
            except Exception:  # the session is gone either way
                pass
        self._birth.renew()

    def try_acquire(self) -> bool:
        if not self._birth.here:
            self._conn = None
            self._birth.renew()
        if self._conn is not None and self.held():
            return True
        try:
            conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=max(1, int(self.connect_timeout)),
                                   application_name=f"shmbus-push-sender {socket.gethostname()}:{os.getpid()}",
                                   **_KEEPALIVES)  # fmt: skip
            got = conn.execute(
                "SELECT pg_try_advisory_lock(hashtext('shmbus.push'), hashtext(%s))", (self.namespace,)
            ).fetchone()
        except psycopg.Error:
            return False
        if got and got[0]:
            self._conn = conn
            return True
        conn.close()
        return False

    def held(self) -> bool:
        if self._conn is None or not self._birth.here:
            return False
        try:
            self._conn.execute("SELECT 1")
            return True
        except psycopg.Error:
            self._drop()
            return False

    def release(self) -> None:
        self._drop()  # ending the session releases the lock
