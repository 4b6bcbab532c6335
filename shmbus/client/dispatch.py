"""The callbacks' side of a client: the queue between the poll loop and the callbacks, and the task that runs them.

Callbacks run in order, one at a time; one that raises is logged and counted and the others still get the
message. The queue is unbounded by default (the reader never waits for a slow callback). With ``max_pending``
it is bounded, by one of two policies: ``"block"`` (the poll loop reads no further while ``max_pending``
deliveries wait: backpressure, down to the server's socket) or ``"drop_oldest"`` (the oldest deliveries are
dropped, counted in ``stats.dropped``; positions stay at what callbacks had, so a client resumed from them gets
the dropped messages again while the server still has them). A ``decoder`` turns each message's data into what
the callbacks take, once per message, here on the callbacks' side (a slow decoder never holds up the reading);
one that raises skips the message (logged, counted in ``stats.decode_errors``; the position moves past it,
since the same data would fail again).
"""

from __future__ import annotations

import inspect
import logging
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Literal

from .message import ClientMessage
from .outcomes import ClientStats
from .positions import CallbackDelivery
from .runs import Flag

__all__ = ["OVERFLOW_POLICIES", "Dispatcher", "Overflow"]

log = logging.getLogger("shmbus.client")
Overflow = Literal["block", "drop_oldest"]
OVERFLOW_POLICIES = ("block", "drop_oldest")
_FAILED = object()


class Dispatcher:
    """The delivery queue and the callbacks' task (:meth:`run`) of one client."""

    def __init__(
        self,
        stats: ClientStats,
        decoder: Callable[[Any], Any] | None = None,
        max_pending: int | None = None,
        overflow: Overflow = "block",
    ) -> None:
        if decoder is not None and not callable(decoder):
            raise TypeError(f"decoder must be callable, got {decoder!r}")
        if max_pending is not None and (
            isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending < 1
        ):
            raise ValueError(f"max_pending must be None or an int >= 1, got {max_pending!r}")
        if overflow not in OVERFLOW_POLICIES:
            raise ValueError(f"overflow must be one of {OVERFLOW_POLICIES}, got {overflow!r}")
        self._stats = stats
        self.decoder = decoder
        self.max_pending = max_pending
        self.overflow = overflow
        self.queue: deque[CallbackDelivery] = deque()
        #: set by stop() before anything else (from any thread): no callback runs after it
        self.halted = False
        self._warned = False
        self._queued: Flag | None = None
        self._drained: Flag | None = None
        self.resumed: Flag | None = None

    @property
    def blocking(self) -> bool:
        """Whether the poll loop must wait for :meth:`room` (``max_pending`` with ``overflow="block"``)."""
        return self.max_pending is not None and self.overflow == "block"

    def open(self, paused: bool) -> None:
        """Make the flags on the running loop (each start)."""
        self._queued, self._drained, self.resumed = Flag(), Flag(), Flag()
        if not paused:
            self.resumed.set()
        self.halted = False

    def clear(self) -> None:
        self.queue.clear()

    def deliver(self, deliveries: Iterable[CallbackDelivery]) -> None:
        queue = self.queue
        queue.extend(deliveries)
        if self.max_pending is not None and self.overflow == "drop_oldest" and len(queue) > self.max_pending:
            dropped = 0
            while len(queue) > self.max_pending:
                if queue.popleft().message is not None:
                    dropped += 1
            self._stats.dropped += dropped
            if dropped:
                (log.debug if self._warned else log.warning)(
                    "shmbus.client: %d messages dropped: %d were waiting for the callbacks (max_pending; counted "
                    "in stats.dropped)",
                    dropped,
                    self.max_pending,
                )
                self._warned = True
        if queue and self._queued is not None:
            self._queued.set()

    async def room(self) -> None:
        """Wait while ``max_pending`` deliveries wait for the callbacks (``overflow="block"``)."""
        limit, drained = self.max_pending, self._drained
        if limit is None or drained is None or len(self.queue) < limit:
            return
        self._stats.backpressure += 1
        while len(self.queue) >= limit and not self.halted:
            drained.clear()
            await drained.wait()

    async def run(self) -> None:
        """The callbacks' task: run until cancelled."""
        queue, queued, resumed, drained = self.queue, self._queued, self.resumed, self._drained
        assert queued is not None and resumed is not None and drained is not None
        stats, decoder, limit = self._stats, self.decoder, self.max_pending
        raw: ClientMessage | None = None  # the last message decoded (its subscriptions follow one another in the queue)
        decoded: Any = None
        while True:
            if not queue:
                queued.clear()
                if limit is not None:
                    drained.set()
                await queued.wait()
                continue
            if not resumed.is_set():
                await resumed.wait()
                continue
            sub, message, position = queue.popleft()
            if limit is not None and len(queue) < limit:
                drained.set()
            if not sub.active or self.halted:
                continue
            if message is not None:
                if decoder is not None:
                    if message is not raw:
                        raw, decoded = message, self._decode(decoder, message)
                    if decoded is _FAILED:
                        sub.delivered = position
                        continue
                    message = decoded
                try:
                    result = sub.callback(message)
                    if result is not None and inspect.isawaitable(result):
                        await result
                except Exception:
                    stats.callback_errors += 1
                    log.exception("shmbus.client: callback %r on %s failed", sub.callback, sub.channel)
            sub.delivered = position

    def _decode(self, decoder: Callable[[Any], Any], message: ClientMessage) -> Any:
        try:
            return message._replace(data=decoder(message.data))
        except Exception:
            self._stats.decode_errors += 1
            log.exception(
                "shmbus.client: decoder %r failed on %s #%d: skipped", decoder, message.channel, message.message_id
            )
            return _FAILED
