"""Shared machinery of the SSE and WebSocket transports: live fan-out, resumable replay, request identity.

Why a separate hub (and not ``MessageBusMiddleware``'s registry): the transports need pattern subscriptions and
per-connection subscription sets that change at run time (WebSocket), which the long-poll registry does not model.
Like the middleware, a :class:`Hub` taps the bus once per process and hands each batch to each event loop with a
single ``call_soon_threadsafe``; everything else runs on the loop, so no locks are needed.

Targeting uses :meth:`shmbus.adapters.http.Client.allowed` (the middleware's exact rules) and the bus's client
message filters; site rules are the middleware's (``/global/`` channels reach every site).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections import deque
from collections.abc import Callable, Iterable, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shmbus.bus import KEEPALIVE_CHANNEL, Bus
from shmbus.channels import GLOBAL_PREFIX, RESERVED_PREFIX
from shmbus.message import Message
from shmbus.patterns import compile_pattern

from ..asgi_support import Receive, Send, lifespan, maybe_await
from ..http import Client, Lookups, MessageBusProtocol, ProtocolError
from ..http.client import filter_allows
from ..http.options import bus_or_default
from ..http.request import check_channel as check_channel  # the transports' name for it
from ..http.wire import CLIENT_ID_RE, INVALID_CLIENT_ID
from ..looptap import LoopTap

if TYPE_CHECKING:
    from .connection import Connection

log = logging.getLogger("shmbus.adapters")

Scope = MutableMapping[str, Any]
Lookup = Callable[[Any], Any]

#: Default bytes queued for one connection that is not reading before it is dropped.
DEFAULT_MAX_BUFFER = 1 << 20
#: Most subscriptions (channels + patterns) one connection may hold.
MAX_SUBSCRIPTIONS = 200
PATTERN_KINDS = ("prefix", "glob")


# ---------------------------------------------------------------------------------------------------- input
def check_pattern(pattern: Any, kind: str) -> str:
    """Validate a pattern from a client (:func:`check_channel`'s rules, then :func:`shmbus.patterns.compile_pattern`
    must accept it: no empty set ``[]``, no reversed range ``[z-a]``): a ProtocolError(400), never a crash."""
    check_channel(pattern, "pattern")
    if kind not in PATTERN_KINDS:
        raise ProtocolError(400, f"pattern kind must be one of {list(PATTERN_KINDS)}, got {str(kind)[:20]!r}")
    try:
        compile_pattern(pattern, kind)
    except ValueError as exc:
        raise ProtocolError(400, str(exc)) from None
    return pattern  # type: ignore[no-any-return]


def check_client_id(value: Any) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not CLIENT_ID_RE.match(value):
        raise ProtocolError(400, INVALID_CLIENT_ID)
    return value


@dataclass
class Identity:
    """Who a connection is, for targeting: resolved once per connection with the middleware's lookups."""

    client_id: str | None
    lookups: Lookups

    def checker(self, epoch: int) -> Client:
        """A :class:`protocol.Client` used only for its ``allowed`` check (the middleware's targeting rules)."""
        return Client(self.client_id or "", 0, self.lookups, (), True, epoch)


@dataclass
class LookupOptions:
    """The middleware's lookups (same names and meaning), plus ``client_id_lookup`` (default: ``?client_id=``)."""

    user_id_lookup: Lookup | None = None
    group_ids_lookup: Lookup | None = None
    site_id_lookup: Lookup | None = None
    client_id_lookup: Lookup | None = None

    def __post_init__(self) -> None:
        for name in ("user_id_lookup", "group_ids_lookup", "site_id_lookup", "client_id_lookup"):
            v = getattr(self, name)
            if v is not None and not callable(v):
                raise TypeError(f"{name} must be callable, got {v!r}")

    async def identity(self, scope: Scope, query: dict[str, list[str]]) -> Identity:
        if self.client_id_lookup is not None:
            cid = await maybe_await(self.client_id_lookup(scope))
        else:
            values = query.get("client_id")
            cid = values[-1] if values else None
        cid = check_client_id(cid if cid is None else str(cid))
        lookups = MessageBusProtocol.lookups(
            await maybe_await(self.user_id_lookup(scope)) if self.user_id_lookup else None,
            await maybe_await(self.group_ids_lookup(scope)) if self.group_ids_lookup else None,
            await maybe_await(self.site_id_lookup(scope)) if self.site_id_lookup else None,
        )
        return Identity(cid, lookups)

    def identity_sync(self, environ: Any, query: dict[str, list[str]]) -> Identity:
        """:meth:`identity` for WSGI: the lookups are called with the environ and must be plain functions."""

        def call(lookup: Lookup | None) -> Any:
            if lookup is None:
                return None
            value = lookup(environ)
            if inspect.isawaitable(value):
                if inspect.iscoroutine(value):
                    value.close()
                raise TypeError(f"{lookup!r} returned an awaitable: WSGI apps need plain (not async) lookups")
            return value

        if self.client_id_lookup is not None:
            cid = call(self.client_id_lookup)
        else:
            values = query.get("client_id")
            cid = values[-1] if values else None
        cid = check_client_id(cid if cid is None else str(cid))
        lookups = MessageBusProtocol.lookups(
            call(self.user_id_lookup), call(self.group_ids_lookup), call(self.site_id_lookup)
        )
        return Identity(cid, lookups)


