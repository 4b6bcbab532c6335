"""One connection's live subscriptions and queue (:class:`Sink`): what it wants, what it may see, what waits to be
written; the transports' fan-out (:mod:`.hub`) offers it each message.

Targeting uses :meth:`shmbus.adapters.http.Waiter.allowed` (the middleware's exact rules) and the bus's client
message filters; site rules are the middleware's (``/global/`` channels reach every site).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from shmbus.bus import Bus
from shmbus.channels import RESERVED_PREFIX
from shmbus.message import Message
from shmbus.patterns import compile_pattern
from shmbus.presence.browser import VIEW_PREFIX

from ..http.waiter import filter_allows
from .gate import ChannelGate
from .identity import Identity
from .presence import SinkPresence, ask_view_snapshot
from .replay import site_matches

#: Default bytes queued for one connection that is not reading before it is dropped.
DEFAULT_MAX_BUFFER = 1 << 20


class ChannelIndex(Protocol):
    """What a sink keeps in step as its subscriptions change: its loop's index (:class:`.hub.SinkIndex`)."""

    pattern_sinks: set[Sink]

    def add_channel(self, sink: Sink, channel: str) -> None: ...

    def remove_channel(self, sink: Sink, channel: str) -> None: ...

    def remove(self, sink: Sink) -> None: ...


def _noop() -> None:
    pass


