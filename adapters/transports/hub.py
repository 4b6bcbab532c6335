"""The transports' live fan-out: one bus tap per process (:class:`Hub`), one :class:`SinkIndex` per event loop,
one :class:`Sink` per connection.

Why a separate hub (and not ``MessageBusMiddleware``'s registry): the transports need pattern subscriptions and
per-connection subscription sets that change at run time (WebSocket), which the long-poll registry does not model.
Like the middleware, a :class:`Hub` taps the bus once per process and hands each batch to each event loop with a
single ``call_soon_threadsafe``; everything else runs on the loop, so no locks are needed.

Targeting uses :meth:`shmbus.adapters.http.Waiter.allowed` (the middleware's exact rules) and the bus's client
message filters; site rules are the middleware's (``/global/`` channels reach every site).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from shmbus.bus import KEEPALIVE_CHANNEL, Bus
from shmbus.message import Message

from ..looptap import LoopTap
from .sink import DEFAULT_MAX_BUFFER, Sink

__all__ = ["DEFAULT_MAX_BUFFER", "Hub", "Sink", "SinkIndex", "loop_runner"]

log = logging.getLogger(__name__)


class SinkIndex:
    """The connections of one event loop (ASGI) or one process (WSGI, ``loop`` None), indexed by exact channel
    (plus the set of those with patterns). Not thread-safe: one loop, or the caller's lock."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None, bus: Bus) -> None:
        self.loop = loop
        self.bus = bus
        self.sinks: set[Sink] = set()
        self.by_channel: dict[str, set[Sink]] = {}
        self.pattern_sinks: set[Sink] = set()
        self.epoch = bus.epoch

    def add(self, sink: Sink) -> None:
        self.sinks.add(sink)
        sink.index = self
        for ch in sink.channels:
            self.add_channel(sink, ch)
        if sink.patterns:
            self.pattern_sinks.add(sink)

    def remove(self, sink: Sink) -> None:
        self.sinks.discard(sink)
        for ch in sink.channels:
            self.remove_channel(sink, ch)
        self.pattern_sinks.discard(sink)
        sink.index = None

    def add_channel(self, sink: Sink, channel: str) -> None:
        s = self.by_channel.get(channel)
        if s is None:
            self.by_channel[channel] = {sink}
        else:
            s.add(sink)

    def remove_channel(self, sink: Sink, channel: str) -> None:
        s = self.by_channel.get(channel)
        if s is not None:
            s.discard(sink)
            if not s:
                del self.by_channel[channel]

    def dispatch(self, msgs: list[Message]) -> None:
        epoch = msgs[-1].epoch
        if epoch != self.epoch and epoch == self.bus.epoch:  # a reset: every connection hears of it at once
            self.epoch = epoch
            for sink in tuple(self.sinks):
                if sink.epoch != epoch:
                    self._safely(sink, sink.reset_to, epoch)
        by_channel, pattern_sinks = self.by_channel, self.pattern_sinks
        for m in msgs:
            ch = m.channel
            if ch == KEEPALIVE_CHANNEL:
                continue
            exact = by_channel.get(ch)
            targets = set(exact) if exact else set()
            for sink in tuple(pattern_sinks):
                if sink not in targets:
                    targets.add(sink)
            for sink in targets:
                if not sink.dropped and not sink.closed:
                    self._safely(sink, sink.offer, m)

    @staticmethod
    def _safely(sink: Sink, fn: Callable[[Any], None], arg: Any) -> None:
        try:
            fn(arg)
        except Exception:
            log.exception("shmbus: delivering to a transport connection failed; dropping it")
            sink.dropped = True
            sink.wake()


class Hub:
    """One bus tap per process, fanned out to the sinks of each event loop (one loop hop per batch)."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self._loops: LoopTap[SinkIndex] = LoopTap(bus, lambda loop: SinkIndex(loop, bus), _hand_to_loop)
        bus.metrics.add_source(self)

    def metrics_gauges(self) -> dict[str, int]:
        """Open connections count as streams in the bus's gauges (:mod:`shmbus.metrics`)."""
        return {"streams": self.connections()}

    def register(self, sink: Sink) -> None:
        self._loops.get().add(sink)

    def unregister(self, sink: Sink) -> None:
        sink.closed = True
        if sink.index is not None:
            sink.index.remove(sink)
        sink.release_engines()
        if sink.gate is not None:
            sink.gate.close()

    def connections(self) -> int:
        """Live connections in this process (all loops)."""
        return sum(len(h.sinks) for h in self._loops.values())

    def close(self) -> None:
        self._loops.close()


def loop_runner(loop: asyncio.AbstractEventLoop) -> Callable[[Callable[[], None]], None]:
    """Run a sink change on ``loop``: at once when called on it, else scheduled thread-safely."""

    def run(fn: Callable[[], None]) -> None:
        try:
            current = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        if current is loop:
            fn()
        else:
            try:
                loop.call_soon_threadsafe(fn)
            except RuntimeError:  # the loop is closed: so is the connection
                pass

    return run


def _hand_to_loop(h: SinkIndex, msgs: list[Message]) -> None:
    """Listener thread: one ``call_soon_threadsafe`` per batch for a loop with connections."""
    if not h.sinks or h.loop is None:
        return
    try:
        h.loop.call_soon_threadsafe(h.dispatch, msgs)
    except RuntimeError:  # loop closed
        pass