# ---------------------------------------------------------------------------------------------------- ASGI bits
def relative_path(scope: Scope) -> str:
    """The path below ``root_path`` (as the middleware matches routes)."""
    path: str = scope.get("path") or "/"
    root = scope.get("root_path") or ""
    if root and path.startswith(root):
        path = path[len(root) :] or "/"
    return path


def header(scope: Scope, name: bytes) -> bytes | None:
    for k, v in scope.get("headers") or ():
        if k.lower() == name:
            return bytes(v)
    return None


async def send_simple(
    send: Send,
    status: int,
    body: bytes,
    content_type: str = "text/plain; charset=utf-8",
    extra: Iterable[tuple[bytes, bytes]] = (),
) -> None:
    headers = [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode()), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def fallback(app: Callable[..., Any] | None, scope: Scope, receive: Receive, send: Send) -> None:
    """Hand a request that is not ours to the wrapped app (or answer 404 / complete the lifespan)."""
    if app is not None:
        await app(scope, receive, send)
    elif scope["type"] == "lifespan":
        await lifespan(receive, send)
    elif scope["type"] == "http":
        await send_simple(send, 404, b"not found")
    elif scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1000})


# ---------------------------------------------------------------------------------------------------- replay
def site_matches(msg: Message, site: str | None) -> bool:
    if msg.channel.startswith(GLOBAL_PREFIX):
        return True
    return msg.site_id == site


@dataclass
class Replay:
    """Messages to replay (oldest first, by global id) and whether some the caller asked for are gone."""

    messages: list[Message]
    gap: bool
    gap_channels: list[str]


def replay_since(
    bus: Bus,
    channels: Iterable[str],
    patterns: Iterable[tuple[str, str]],
    site: str | None,
    after_gid: int,
    upto_gid: int,
) -> Replay:
    """Messages with ``after_gid < global_id <= upto_gid`` on ``channels`` or matching ``patterns``.

    Exact channels are read from their own backlogs (they hold ``max_backlog_size`` messages each). A gap is
    reported for a channel when it dropped messages (``first_available > 1``) and its oldest retained message is
    newer than ``after_gid`` (conservative: the dropped ones may have been older than the client's position).
    Patterns are read from the global backlog; a gap is reported when its window (``max_global_backlog_size``,
    the ring) no longer reaches ``after_gid``.
    """
    out: dict[int, Message] = {}
    gaps: list[str] = []
    site_key = site or ""
    for ch in channels:
        backlog = bus.backlog(ch, 0, site_key)
        for m in backlog:
            if after_gid < m.global_id <= upto_gid:
                out[m.global_id] = m
        if backlog.first_available > 1 and (not backlog or backlog[0].global_id > after_gid + 1):
            gaps.append(ch)
    pats = [(p, compile_pattern(p, kind)) for p, kind in patterns]
    if pats and upto_gid > after_gid:
        floor = bus.segment.global_id() - bus.max_global_backlog_size
        first = bus.segment.global_backlog(after_gid, limit=1)
        if floor > after_gid or (first and first[0].global_id > after_gid + 1):
            gaps.extend(p for p, _ in pats)
        for m in bus.global_backlog(after_gid):
            if m.global_id > upto_gid or m.global_id in out or m.channel.startswith(RESERVED_PREFIX):
                continue
            if site_matches(m, site) and any(match(m.channel) for _, match in pats):
                out[m.global_id] = m
    return Replay([out[g] for g in sorted(out)], bool(gaps), gaps)


