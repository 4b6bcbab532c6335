"""The bridge's PostgreSQL connection: every wait for the server bounded by ``command_timeout``."""

from __future__ import annotations

import select
from typing import Any

import psycopg

__all__ = ["TimedConnection"]


class TimedConnection(psycopg.Connection[Any]):
    """A connection whose every wait for the server ends after ``command_timeout`` seconds: the connection is then
    closed (its state is unknown) and :class:`psycopg.OperationalError` raised. Waits given their own timeout
    (``notifies``) keep it."""

    command_timeout: float | None = None
    shmbus_prepared = False  #: the single publish's statement is prepared on this connection (see ``direct``)
    _poller: select.poll | None = None

    def poller(self) -> select.poll:
        """A poll object on this connection's socket (made once: the publish path waits on it every time)."""
        poller = self._poller
        if poller is None:
            poller = self._poller = select.poll()
            poller.register(self.pgconn.socket, select.POLLIN)
        return poller

    def closed_while_idle(self) -> bool:
        """Whether the server spoke while this connection was idle: nothing is pending on it, so anything readable
        (``pg_terminate_backend``'s or ``idle_session_timeout``'s FATAL, then EOF; a restart) means it is gone or out
        of step. Checked before a publish, when nothing has been sent, so replacing it never sends twice."""
        return bool(self.poller().poll(0))

    def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
        limit = self.command_timeout if timeout is None else timeout
        try:
            return super().wait(gen, interval, limit)
        except psycopg.errors._WaitTimeout:
            if timeout is not None:
                raise
            self.pgconn.finish()  # mid-statement on a server that does not answer: unusable
            raise psycopg.OperationalError(f"the server did not answer within {limit} s") from None
