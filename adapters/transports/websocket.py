"""WebSocket transport (ASGI ``websocket`` scope): a small JSON protocol inspired by guble's.

Why: one socket carries many subscriptions that change at run time, replays by start id and count, and (when
allowed) publishes — without a poll per change. Client -> server (text or binary frames holding one JSON object;
any ``"ref"`` is echoed in the reply so clients can correlate)::

    {"op":"subscribe","channel":"/foo","last_id":N}        # N: null/absent = new only; n >= 0 = after n;
                                                          #    -k = the last k messages first (guble)
    {"op":"subscribe","pattern":"/foo","kind":"prefix"}    # kind "prefix" (default; /foo and below) or "glob";
                                                          #    optional "last_global_id": replay after it
    {"op":"unsubscribe","channel":"/foo"} / {"op":"unsubscribe","pattern":"/foo","kind":"prefix"}
    {"op":"replay","channel":"/foo","start_id":N,"count":M}  # one-shot: ids >= N (N < 0: the last -N), at most M
    {"op":"publish","channel":"/foo","data":...,"user_ids":[..],"group_ids":[..],"client_ids":[..]}
                                                          # only when allow_publish(scope, channel) is true
    {"op":"ping"}

Server -> client: messages as message_bus sends them (``{"global_id","message_id","channel","data"}``), and
``{"op":"status","status":"connected"|"subscribed"|"unsubscribed"|"replayed"|"published"|"reset",...}``,
``{"op":"pong"}``, ``{"op":"error","reason":...}``. Bad input of any kind gets an error frame; the connection stays
open. A subscription's replay and its live messages never overlap (live starts after the global id the replay
read up to). A bus reset sends a ``reset`` status and replays the new epoch's retained backlog of every
subscription. A client that stops reading is closed (code 1008) once ``max_buffer`` bytes are queued for it; a
message over ``max_frame`` closes the socket with code 1009 (run the server with the same limit, see
:data:`MAX_FRAME`, so that it refuses the frame when it reads its length instead of buffering it first).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

from shmbus.bus import Bus
from shmbus.errors import ShmbusError

from ..asgi_support import Receive, Scope, Send, fallback, maybe_await, relative_path
from ..http import ProtocolError, encode_message
from .app import TransportApp
from .connection import Connection
from .identity import Identity, LookupOptions
from .replay import replay_since
from .sink import DEFAULT_MAX_BUFFER, Sink
from .validation import MAX_SUBSCRIPTIONS, check_client_channel
from .ws_commands import BadInput, dumps, frame, ids_field, int_field, parse_command, target

__all__ = ["WebSocketApp"]

log = logging.getLogger(__name__)

#: Largest incoming message (characters/bytes): larger closes the socket with 1009. The server must apply it too,
#: when it reads a frame's length (uvicorn's ``--ws-max-size``, set by shmbus's UvicornWorker): otherwise it buffers
#: the whole frame (up to its own 16 MiB default) before the app sees it.
MAX_FRAME = 64 * 1024
#: Largest ``count`` of one replay.
MAX_REPLAY = 1000
CLOSE_POLICY = 1008
CLOSE_TOO_BIG = 1009
CLOSE_SERVER_ERROR = 1011


class WebSocketApp(TransportApp):
    """ASGI app accepting WebSockets at ``path``; everything else goes to ``app`` (or 404).

    ``allow_publish(scope, channel) -> bool`` (may be async) enables the ``publish`` op; without it publishing
    is refused. Lookups are the middleware's plus ``client_id_lookup`` (default: ``?client_id=``).
    ``on_open(connection)`` / ``on_close(connection)`` (plain or async) see each socket as a
    :class:`~shmbus.adapters.transports.connection.Connection` the app may subscribe server-side; if ``on_open``
    raises, the socket gets an error frame and is closed with code 1011.
    """

    def __init__(
        self,
        app: Callable[..., Any] | None = None,
        *,
        bus: Bus | None = None,
        path: str = "/ws",
        allow_publish: Callable[[Any, str], Any] | None = None,
        max_buffer: int = DEFAULT_MAX_BUFFER,
        max_subscriptions: int = MAX_SUBSCRIPTIONS,
        max_frame: int = MAX_FRAME,
        keepalive_interval: float = 15.0,
        on_open: Callable[[Connection], Any] | None = None,
        on_close: Callable[[Connection], Any] | None = None,
        **lookups: Any,
    ) -> None:
        if allow_publish is not None and not callable(allow_publish):
            raise TypeError("allow_publish must be callable")
        super().__init__(app, bus, path, max_buffer, max_subscriptions, LookupOptions(**lookups), on_open, on_close)
        self.allow_publish = allow_publish
        self.max_frame = max_frame
        self.keepalive_interval = keepalive_interval
        is_json = self.bus.codec.is_json
        self._encode: Callable[[Any], str] = lambda m: encode_message(m, is_json).decode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "websocket" or not self.matches(scope):
            await fallback(self.app, scope, receive, send)
            return
        first = await receive()
        if first["type"] != "websocket.connect":
            return
        try:
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"), errors="strict")
            identity = await self.lookups.identity(scope, query)
        except (ProtocolError, UnicodeDecodeError, ValueError) as exc:
            reason = exc.reason if isinstance(exc, ProtocolError) else "malformed query string"
            # accept, then explain: a refused handshake would only show the browser a bare 403
            await send({"type": "websocket.accept"})
            await send({"type": "websocket.send", "text": self.refusal(reason, internal=False)})
            await send({"type": "websocket.close", "code": CLOSE_POLICY, "reason": reason[:120]})
            return
        await send({"type": "websocket.accept"})
        sink = await self.open_sink(identity, scope)
        self.hub.register(sink)
        conn = self.connection(sink, scope) if self.on_open or self.on_close else None
        try:
            if conn is not None:
                try:
                    await self.opened(conn)
                except Exception:
                    log.exception("shmbus: WebSocket on_open hook %r failed", self.on_open)
                    reason = "the application's on_open hook failed"
                    await send({"type": "websocket.send", "text": self.refusal(reason, internal=True)})
                    await send({"type": "websocket.close", "code": CLOSE_SERVER_ERROR, "reason": reason})
                    return
            await self._run(sink, scope, receive, send)
        finally:
            self.hub.unregister(sink)
            if conn is not None:
                await self.closed(conn)

    async def _run(self, sink: Sink, scope: Scope, receive: Receive, send: Send) -> None:
        ready = asyncio.Event()
        drop = asyncio.Event()

        def wake() -> None:
            ready.set()
            if sink.dropped:
                drop.set()

        sink.wake = wake
        sink.push(self.hello(sink))
        writer = asyncio.ensure_future(self._writer(sink, ready, drop, send))
        reader = asyncio.ensure_future(self._reader(sink, scope, receive))
        try:
            await asyncio.wait({writer, reader}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (writer, reader):
                if not t.done():
                    t.cancel()
            await asyncio.gather(writer, reader, return_exceptions=True)
        too_big = reader.result() if reader.done() and not reader.cancelled() and not reader.exception() else None
        if too_big:
            await send({"type": "websocket.send", "text": self.refusal(too_big, internal=False)})
            await send({"type": "websocket.close", "code": CLOSE_TOO_BIG, "reason": too_big[:120]})
            return
        if sink.dropped:
            self.dropped += 1
            try:  # best effort: a client that does not read may never see it
                await asyncio.wait_for(
                    send({"type": "websocket.close", "code": CLOSE_POLICY, "reason": "too slow: outgoing buffer full"}),
                    1.0,
                )
            except Exception:
                pass

    # ------------------------------------------------------------------ what a protocol on this shell overrides
    def matches(self, scope: Scope) -> bool:
        """Is this WebSocket request ours (by its path below ``root_path``)?"""
        return relative_path(scope) == self.path

    async def open_sink(self, identity: Identity, scope: Scope) -> Sink:
        """The new connection's :class:`Sink` (not yet registered)."""
        gate = self.lookups.gate(identity, scope)
        return Sink(self.bus, identity, self._encode, max_buffer=self.max_buffer, on_reset=self._on_reset, gate=gate)

    def refusal(self, reason: str, internal: bool) -> str:
        """The frame explaining why the connection is closed at connect (bad input, or a server failure when
        ``internal``), sent before the close."""
        return dumps({"op": "error", "reason": reason})

    def hello(self, sink: Sink) -> str:
        """The first frame."""
        client_id = sink.identity.client_id
        return dumps({"op": "status", "status": "connected", "epoch": sink.epoch, "client_id": client_id})

    async def _writer(self, sink: Sink, ready: asyncio.Event, drop: asyncio.Event, send: Send) -> None:
        while not sink.dropped and not sink.closed:
            if not sink.pending:
                try:
                    await asyncio.wait_for(ready.wait(), self.keepalive_interval)
                except asyncio.TimeoutError:
                    sink.check_epoch()
            ready.clear()
            for piece in sink.take():
                if sink.dropped:
                    return
                send_task = asyncio.ensure_future(send({"type": "websocket.send", "text": piece}))
                # a send blocked by a client that does not read must not outlive the drop
                waiter = asyncio.ensure_future(drop.wait())
                try:
                    await asyncio.wait({send_task, waiter}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    waiter.cancel()
                    if not send_task.done():
                        send_task.cancel()
                if sink.dropped:
                    return
                send_task.result()

    async def _reader(self, sink: Sink, scope: Scope, receive: Receive) -> str | None:
        """Handle the client's messages until it leaves (None), or until one is over ``max_frame`` (the reason:
        the socket is then closed with 1009)."""
        while True:
            message = await receive()
            kind = message["type"]
            if kind == "websocket.disconnect":
                sink.closed = True
                sink.wake()
                return None
            if kind != "websocket.receive":
                continue
            text = message.get("text")
            size = len(text) if text is not None else len(message.get("bytes") or b"")
            if size > self.max_frame:
                _warn_server_limit(size, self.max_frame)
                return f"message too big ({size} > max_frame {self.max_frame})"
            if text is None:
                try:
                    text = (message.get("bytes") or b"").decode("utf-8")
                except UnicodeDecodeError:
                    self._error(sink, "binary frame is not valid UTF-8 JSON")
                    continue
            await self._handle(sink, scope, text)

    # ------------------------------------------------------------------ ops
    def _error(self, sink: Sink, reason: str, ref: Any = None) -> None:
        sink.push(frame(ref, op="error", reason=reason))

    def _status(self, sink: Sink, status: str, ref: Any, **fields: Any) -> None:
        sink.push(frame(ref, op="status", status=status, **fields))

    async def _handle(self, sink: Sink, scope: Scope, text: str) -> None:
        ref = None
        try:
            obj = parse_command(text)
            ref = obj.get("ref")
            op = obj.get("op")
            if op == "subscribe":
                await self._subscribe(sink, obj, ref)
            elif op == "unsubscribe":
                self._unsubscribe(sink, obj, ref)
            elif op == "replay":
                await self._replay(sink, obj, ref)
            elif op == "publish":
                await self._publish(sink, scope, obj, ref)
            elif op == "ping":
                sink.push(frame(ref, op="pong"))
            elif isinstance(op, str):
                raise BadInput(f"unknown op {op[:40]!r} (subscribe, unsubscribe, replay, publish, ping)")
            else:
                raise BadInput("missing or non-string 'op'")
        except BadInput as exc:
            self._error(sink, str(exc), ref)
        except ProtocolError as exc:
            self._error(sink, exc.reason, ref)
        except Exception as exc:  # a bug, not bad input: say so and keep the connection (never die silently)
            log.exception("shmbus: WebSocket command failed")
            self._error(sink, f"internal error ({type(exc).__name__}); see the server log", ref)

    async def may_read(self, sink: Sink, channel: str) -> bool:
        """``subscribe_allowed``'s verdict for a channel the client names (True without the hook)."""
        return sink.gate is None or await sink.gate.decide(channel)

    def _refuse(self, sink: Sink, channel: str, ref: Any) -> None:
        sink.push(frame(ref, op="error", reason=f"not allowed to subscribe to {channel[:80]!r}", channel=channel))

    async def _subscribe(self, sink: Sink, obj: dict[str, Any], ref: Any) -> None:
        channel, pat = target(obj)
        new = (channel not in sink.channels) if channel is not None else (pat not in sink.patterns)
        if new and sink.subscription_count() >= self.max_subscriptions:
            raise BadInput(f"too many subscriptions (limit {self.max_subscriptions})")
        if channel is not None and not await self.may_read(sink, channel):
            self._refuse(sink, channel, ref)
            return
        bus = self.bus
        upto = bus.segment.global_id()
        site = sink.site or ""
        if channel is not None:
            last_id = int_field(obj, "last_id")
            gap = False
            if last_id is not None:
                last = bus.last_id(channel, site)
                after = last_id if last_id >= 0 else bus.look_back(channel, -last_id, site)
                backlog = bus.backlog(channel, min(after, last), site)
                gap = backlog.gap
                sink.push_allowed(m for m in backlog if m.global_id <= upto)
            sink.set_channel(channel, upto, replayed=last_id is not None)  # no replay: in-flight ones stay live
            self._status(sink, "subscribed", ref, channel=channel, last_id=bus.last_id(channel, site), gap=gap)
            return
        assert pat is not None
        after_gid = int_field(obj, "last_global_id", lo=0)
        gap = False
        if after_gid is not None:
            rp = replay_since(bus, [], [pat], sink.site, after_gid, upto)
            gap = rp.gap
            sink.push_allowed(rp.messages)
        sink.add_pattern(pat[0], pat[1], upto, replayed=after_gid is not None)
        self._status(sink, "subscribed", ref, pattern=pat[0], kind=pat[1], global_id=upto, gap=gap)

    def _unsubscribe(self, sink: Sink, obj: dict[str, Any], ref: Any) -> None:
        channel, pat = target(obj)
        if channel is not None:
            removed = sink.drop_channel(channel)
            self._status(sink, "unsubscribed", ref, channel=channel, removed=removed)
            return
        assert pat is not None
        removed = sink.drop_pattern(*pat)
        self._status(sink, "unsubscribed", ref, pattern=pat[0], kind=pat[1], removed=removed)

    async def _replay(self, sink: Sink, obj: dict[str, Any], ref: Any) -> None:
        channel = obj.get("channel")
        if channel is None:
            raise BadInput("replay needs a 'channel' (patterns cannot be replayed by message id)")
        channel = check_client_channel(channel)
        if not await self.may_read(sink, channel):
            self._refuse(sink, channel, ref)
            return
        start = int_field(obj, "start_id", default=0)
        count = int_field(obj, "count", default=MAX_REPLAY, lo=1, hi=MAX_REPLAY)
        assert start is not None and count is not None
        site = sink.site or ""
        last = self.bus.last_id(channel, site)
        after = start - 1 if start > 0 else (self.bus.look_back(channel, -start, site) if start < 0 else 0)
        backlog = self.bus.backlog(channel, min(after, last), site, limit=count)
        sent = 0
        top = after
        for m in backlog:
            top = max(top, m.message_id)
            if sink.allowed(m):
                sink.deliver(m)
                sent += 1
        self._status(sink, "replayed", ref, channel=channel, count=sent, last_id=top, gap=backlog.gap)

    async def _publish(self, sink: Sink, scope: Scope, obj: dict[str, Any], ref: Any) -> None:
        channel = check_client_channel(obj.get("channel"))
        if self.allow_publish is None:
            raise BadInput("publishing over this WebSocket is disabled")
        if "data" not in obj:
            raise BadInput("publish needs 'data'")
        user_ids, group_ids, client_ids = (
            ids_field(obj, "user_ids"),
            ids_field(obj, "group_ids"),
            ids_field(obj, "client_ids"),
        )
        if not await maybe_await(self.allow_publish(scope, channel)):
            raise BadInput(f"not allowed to publish on {channel[:80]!r}")
        site = sink.site or ""  # the connection's own site; "" = no site (never the bus's zero-argument lookup)
        try:
            mid = self.bus.publish(
                channel, obj["data"], site_id=site, user_ids=user_ids, group_ids=group_ids, client_ids=client_ids
            )
        except (ShmbusError, TypeError, ValueError) as exc:
            raise BadInput(f"publish refused: {exc}")
        if mid is None:
            raise BadInput("the bus is off (publishing disabled)")
        if not await self.may_read(sink, channel):  # the id would tell how many messages it holds
            self._status(sink, "published", ref, channel=channel)
            return
        self._status(sink, "published", ref, channel=channel, message_id=mid)

    def _on_reset(self, sink: Sink, old: int, new: int) -> None:
        """Tell the client, replay the new epoch's retained backlog of every subscription, continue live."""
        self._status(sink, "reset", None, epoch=new, previous_epoch=old)
        upto = self.bus.segment.global_id()
        channels, patterns = list(sink.channels), list(sink.patterns)
        rp = replay_since(self.bus, channels, patterns, sink.site, 0, upto)
        sink.push_allowed(rp.messages)
        sink.refloor(upto)


_warned_server_limit = False


def _warn_server_limit(size: int, max_frame: int) -> None:
    """Say once per process that the server buffered a message over ``max_frame`` before the app could refuse it."""
    global _warned_server_limit
    if not _warned_server_limit:
        _warned_server_limit = True
        log.warning(
            "shmbus: a WebSocket message of %d bytes reached the app (max_frame %d): the server read and buffered "
            "it whole first. Give the server the same limit so it refuses such a frame from its header: gunicorn "
            "-k shmbus.adapters.server.uvicorn_worker.UvicornWorker (does it), or uvicorn --ws-max-size %d",
            size,
            max_frame,
            max_frame,
        )