class Sink:
    """One connection's subscriptions and outgoing buffer (lives on one event loop).

    ``channels``/``patterns`` map a subscription to its *floor*: the bus's global id when it was made (its replay
    covered everything up to it), so live messages at or below it are never sent twice. ``encode`` turns an
    allowed message into the bytes/str to send; ``on_reset`` is called once when the bus's epoch changes.
    ``gate`` (the app's ``subscribe_allowed``, :mod:`.gate`) decides per channel whether a message may be sent at
    all; while a verdict is awaited, what follows is ``held`` in order (at most ``MAX_HELD`` items).
    """

    MAX_HELD = 10_000

    def __init__(
        self,
        bus: Bus,
        identity: Identity,
        encode: Callable[[Message], Any],
        *,
        max_buffer: int = DEFAULT_MAX_BUFFER,
        on_reset: Callable[[Sink, int, int], None] | None = None,
        gate: ChannelGate | None = None,
    ) -> None:
        self.bus = bus
        self.gate = gate
        self.presence = SinkPresence.of(bus, identity, gate)
        self.held: deque[tuple[Message | None, Any, bool]] = deque()
        if gate is not None:
            gate.on_decided = self.release_held
        self.identity = identity
        self.site = identity.lookups.site_id
        self.encode = encode
        self.on_reset = on_reset
        self.max_buffer = max_buffer
        self.epoch = bus.epoch
        self.checker = identity.checker(self.epoch)
        self.channels: dict[str, int] = {}
        self.patterns: dict[tuple[str, str], tuple[Callable[[str], bool], int]] = {}
        self.pending: deque[Any] = deque()
        self.bytes_pending = 0
        self.dropped = False
        self.closed = False
        self.sent = 0  # messages pushed (for tests and stats)
        self.holding = False  # while opening: live messages are left to the opening replay
        self.wake: Callable[[], None] = _noop
        self.index: ChannelIndex | None = None  # set by Hub.register: keeps the per-channel index in step
        self.released = False  # release_engines ran: the connection's subscriptions no longer count

    # -- subscriptions (always through these methods, so the hub's index follows)
    def subscription_count(self) -> int:
        return len(self.channels) + len(self.patterns)

    def set_channel(self, channel: str, floor: int, *, replayed: bool = False) -> None:
        """Subscribe live delivery above ``floor``. Made again, a subscription keeps the smaller floor: a message
        appended before the new one but not yet dispatched to this loop must not be skipped. ``replayed``: the
        caller has just sent everything up to ``floor`` itself, so live delivery starts above it."""
        old = self.channels.get(channel)
        self.channels[channel] = floor if old is None or replayed else min(old, floor)
        if old is None:
            self._hold(channel, None, +1)
            if self.presence is not None and not self.released:
                self.presence.joined(channel)
            if channel.startswith(VIEW_PREFIX):
                ask_view_snapshot(self.bus, channel, self.identity.client_id)
        if self.index is not None:
            self.index.add_channel(self, channel)

    def drop_channel(self, channel: str) -> bool:
        found = self.channels.pop(channel, None) is not None
        if found:
            self._hold(channel, None, -1)
            if self.presence is not None:
                self.presence.left((channel,))
            if self.index is not None:
                self.index.remove_channel(self, channel)
        return found

    def add_pattern(self, pattern: str, kind: str, floor: int, *, replayed: bool = False) -> None:
        """As :meth:`set_channel`, for a pattern (made again, it keeps the smaller floor unless ``replayed``)."""
        old = self.patterns.get((pattern, kind))
        if old is not None and not replayed:
            floor = min(old[1], floor)
        self.patterns[(pattern, kind)] = (compile_pattern(pattern, kind), floor)
        if old is None:
            self._hold(pattern, kind, +1)
        if self.index is not None:
            self.index.pattern_sinks.add(self)

    def drop_pattern(self, pattern: str, kind: str) -> bool:
        found = self.patterns.pop((pattern, kind), None) is not None
        if found:
            self._hold(pattern, kind, -1)
        if not self.patterns and self.index is not None:
            self.index.pattern_sinks.discard(self)
        return found

    def _hold(self, to: str, kind: str | None, delta: int) -> None:
        """Engines hear of a connection's subscriptions as of the bus's own (:meth:`Bus.engine_hold`)."""
        if not self.released:
            self.bus.engine_hold(to, kind, delta)

    def release_engines(self) -> None:
        """The connection ended: its subscriptions stop counting for the engines (idempotent; the transports
        call it when they unregister the sink)."""
        if self.released:
            return
        self.released = True
        if self.presence is not None:
            self.presence.left(list(self.presence.held))
        for channel in self.channels:
            self.bus.engine_hold(channel, None, -1)
        for pattern, kind in self.patterns:
            self.bus.engine_hold(pattern, kind, -1)

    def refloor(self, floor: int) -> None:
        """After a replay up to global id ``floor``: live delivery of every subscription starts above it."""
        for ch in self.channels:
            self.channels[ch] = floor
        for key, (match, _old) in self.patterns.items():
            self.patterns[key] = (match, floor)

    def wants(self, msg: Message) -> bool:
        """Subscribed (any matching subscription's floor below the message), site and targeting allow it.

        A process-local message (``publish(..., engine=False)``: global id 0, never stored) passes every floor."""
        gid = msg.global_id or (1 << 63)
        floor = self.channels.get(msg.channel)
        hit = floor is not None and gid > floor
        if not hit:
            for match, pfloor in self.patterns.values():
                if gid > pfloor and match(msg.channel):
                    hit = True
                    break
        return hit and self.allowed(msg)

    def allowed(self, msg: Message) -> bool:
        reserved = msg.channel.startswith(RESERVED_PREFIX)
        if reserved and not (msg.channel.startswith(VIEW_PREFIX) and msg.channel in self.channels):  # views: named
            return False
        if not site_matches(msg, self.site):
            return False
        if not self.checker.allowed(msg):
            return False
        if self.bus.client_message_filters:
            return filter_allows(self.bus, msg)
        return True

    # -- output
    def push(self, piece: Any, count: bool = False) -> None:
        """Queue a piece; over ``max_buffer`` queued bytes the connection is dropped (memory stays bounded).
        Behind a message whose verdict is awaited, it waits its turn (``held``)."""
        if self.held:
            self._hold_back(None, piece, count)
            return
        self._queue(piece, count)

    def deliver(self, msg: Message) -> None:
        """Queue a message this connection wants and may see, if the gate lets its channel through."""
        gate = self.gate
        if gate is None:
            self._queue(self.encode(msg), True)
        elif self.held:
            self._hold_back(msg, None, True)
        else:
            allowed = gate.known(msg.channel)
            if allowed is None:
                self._hold_back(msg, None, True)
            elif allowed:
                self._queue(self.encode(msg), True)

    def _hold_back(self, msg: Message | None, piece: Any, count: bool) -> None:
        if len(self.held) >= self.MAX_HELD:  # a hook that never answers must not cost unbounded memory
            self.held.clear()
            self.dropped = True
            self.wake()
            return
        self.held.append((msg, piece, count))

    def release_held(self) -> None:
        """A verdict arrived: send what was held, in order, up to the next message still waiting for one."""
        gate, held = self.gate, self.held
        while held and gate is not None:
            msg, piece, count = held[0]
            if msg is not None:
                allowed = gate.known(msg.channel)
                if allowed is None:
                    return
                held.popleft()
                if allowed:
                    self._queue(self.encode(msg), True)
            else:
                held.popleft()
                self._queue(piece, count)

    def _queue(self, piece: Any, count: bool = False) -> None:
        if self.dropped or self.closed:
            return
        self.pending.append(piece)
        self.bytes_pending += len(piece)
        if count:
            self.sent += 1
            self.bus.metrics.deliveries += 1
        if self.bytes_pending > self.max_buffer:
            self.dropped = True
            self.pending.clear()
            self.bytes_pending = 0
        self.wake()

    def take(self) -> list[Any]:
        out = list(self.pending)
        self.pending.clear()
        self.bytes_pending = 0
        return out

    def push_allowed(self, msgs: Iterable[Message]) -> None:
        """Queue (encoded, counted) the replayed messages this connection may see."""
        for m in msgs:
            if self.allowed(m):
                self.deliver(m)

    def offer(self, msg: Message) -> None:
        if self.holding:
            return
        if msg.epoch != self.epoch:
            if msg.epoch == self.bus.epoch:
                self.reset_to(msg.epoch)
            return  # the reset replay covered this message (or it belongs to an epoch that is gone)
        if self.wants(msg):
            self.deliver(msg)

    def check_epoch(self) -> None:
        """Called periodically: notice a reset even when no message of the new epoch arrives."""
        try:
            epoch = self.bus.epoch
        except Exception:
            return
        if epoch != self.epoch:
            self.reset_to(epoch)

    def reset_to(self, epoch: int) -> None:
        old, self.epoch = self.epoch, epoch
        self.checker.epoch = epoch
        if self.on_reset is not None:
            self.on_reset(self, old, epoch)
