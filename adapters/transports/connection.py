"""The connection object an app sees: the iodine pub/sub draft's client-bound subscriptions.

Why: the SSE and WebSocket transports let a *client* choose its channels; the draft also lets the *server*
subscribe a connection (``client.subscribe("/user/42")``), so an app decides what a connection hears without
trusting the client. The apps hand a :class:`Connection` to their ``on_open(connection)`` hook (and to
``on_close``); it can be kept and used from any thread until it closes.

* ``subscribe(channel, pattern=False, callback=None)``: without a callback, messages go straight to the
  client (encoded as the transport encodes every message); with one, ``callback(channel, data)`` is called on
  the bus's listener thread instead. Either way only messages this client may see (targeting, sites, client
  filters) count. A subscription replaces the connection's earlier one to the same channel or pattern.
  Returns None when the connection is already closed (the draft's "nil on a known failure"), True otherwise.
* ``pattern``: False (a channel), True or ``"glob"`` (``*`` one segment, ``**`` any depth, ``?``, ``[...]``),
  or ``"prefix"`` (the channel and everything below it) — :mod:`shmbus.patterns`.
* Every subscription ends when the connection closes; :attr:`open` turns False at that moment.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from shmbus.bus import Bus, Subscription
from shmbus.errors import InvalidArgument, InvalidChannel
from shmbus.message import Message

from ..http import ProtocolError
from .identity import Identity
from .validation import PATTERN_KINDS, check_client_channel, check_pattern

__all__ = ["Connection", "ConnectionSink", "DataCallback", "check_hooks"]

#: ``callback(channel, data)``: the message's channel (the matching one, for a pattern) and its data.
DataCallback = Callable[[str, Any], Any]
#: How a connection runs a change to its sink: on its event loop (ASGI), under its hub's lock (WSGI).
Runner = Callable[[Callable[[], None]], None]

_Key = tuple[str, str | None]  # (channel or pattern, None | "glob" | "prefix")


class ConnectionSink(Protocol):
    """What a :class:`Connection` needs of its transport's sink (:class:`~.hub.Sink` is the one there is): who the
    client is, whether it still listens, its direct subscriptions and the targeting check. Written here, so this
    module does not import the hub (which the transports' app joins to connections)."""

    @property
    def identity(self) -> Identity: ...
    @property
    def site(self) -> str | None: ...
    @property
    def closed(self) -> bool: ...
    @property
    def dropped(self) -> bool: ...
    @property
    def holding(self) -> bool: ...
    @property
    def channels(self) -> Mapping[str, int]: ...
    @property
    def patterns(self) -> Mapping[tuple[str, str], Any]: ...

    def subscription_count(self) -> int: ...
    def set_channel(self, channel: str, floor: int) -> None: ...
    def drop_channel(self, channel: str) -> bool: ...
    def add_pattern(self, pattern: str, kind: str, floor: int) -> None: ...
    def drop_pattern(self, pattern: str, kind: str) -> bool: ...
    def allowed(self, msg: Message) -> bool: ...


def pattern_kind(pattern: bool | str) -> str | None:
    """``False`` -> None (a channel); ``True``/``"glob"`` -> ``"glob"``; ``"prefix"`` -> ``"prefix"``."""
    if pattern is False or pattern is None:
        return None
    if pattern is True:
        return "glob"
    if pattern in PATTERN_KINDS:
        return str(pattern)
    raise InvalidArgument(f"pattern must be False, True, 'glob' or 'prefix', got {pattern!r}")


class Connection:
    """One SSE or WebSocket client, as the app sees it (see the module docstring).

    ``scope`` is the ASGI scope or the WSGI environ; ``client_id``/``user_id``/``group_ids``/``site_id`` are what
    the lookups resolved for it.
    """

    #: The draft's ``pubsub?``: the version of the pub/sub draft this object follows.
    pubsub_version = 0

    def __init__(self, bus: Bus, sink: ConnectionSink, scope: Any, run: Runner, max_subscriptions: int) -> None:
        self.bus = bus
        self.scope = scope
        self._sink = sink
        self._run = run
        self._max = max_subscriptions
        self._lock = threading.Lock()
        self._callbacks: dict[_Key, Subscription] = {}
        self._closed = False

    # -- identity
    @property
    def client_id(self) -> str | None:
        return self._sink.identity.client_id

    @property
    def user_id(self) -> Any:
        return self._sink.identity.lookups.user_id

    @property
    def group_ids(self) -> Any:
        return self._sink.identity.lookups.group_ids

    @property
    def site_id(self) -> str | None:
        return self._sink.site

    @property
    def open(self) -> bool:
        """True until the client goes away, is dropped for not reading, or the server ends the stream."""
        sink = self._sink
        return not (self._closed or sink.closed or sink.dropped)

    @property
    def live(self) -> bool:
        """True once the transport has opened the stream: from then on, messages published reach the client
        live (while ``on_open`` runs, live delivery is held and what it publishes process-locally is not seen)."""
        return self.open and not self._sink.holding

    # -- the draft's instance methods
    def subscribe(self, channel: str, pattern: bool | str = False, callback: DataCallback | None = None) -> bool | None:
        """Subscribe this connection (see the module docstring). None if it is closed; raises
        :class:`~shmbus.errors.InvalidChannel` for a bad name and :class:`~shmbus.errors.InvalidArgument` over
        the connection's subscription limit."""
        kind = pattern_kind(pattern)
        try:
            if kind is None:
                check_client_channel(channel)
            else:
                check_pattern(channel, kind)  # a malformed glob ([], [z-a]) is refused here, before anything changes
        except ProtocolError as exc:
            raise InvalidChannel(exc.reason) from None
        if callback is not None and not callable(callback):
            raise TypeError("callback must be callable (or None: deliver to the client)")
        key: _Key = (channel, kind)
        with self._lock:
            if not self.open:
                return None
            direct = self._is_direct(channel, kind)
            known = direct or key in self._callbacks
            if not known and self._count() >= self._max:
                raise InvalidArgument(f"too many subscriptions on this connection (limit {self._max})")
            if callback is None:
                old = self._callbacks.pop(key, None)
                self._run(lambda: self._add_direct(channel, kind))
                if old is not None:
                    self.bus.unsubscribe(channel, old, pattern=kind or False)
                return True
            sub = self.bus.subscribe(
                channel, self._filtered(callback), pattern=kind or False, owner=self
            )  # replaces this connection's earlier callback subscription, with no unsubscribe in between
            if sub is None:
                return None  # the bus is off()
            self._callbacks[key] = sub
            if direct:
                self._run(lambda: self._drop_direct(channel, kind))
            return True

    def unsubscribe(self, channel: str, pattern: bool | str = False) -> bool:
        """End this connection's subscription to ``channel`` (or pattern); False if there was none."""
        kind = pattern_kind(pattern)
        with self._lock:
            sub = self._callbacks.pop((channel, kind), None)
            direct = self._is_direct(channel, kind)
            if direct:
                self._run(lambda: self._drop_direct(channel, kind))
        if sub is not None:
            self.bus.unsubscribe(channel, sub, pattern=kind or False)
        return sub is not None or direct

    def publish(self, channel: str, message: Any, engine: Any = None) -> int | None:
        """The draft's ``publish`` on a client object: ``bus.publish`` on this connection's site (no targeting)."""
        options: dict[str, Any] = {"site_id": self.site_id or ""}
        if engine is not None:
            options["engine"] = engine
        return self.bus.publish(channel, message, **options)

    # -- lifecycle (called by the transport)
    def close(self) -> None:
        """End every subscription of this connection (idempotent). The transport calls it when the client goes."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            subs, self._callbacks = self._callbacks, {}
        for (channel, kind), sub in subs.items():
            self.bus.unsubscribe(channel, sub, pattern=kind or False)

    def __repr__(self) -> str:
        state = "open" if self.open else "closed"
        return f"<Connection client_id={self.client_id!r} user_id={self.user_id!r} {state}>"

    # -- internals
    def _count(self) -> int:
        return self._sink.subscription_count() + len(self._callbacks)

    def _is_direct(self, channel: str, kind: str | None) -> bool:
        sink = self._sink
        return channel in sink.channels if kind is None else (channel, kind) in sink.patterns

    def _add_direct(self, channel: str, kind: str | None) -> None:
        sink = self._sink
        if sink.closed or sink.dropped:
            return
        floor = self.bus.segment.global_id()
        if kind is None:
            sink.set_channel(channel, floor)
        else:
            sink.add_pattern(channel, kind, floor)

    def _drop_direct(self, channel: str, kind: str | None) -> None:
        if kind is None:
            self._sink.drop_channel(channel)
        else:
            self._sink.drop_pattern(channel, kind)

    def _filtered(self, callback: DataCallback) -> Callable[[Message], None]:
        sink = self._sink

        def deliver(msg: Message) -> None:
            if self.open and sink.allowed(msg):
                callback(msg.channel, msg.data)

        return deliver


def check_hooks(on_open: Callable[[Connection], Any] | None, on_close: Callable[[Connection], Any] | None) -> None:
    """Refuse an ``on_open``/``on_close`` hook that cannot be called (at construction, not at the first client)."""
    for name, hook in (("on_open", on_open), ("on_close", on_close)):
        if hook is not None and not callable(hook):
            raise TypeError(f"{name} must be callable, got {hook!r}")