# ---------------------------------------------------------------------------------------------------- sinks
class Sink:
    """One connection's subscriptions and outgoing buffer (lives on one event loop).

    ``channels``/``patterns`` map a subscription to its *floor*: the bus's global id when it was made (its replay
    covered everything up to it), so live messages at or below it are never sent twice. ``encode`` turns an
    allowed message into the bytes/str to send; ``on_reset`` is called once when the bus's epoch changes.
    """

    def __init__(
        self,
        bus: Bus,
        identity: Identity,
        encode: Callable[[Message], Any],
        *,
        max_buffer: int = DEFAULT_MAX_BUFFER,
        on_reset: Callable[[Sink, int, int], None] | None = None,
    ) -> None:
        self.bus = bus
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
        self.index: SinkIndex | None = None  # set by Hub.register: keeps the per-channel index in step
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
        if self.index is not None:
            self.index.add_channel(self, channel)

    def drop_channel(self, channel: str) -> bool:
        found = self.channels.pop(channel, None) is not None
        if found:
            self._hold(channel, None, -1)
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
        if msg.channel.startswith(RESERVED_PREFIX) or not site_matches(msg, self.site):
            return False
        if not self.checker.allowed(msg):
            return False
        if self.bus.client_message_filters:
            return filter_allows(self.bus, msg)
        return True

    # -- output
    def push(self, piece: Any, count: bool = False) -> None:
        """Queue a piece; over ``max_buffer`` queued bytes the connection is dropped (memory stays bounded)."""
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
                self.push(self.encode(m), count=True)

    def offer(self, msg: Message) -> None:
        if self.holding:
            return
        if msg.epoch != self.epoch:
            if msg.epoch == self.bus.epoch:
                self.reset_to(msg.epoch)
            return  # the reset replay covered this message (or it belongs to an epoch that is gone)
        if self.wants(msg):
            self.push(self.encode(msg), count=True)

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


def _noop() -> None:
    pass


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


class TransportApp:
    """What the SSE and WebSocket apps share: the bus (default :func:`shmbus.default_bus`), the wrapped app, the
    route, the buffer and subscription limits, the lookups, this process's :class:`Hub` and the drop count."""

    def __init__(
        self,
        app: Callable[..., Any] | None,
        bus: Bus | None,
        path: str,
        max_buffer: int,
        max_subscriptions: int,
        lookups: dict[str, Any],
        on_open: Callable[[Connection], Any] | None = None,
        on_close: Callable[[Connection], Any] | None = None,
    ) -> None:
        for name, hook in (("on_open", on_open), ("on_close", on_close)):
            if hook is not None and not callable(hook):
                raise TypeError(f"{name} must be callable, got {hook!r}")
        self.on_open = on_open
        self.on_close = on_close
        self.app = app
        self.bus = bus = bus_or_default(bus)
        self.path = path
        self.max_buffer = max_buffer
        self.max_subscriptions = max_subscriptions
        self.lookups = LookupOptions(**lookups)
        self.hub = Hub(bus)
        self.dropped = 0  # connections dropped for not reading (this process)

    def stats(self) -> dict[str, int]:
        return {"connections": self.hub.connections(), "dropped": self.dropped}

    def connection(self, sink: Sink, scope: Scope) -> Connection:
        """The :class:`Connection` the hooks see; its changes run on the current event loop."""
        from .connection import Connection

        return Connection(self.bus, sink, scope, loop_runner(asyncio.get_running_loop()), self.max_subscriptions)

    async def opened(self, conn: Connection) -> None:
        """Run ``on_open(conn)`` (plain or async); its exceptions propagate (the transport refuses the client)."""
        if self.on_open is not None:
            await maybe_await(self.on_open(conn))

    async def closed(self, conn: Connection) -> None:
        """End the connection's subscriptions, then run ``on_close(conn)``; never raises."""
        conn.close()
        if self.on_close is not None:
            try:
                await maybe_await(self.on_close(conn))
            except Exception:
                log.exception("shmbus: on_close hook %r failed", self.on_close)

    def close(self) -> None:
        self.hub.close()
