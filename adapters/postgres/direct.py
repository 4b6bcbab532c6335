"""The single publish on libpq directly: one prepared ``CALL shmbus_send`` sent, its reply awaited on the socket.

psycopg's ``Connection.execute`` (a cursor, each parameter adapted, its generator-based wait, the row maker) costs
most of a publish's client time: measured here after a 2 ms sleep, 296 µs of thread CPU against 79 µs for the same
prepared statement sent with ``PQsendQueryPrepared`` and read when the socket says so. That time sits between the
caller's ``publish`` and the statement on the wire, so it is cross-host latency too.

The connection is the thread's psycopg connection (:meth:`PostgresBackend.conn`), left idle after every call, so
psycopg goes on using it. The wait keeps the connection's ``command_timeout`` as :class:`TimedConnection` does: a
server that does not answer within it has the connection closed and :class:`psycopg.OperationalError` raised. An
error reply raises psycopg's own exception class for its SQLSTATE (``UndefinedFunction`` for a dropped procedure).
"""

from __future__ import annotations

import select
import time
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import pq

if TYPE_CHECKING:
    from .connection import TimedConnection

__all__ = ["call_publish", "forget_prepared"]

_NAME = b"shmbus_send_1"  # psycopg names its own prepared statements _pg3_<n>
_CALL = b"CALL shmbus_send($1, $2, $3, $4)"
_OK = (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK)


def call_publish(conn: TimedConnection, params: tuple[str, str, str, str]) -> int | None:
    """``CALL shmbus_send(channel, value, notify channel, line channel)``; the new id (None: no row came back)."""
    enc = conn.info.encoding
    args = [p.encode(enc) for p in params]
    if not conn.shmbus_prepared:
        _prepare(conn)
    try:
        result = _run(conn, lambda pg: pg.send_query_prepared(_NAME, args))
    except psycopg.errors.InvalidSqlStatementName:  # the server forgot it (a pooler's DISCARD ALL): once more
        _prepare(conn)
        result = _run(conn, lambda pg: pg.send_query_prepared(_NAME, args))
    if result.ntuples < 1:
        return None
    value = result.get_value(0, 0)
    return int(value) if value is not None else None


def _prepare(conn: TimedConnection) -> None:
    conn.shmbus_prepared = False
    _run(conn, lambda pg: pg.send_prepare(_NAME, _CALL))
    conn.shmbus_prepared = True


def forget_prepared(conn: TimedConnection) -> None:
    """Drop the prepared CALL (it names objects dropped since: a recreated procedure needs a new one)."""
    conn.shmbus_prepared = False
    try:
        _run(conn, lambda pg: pg.send_query(b"DEALLOCATE " + _NAME))
    except psycopg.errors.InvalidSqlStatementName:
        pass  # never prepared on this connection


def _run(conn: TimedConnection, send: Any) -> pq.abc.PGresult:
    """Send with ``send(pgconn)``, wait for the whole reply within the connection's timeout, return its result."""
    pgconn = conn.pgconn
    limit = conn.command_timeout
    deadline = None if limit is None else time.monotonic() + limit
    send(pgconn)
    result = first_error = None
    try:
        poller = select.poll()
        poller.register(pgconn.socket, select.POLLIN)
        while pgconn.flush():  # a large statement that did not fit the socket's buffer at once
            _wait(conn, deadline, select.POLLOUT)
        while True:
            pgconn.consume_input()  # a closed connection raises psycopg.OperationalError here
            if not pgconn.is_busy():
                break
            _wait(conn, deadline, select.POLLIN, poller)
        while (r := pgconn.get_result()) is not None:
            if r.status not in _OK and first_error is None:
                first_error = r
            result = r
    except BaseException:  # interrupted mid-reply (a signal, the caller's own timeout) or the connection failed:
        pgconn.finish()  # a later statement would read this reply, so the connection goes (conn() makes another)
        raise
    if first_error is not None:
        raise psycopg.errors.error_from_result(first_error, encoding=conn.info.encoding)
    if result is None:
        raise psycopg.OperationalError("the server sent no result")
    return result


def _wait(conn: TimedConnection, deadline: float | None, events: int, poller: select.poll | None = None) -> None:
    if poller is None:
        poller = select.poll()
        poller.register(conn.pgconn.socket, events)
    left = None if deadline is None else deadline - time.monotonic()
    if left is not None and (left <= 0 or not poller.poll(left * 1000)):
        conn.pgconn.finish()  # mid-statement on a server that does not answer: unusable
        raise psycopg.OperationalError(f"the server did not answer within {conn.command_timeout} s")
    if left is None:
        poller.poll()
