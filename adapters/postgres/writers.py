"""Waiting out rows still in flight: the one rule the relay and the Spark source share.

Ids are drawn at INSERT and rows appear at COMMIT, so a row may commit after a higher id. The transaction that
drew a missing id took RowExclusiveLock on ``message_bus`` before drawing it and holds it until it ends: a reader
that saw a hole (or read the newest ids) waits for the transactions then holding that lock (``sql.SELECT_WRITERS``,
virtual transaction ids, never reused while the server runs) to end. A writer that outlives the timeout once is
not waited for again, so a long transaction costs one timeout, not one per read.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from . import sql

__all__ = ["WriterWait"]


class WriterWait:
    """The open writers of the table, waited for with a bound (see the module docstring). Not thread-safe: one per
    reading connection."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.stale: set[str] = set()  # writers that outlived the timeout once: never waited for again
        self.outlived: set[str] = set()  # those that outlived it in the last settle (for the caller's warning)

    @staticmethod
    def writers(conn: Any) -> set[str]:
        """The open transactions of other backends writing to the table (INSERTs and DELETEs in progress)."""
        return {str(r[0]) for r in conn.execute(sql.SELECT_WRITERS, prepare=True).fetchall()}

    def settle(
        self,
        conn: Any,
        *,
        pause: Callable[[float], object] = time.sleep,
        stopped: Callable[[], bool] = lambda: False,
    ) -> bool:
        """Wait until the writers open now have ended: True once they have (or none was open and no stale writer
        remains); False after ``timeout`` (or when ``stopped()``), their ids then counting as lost."""
        self.outlived = set()
        current = self.writers(conn)
        self.stale &= current  # forget those that ended
        waiting = current - self.stale
        if not waiting:
            return not self.stale  # a writer still open past the timeout may hold a hole: no wait, but lost
        deadline = time.monotonic() + self.timeout
        delay = 0.001
        while not stopped():
            waiting &= self.writers(conn)
            if not waiting:
                return True
            if time.monotonic() >= deadline:
                break
            pause(delay)
            delay = min(delay * 2, 0.02)
        self.stale |= waiting
        self.outlived = waiting
        return False
