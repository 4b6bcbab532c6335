"""Single commands on the publish path, sent on connections of our own instead of through ``redis.Redis``.

A bridge publish is one EVALSHA. Through ``Redis.execute_command`` it also pays redis-py's client layer: the pool's
checkout and return, the retry wrapper, the observability hooks, event dispatch; measured here (one GET after a 2 ms
sleep, thread CPU): 308 µs through the client, 116 µs on a connection that sends and reads the command itself, and
in a warm loop 120 against 53 µs. That cost sits between the caller's ``publish`` and the command on the wire, so it
is cross-host latency too. The connections are made like the client's (same class and keyword arguments: URL, TLS,
timeouts, auth, RESP2), kept on an idle list (a thread takes one, puts it back; as many as threads ever published
at once) and never shared mid-command.

Numbers are sent as bytes (:func:`wire_args`): with hiredis installed, redis-py packs a command in C with
``hiredis.pack_command``, which turns an int or float into text with ``PyObject_Repr``; that call runs a pending
signal handler first, and when the handler raises (a SIGALRM timeout, Ctrl-C) it returns NULL, which
``pack_command`` does not check: the process dies of SIGSEGV (seen in the ``signal_in_publish`` fault scenario).
Bytes and str never reach that call.
"""

from __future__ import annotations

import contextlib
from typing import Any

import redis

from ..bridge.outcome import ReplyLost

__all__ = ["DirectCommands", "wire_args"]


def wire_args(args: tuple[Any, ...] | list[Any]) -> tuple[Any, ...]:
    """``args`` with every int and float as its decimal bytes, as Redis reads them (see the module doc)."""
    return tuple(
        (b"%d" % a if isinstance(a, int) else repr(a).encode()) if isinstance(a, (int, float)) else a for a in args
    )


class DirectCommands:
    """``execute(*args)``: one command and its reply on a connection of this object's own (see the module doc);
    ``execute_many(commands)``: several, written at once, their replies read in order (a batch's round trip)."""

    def __init__(self, client: redis.Redis) -> None:
        pool = client.connection_pool
        self._make = pool.connection_class
        self._kwargs = pool.connection_kwargs
        self._idle: list[Any] = []  # list.pop and list.append are atomic: no lock on the publish path

    def _take(self) -> Any:
        """An idle connection (or a new one), connected: a failure here sent nothing."""
        try:
            conn = self._idle.pop()
        except IndexError:
            conn = self._make(**self._kwargs)
        else:
            try:  # as redis-py's pool checks a connection it hands out: readable while idle means closed by the
                if conn.can_read(timeout=0):  # server (its idle timeout, CLIENT KILL, a restart) or out of step
                    conn.disconnect()
            except (redis.exceptions.ConnectionError, OSError):
                conn.disconnect()
        try:
            conn.connect()  # a no-op when connected
        except BaseException:
            self._drop(conn)
            raise
        return conn

    def _drop(self, conn: Any) -> None:
        conn.disconnect()
        self._idle.append(conn)  # reconnects on its next command

    def execute(self, *args: Any) -> Any:
        """Send ``args``, return the reply; a reply that is an error raises (``NoScriptError``, ``ResponseError``).
        A failure before the command was written raises as it is (nothing sent); one after it was, while waiting
        for the reply, raises :class:`~..bridge.outcome.ReplyLost` (a ``BaseException`` such as
        ``KeyboardInterrupt`` propagates as it is). Either way the connection is closed first: no half-read reply
        is ever left for the next command."""
        packed = wire_args(args)
        conn = self._take()
        try:
            conn.send_command(*packed)
        except redis.exceptions.RedisError:  # the socket refused the bytes: one command, never written whole
            self._drop(conn)
            raise
        except BaseException as exc:  # a signal handler's exception may come right after the last byte left
            self._drop(conn)
            if isinstance(exc, Exception):
                raise ReplyLost(exc, sent=None) from exc
            raise
        return self._read(conn, 1, single=True)[0]

    def execute_many(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        """Write ``commands`` at once and read their replies in order; an error reply is returned in its place (as
        redis-py's pipeline with ``raise_on_error=False``). Any failure once writing began is ``ReplyLost`` (part of
        the commands may have run)."""
        conn = self._take()
        try:
            conn.send_packed_command(conn.pack_commands([wire_args(c) for c in commands]))
        except BaseException as exc:
            self._drop(conn)
            if isinstance(exc, Exception):
                raise ReplyLost(exc, sent=None) from exc
            raise
        return self._read(conn, len(commands), single=False)

    def _read(self, conn: Any, count: int, *, single: bool) -> list[Any]:
        replies: list[Any] = []
        try:
            while len(replies) < count:
                try:
                    replies.append(conn.read_response())
                except redis.exceptions.ResponseError as exc:  # a whole error reply was read: still in step
                    if single:
                        self._idle.append(conn)
                        raise
                    replies.append(exc)
        except redis.exceptions.ResponseError:
            raise
        except BaseException as exc:
            self._drop(conn)
            if isinstance(exc, Exception):
                raise ReplyLost(exc) from exc
            raise
        self._idle.append(conn)
        return replies

    def close(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            with contextlib.suppress(Exception):
                conn.disconnect()
