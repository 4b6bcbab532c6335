"""When to poll next, sans-IO: the backoff after failures and the pause after an answer."""

from __future__ import annotations

import random
from collections.abc import Callable

__all__ = ["MIN_RETRY_AFTER", "Backoff", "pause_after_poll", "retry_after_seconds"]

#: A 429 is never retried sooner than this (seconds), whatever its ``Retry-After`` says (the JS client's floor).
MIN_RETRY_AFTER = 15.0
#: The share of a backoff delay that is random (so a restarted server is not hit by every client at once).
JITTER = 0.25


class Backoff:
    """Failure ``n`` waits ``min * 2**(n-1)``, capped at ``max``, less up to :data:`JITTER` of it at random;
    one success starts again from ``min``."""

    def __init__(self, minimum: float, maximum: float, rng: Callable[[], float] = random.random) -> None:
        self.minimum = minimum
        self.maximum = max(minimum, maximum)
        self.failures = 0
        self._rng = rng

    def base(self, failures: int) -> float:
        """The delay before jitter after ``failures`` failures in a row."""
        if failures <= 0:
            return 0.0
        return min(self.maximum, self.minimum * 2.0 ** min(failures - 1, 64))

    def failure(self) -> float:
        """Count a failure; the seconds to wait before the next attempt."""
        self.failures += 1
        base = self.base(self.failures)
        return base * (1.0 - JITTER * self._rng())

    def success(self) -> None:
        self.failures = 0


def retry_after_seconds(header: str | None, floor: float = MIN_RETRY_AFTER) -> float:
    """A 429's ``Retry-After`` (seconds; an HTTP date or garbage counts as 0), never less than ``floor``."""
    try:
        seconds = float((header or "").strip())
    except ValueError:
        seconds = 0.0
    if seconds != seconds or seconds < 0:  # NaN or negative
        seconds = 0.0
    return max(min(seconds, 24 * 3600.0), floor)


def pause_after_poll(
    *,
    elapsed: float,
    got_data: bool,
    long_polling: bool,
    min_poll_interval: float,
    callback_interval: float,
    background_callback_interval: float,
    empty_in_a_row: int = 1,
) -> float:
    """Seconds to wait after a successful poll that lasted ``elapsed`` seconds.

    Long polling: at once after messages (a long poll's own wait paces it). A poll that brought nothing is the
    ``empty_in_a_row``-th such one: the next starts ``min_poll_interval`` after it started, doubling with each
    one in a row up to ``callback_interval``. A server going down gracefully ends its held polls at once with
    nothing, and its restart is met at once rather than a whole ``callback_interval`` later; a server that never
    holds a poll (long polling off, a proxy) is soon polled once per ``callback_interval``, not in a loop. Polling
    mode: one poll per ``background_callback_interval``. Never two poll starts closer than ``min_poll_interval``.
    """
    if long_polling and got_data:
        target = min_poll_interval
    elif long_polling:
        target = min(callback_interval, min_poll_interval * 2.0 ** min(max(empty_in_a_row, 1) - 1, 64))
    else:
        target = background_callback_interval
    return max(target - elapsed, min_poll_interval - elapsed, 0.0)
