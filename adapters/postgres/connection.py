"""The bridge's PostgreSQL connection: every wait for the server bounded by ``command_timeout``."""

from __future__ import annotations

from typing import Any

import psycopg

__all__ = ["TimedConnection"]


class TimedConnection(psycopg.Connection[Any]):
    """A connection whose every wait for the server ends after ``command_timeout`` seconds: the connection is then
    closed (its state is unknown) and :class:`psycopg.OperationalError` raised. Waits given their own timeout
    (``notifies``) keep it."""

    command_timeout: float | None = None
    shmbus_prepared = False  #: the single publish's statement is prepared on this connection (see ``direct``)

    def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
        limit = self.command_timeout if timeout is None else timeout
        try:
            return super().wait(gen, interval, limit)
        except psycopg.errors._WaitTimeout:
            if timeout is not None:
                raise
            self.pgconn.finish()  # mid-statement on a server that does not answer: unusable
            raise psycopg.OperationalError(f"the server did not answer within {limit} s") from None
