"""Landing a host's own writes: a publish returns once its message is readable on this host (read-your-writes)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from .election import RelayElection

if TYPE_CHECKING:
    from shmbus.engines import Envelope
    from shmbus.host import BusHost
    from shmbus.segment import Segment

__all__ = ["Landing", "wait_until_held"]

LANDING_SLICE = 0.05  # seconds of one futex wait while a publisher and the relay wait on each other


class Landing:
    """A message that directly follows the segment's newest is appended by its publisher (checked under the
    segment's lock: ``expect_global_id``), so the segment stays contiguous and the relay finds it there. Otherwise
    another message sits in between: the publisher waits up to ``local_wait`` for the relay to store it, and lands
    its own as soon as they follow the segment's newest again (not at all when no process of the host relays).

    Landing its own is the publisher's job, not the relay's: when a channel's backlog is trimmed in the backend
    before the relay read it (a burst larger than ``max_backlog_size``), only the publisher still holds the
    message, and the relay waits for it (:meth:`~.catchup.CatchUpRules.landed`) instead of counting it lost.

    Only in the history the segment holds: when the backend wrote the messages into another one (Redis after a
    FLUSHDB restarts its ids at 1, so a new id can directly follow the segment's newest of the old history), the
    publisher leaves them to the relay, which resets the bus first."""

    def __init__(self, election: RelayElection, local_wait: float, log: logging.Logger) -> None:
        self.election = election
        self.local_wait = local_wait
        self.log = log

    def land(self, bus: BusHost, items: list[tuple[Envelope, int, int]], history: int | None = None) -> None:
        """``items``: ``(envelope, global id, message id)`` in id order, just acknowledged by the backend in
        ``history`` (None: the backend does not say)."""
        seg = bus.segment
        recorded = seg.history_id()
        if history is not None and recorded and history != recorded:
            self.wait(bus, items[-1][1])
            return
        deadline = epoch = None
        i = 0
        while i < len(items):
            env, gid, mid = items[i]
            word = seg.futex_word()  # read first: a store after the check below ends the wait at once
            newest = seg.global_id()
            if newest >= gid:
                i += 1  # the relay stored it (or a reset passed it)
                continue
            if newest == gid - 1:
                try:
                    if bus.store(env, global_id=gid, message_id=mid, expect_global_id=gid - 1):
                        i += 1
                    continue  # else another store came in between: look again
                except Exception:
                    self.log.exception("shmbus bridge: storing published message %d locally failed", gid)
                    self.wait(bus, items[-1][1])
                    return
            # messages of other publishers sit in between: the relay stores them, then this one lands its own
            if self.local_wait <= 0 or not self.election.running():
                return
            now = time.monotonic()
            if deadline is None:
                deadline, epoch = now + self.local_wait, seg.read_epoch()
            if now >= deadline or seg.read_epoch() != epoch:
                return
            seg.wait(word, min(deadline - now, LANDING_SLICE))

    def wait(self, bus: BusHost, gid: int) -> None:
        """Wait until the segment holds ``gid`` (or was reset), at most ``local_wait``, if a relay runs."""
        if self.local_wait <= 0 or not self.election.running():
            return
        wait_until_held(bus.segment, gid, self.local_wait)


def wait_until_held(
    seg: Segment,
    gid: int,
    timeout: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], object] | None = None,
    stop: threading.Event | None = None,
) -> bool:
    """Wait on the segment's futex until it holds ``gid``: True if it does; False when ``timeout`` (on ``clock``)
    passed, the bus was reset or ``stop`` was set. ``sleep`` replaces the futex wait (a test's fake clock). The
    publisher waiting for the relay and the relay waiting for a publisher both wait here."""
    deadline = clock() + timeout
    epoch = seg.read_epoch()
    while True:
        word = seg.futex_word()  # read first: a store after the check below ends the wait at once
        if seg.global_id() >= gid or seg.read_epoch() != epoch:
            return seg.global_id() >= gid
        left = deadline - clock()
        if left <= 0 or (stop is not None and stop.is_set()):
            return False
        if sleep is not None:
            sleep(min(left, LANDING_SLICE))
        else:
            seg.wait(word, min(left, LANDING_SLICE))
