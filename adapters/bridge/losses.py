"""What the relay counts as lost, and how it says so: one object, so the rule is written once.

A host is owed what was published after it began relaying: a brand-new segment's relay takes the backend's
``gone_upto`` at its first read as the host's start (:meth:`LossBook.joined`), and ids trimmed before it are history
the host never had, not its loss (a new host counted 2,000 to 27,323 of them, and logged a line per id the
backend's channel backlogs no longer held). What is counted goes to ``relay_lost`` at once and is logged as ONE
line per catch-up (:meth:`LossBook.report`), however many runs and single ids it was made of. A message larger
than this host's ring can hold (published on a host with a larger ring) is a loss too, with its own reason
(:meth:`LossBook.too_large`).
"""

from __future__ import annotations

import logging

from .status import BridgeStatus

__all__ = ["LossBook"]


class LossBook:
    """``relay_lost`` and its log line for one relay (see the module doc)."""

    def __init__(self, status: BridgeStatus, log: logging.Logger) -> None:
        self.status = status
        self.log = log
        self.owed_after = 0  #: ids at or below it were published before this host began relaying: never its loss
        self._count = 0  # counted since the last report, between ids _first and _last
        self._first = self._last = 0

    def joined(self, gone_upto: int) -> None:
        """A brand-new segment's relay read the backend for the first time: what was gone by then (at or below
        ``gone_upto``) was never this host's."""
        self.owed_after = max(self.owed_after, gone_upto)

    def lose(self, first: int, last: int) -> int:
        """Count the ids ``first``..``last`` as lost, but those before the host began; how many were counted."""
        first = max(first, self.owed_after + 1)
        lost = max(0, last - first + 1)
        if lost:
            self.status.relay_lost += lost
            self._first = min(self._first, first) if self._count else first
            self._last = max(self._last, last)
            self._count += lost
        return lost

    def too_large(self, global_id: int, why: Exception, bus_name: str) -> None:
        """Message ``global_id`` is larger than this host's ring can hold (a host with a larger ring published
        it): a loss for this host's live subscribers, counted and said as such; a backlog read across it is
        completed from the backend."""
        self.status.relay_lost += 1
        self.log.warning(
            "shmbus %s bridge: message %d is too large for bus %r on this host (%s): not stored here, counted in "
            "relay_lost; live subscribers miss it, backlog reads across it are filled from the backend",
            self.status.kind,
            global_id,
            bus_name,
            why,
        )

    def report(self, bus_name: str) -> None:
        """Log what was counted since the last report, in one line."""
        if not self._count:
            return
        count, self._count = self._count, 0
        self.log.warning(
            "shmbus %s bridge: %d message(s) between ids %d and %d were gone from the backend before this host read "
            "them (trimmed, expired, or written after the hole timeout); bus %r misses them",
            self.status.kind,
            count,
            self._first,
            self._last,
            bus_name,
        )

    def after_fork(self) -> None:
        self.owed_after = self._count = 0
