"""The sender's cursor: the newest global id below which every read message is settled (each of its pushes sent,
failed, expired or dropped), however the pushes of later messages finish."""

from __future__ import annotations

import threading

__all__ = ["CursorTracker"]


class CursorTracker:
    """Which read messages still have pushes in flight; the cursor is everything below the oldest of them."""

    def __init__(self, cursor: int) -> None:
        self.read_upto = cursor
        self.pending: dict[int, int] = {}
        self.lock = threading.Lock()

    def open(self, gid: int, jobs: int) -> None:
        with self.lock:
            self.pending[gid] = jobs
            self.read_upto = gid

    def skip(self, gid: int) -> None:
        with self.lock:
            self.read_upto = gid

    def settle(self, gid: int) -> None:
        with self.lock:
            left = self.pending[gid] - 1
            if left:
                self.pending[gid] = left
            else:
                del self.pending[gid]

    @property
    def cursor(self) -> int:
        with self.lock:
            return min(self.pending) - 1 if self.pending else self.read_upto

    @property
    def in_flight(self) -> int:
        return len(self.pending)
