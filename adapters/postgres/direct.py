"""The single publish on libpq directly: one prepared ``CALL shmbus_send`` sent, its reply awaited on the socket.

psycopg's ``Connection.execute`` (a cursor, each parameter adapted, its generator-based wait, the row maker) costs
most of a publish's client time: measured here after a 2 ms sleep, 296 µs of thread CPU against 79 µs for the same
prepared statement sent with ``PQsendQueryPrepared`` and read when the socket says so. That time sits between the
caller's ``publish`` and the statement on the wire, so it is cross-host latency too.

The connection is the thread's psycopg connection (:meth:`PostgresBackend.conn`), left idle after every call, so
psycopg goes on using it. The wait keeps the connection's ``command_timeout`` as :class:`TimedConnection` does: a
server that does not answer within it has the connection closed. What a failure means depends on when it came:
before the statement was handed to libpq, it raises as it is (nothing sent); once it was, any failure while waiting
for the reply (the timeout, the connection lost, an exception from a signal handler, an error reply that ends the
session such as ``pg_terminate_backend``'s: the procedure may have committed) closes the connection and raises
:class:`~..bridge.outcome.ReplyLost` (``KeyboardInterrupt`` and other ``BaseException`` classes propagate as they are).
Any other error reply raises psycopg's own exception class for its SQLSTATE (``UndefinedFunction`` for a dropped
procedure): the statement did not run.
"""

from __future__ import annotations

import select
import time
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import pq

from ..bridge.outcome import ReplyLost

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
    try:
        _run(conn, lambda pg: pg.send_prepare(_NAME, _CALL))
    except ReplyLost as lost:  # a PREPARE publishes nothing: its failure is a plain one
        raise lost.cause from None
    conn.shmbus_prepared = True


def forget_prepared(conn: TimedConnection) -> None:
    """Drop the prepared CALL (it names objects dropped since: a recreated procedure needs a new one)."""
    conn.shmbus_prepared = False
    try:
        _run(conn, lambda pg: pg.send_query(b"DEALLOCATE " + _NAME))
    except psycopg.errors.InvalidSqlStatementName:
        pass  # never prepared on this connection
    except ReplyLost as lost:
        raise lost.cause from None


def _run(conn: TimedConnection, send: Any) -> pq.abc.PGresult:
    """Send with ``send(pgconn)``, wait for the whole reply within the connection's timeout, return its result."""
    pgconn = conn.pgconn
    limit = conn.command_timeout
    deadline = None if limit is None else time.monotonic() + limit
    send(pgconn)  # raises when libpq could not take it (a connection already bad): nothing was sent
    result = first_error = None
    error: psycopg.Error | None = None
    try:
        poller = conn.poller()
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
        if first_error is not None:
            error = psycopg.errors.error_from_result(first_error, encoding=conn.info.encoding)
            if isinstance(error, psycopg.OperationalError):  # the session ended mid-statement (57P01 and friends)
                raise error
    except BaseException as exc:  # interrupted mid-reply (a signal, the caller's own timeout) or the connection failed:
        pgconn.finish()  # a later statement would read this reply, so the connection goes (conn() makes another)
        if isinstance(exc, Exception):
            raise ReplyLost(exc) from exc
        raise
    if error is not None:
        raise error
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
