"""Server-Sent Events transport (ASGI): ``GET <path>?channel=/a&channel=/b&prefix=/chat&glob=/x/*[&events=message]``.

Why SSE next to message_bus's long polling: a browser's ``EventSource`` reconnects by itself and resends the last
id it saw, so a stream over a plain GET resumes without any client library. Wire format, one event per message::

    id: <epoch>:<global_id>
    event: <channel>
    data: {"global_id":..,"message_id":..,"channel":..,"data":..}

With ``events=message`` every message is sent as an unnamed event instead (no ``event:`` line), which a browser's
``EventSource`` delivers to ``onmessage``; the channel is in the data. Use it with ``prefix=`` or ``glob=``: a
browser can only listen to event names it knows in advance, and ``EventSource`` has no wildcard listener.
``events=channel`` (the default) names each event after its channel, for ``addEventListener("/chat", ...)``; a
stream with ``prefix=`` or ``glob=`` must say which it wants (a 400 otherwise: with named events a browser hears
nothing, having no listener for channels it does not know).

Ids are ``<epoch>:<global_id>``: one cursor for the whole stream (exact channels *and* patterns), which per-channel
ids cannot give. On reconnect ``Last-Event-ID`` (or ``?last_event_id=``) replays everything after that global id
that is still retained and allowed, then continues live: nothing missed, nothing repeated. Control events have
names that never start with ``/`` (channel names must): ``event: reset`` (the id's epoch is not the bus's: the bus
was reset, the stream restarts from the new epoch's retained backlog), ``event: gap`` (``{"channels": [...]}``:
messages after the client's position were trimmed/overwritten; conservative, may over-report for channels whose
retained backlog starts after the client's position), ``event: refused`` (``{"channels": [...]}``, first: the
channels the app's ``subscribe_allowed`` refused, left out of the stream; a 403 when nothing else was asked for).
``: keepalive`` comments keep proxies from timing out.
Targeting (user/group/client ids, sites, client message filters) follows the message_bus middleware exactly; the
client id is ``?client_id=`` (or ``client_id_lookup(scope)``). A client that stops reading is dropped once
``max_buffer`` bytes are queued for it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from shmbus.bus import Bus
from shmbus.message import Message

from ..asgi_support import Receive, Scope, Send, fallback, header, relative_path, send_simple, until_disconnect
from ..http import ProtocolError, encode_message
from .app import TransportApp
from .connection import Connection
from .replay import replay_since
from .sink import Sink
from .sse_options import SSEKeywords, SSEOptions
from .sse_stream import StreamPace
from .validation import check_pattern, check_subscribe_channel

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["SSEApp", "StreamRequest", "format_event", "parse_event_id", "parse_request"]

log = logging.getLogger(__name__)

SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache, no-transform"),
    (b"x-accel-buffering", b"no"),  # nginx: do not buffer the stream
]
#: values of the ``events`` query parameter
EVENT_NAMING = ("channel", "message")
#: why a prefix= or glob= stream must say how its events are named: a browser's EventSource hears a named event
#: only through a listener added for that exact name, so with the default naming such a stream was silently empty
PATTERNS_NEED_NAMING = (
    "a prefix= or glob= stream needs events=message (unnamed events: EventSource's onmessage receives them, the "
    "channel is in the data) or events=channel (named after each channel, for a client that knows the names)"
)


def format_event(event: str | None, data: bytes, event_id: str | None = None) -> bytes:
    """One SSE event. Data lines are split (JSON only has insignificant line breaks), so nothing can inject fields."""
    out = []
    if event_id is not None:
        out.append(b"id: " + event_id.encode() + b"\n")
    if event is not None:
        out.append(b"event: " + event.replace("\r", " ").replace("\n", " ").encode() + b"\n")
    for line in data.splitlines() or [b""]:
        out.append(b"data: " + line + b"\n")
    out.append(b"\n")
    return b"".join(out)


def parse_event_id(value: str) -> tuple[int, int]:
    """``"<epoch>:<global_id>"`` -> ``(epoch, global_id)``; ProtocolError(400) otherwise."""
    epoch, sep, gid = value.strip().partition(":")
    if not sep or not epoch.isdigit() or not gid.isdigit() or len(epoch) > 20 or len(gid) > 20:
        raise ProtocolError(400, "invalid Last-Event-ID (expected '<epoch>:<global_id>' as sent by this server)")
    return int(epoch), int(gid)


@dataclass
class StreamRequest:
    """What an SSE request asks for (parsed from its query string and ``Last-Event-ID``; no I/O)."""

    channels: list[str]
    patterns: list[tuple[str, str]]
    resume: tuple[int, int] | None
    query: dict[str, list[str]]
    #: ``events=channel`` (default): each event is named after its channel; ``events=message``: unnamed events
    named: bool = True


def parse_request(
    query_string: bytes | str, last_event_id: str | None, max_subscriptions: int, need_channels: bool
) -> StreamRequest:
    """Parse and validate an SSE request; ProtocolError(400) with the reason for anything wrong."""
    raw = query_string.decode("latin-1") if isinstance(query_string, bytes) else query_string
    try:
        query = parse_qs(raw, keep_blank_values=True, errors="strict", max_num_fields=max_subscriptions + 10)
    except (UnicodeDecodeError, ValueError):
        raise ProtocolError(400, f"malformed query string (or more than {max_subscriptions + 10} parameters)")
    channels = [check_subscribe_channel(c) for c in query.get("channel", [])]
    patterns = [(check_pattern(p, kind), kind) for kind in ("prefix", "glob") for p in query.get(kind, [])]
    if not channels and not patterns and need_channels:
        raise ProtocolError(400, "name at least one channel (?channel=/a), prefix (?prefix=/a) or glob (?glob=/a/*)")
    if len(channels) + len(patterns) > max_subscriptions:
        raise ProtocolError(400, f"too many subscriptions (limit {max_subscriptions})")
    last = last_event_id if last_event_id is not None else (query.get("last_event_id") or [""])[-1]
    resume = parse_event_id(last) if last.strip() else None
    if patterns and "events" not in query:  # named after channels no listener can know in advance: never heard
        raise ProtocolError(400, PATTERNS_NEED_NAMING)
    events = query.get("events", ["channel"])
    if len(events) != 1 or events[0] not in EVENT_NAMING:
        raise ProtocolError(400, "events must be 'channel' (events named after their channel) or 'message'")
    return StreamRequest(channels, patterns, resume, query, named=events[0] == "channel")


def refuse_channels(request: StreamRequest, refused: list[str]) -> bytes | None:
    """Leave the channels ``subscribe_allowed`` refused out of ``request``: the ``refused`` event the stream opens
    with (None when none was); a 403 when the query asked for nothing else (a stream that could never say
    anything; a browser's ``EventSource`` does not retry a 403)."""
    if not refused:
        return None
    refused = list(dict.fromkeys(refused))
    request.channels = [ch for ch in request.channels if ch not in refused]
    if not request.channels and not request.patterns:
        raise ProtocolError(403, f"not allowed to subscribe to {', '.join(refused)}"[:300])
    return format_event("refused", json.dumps({"channels": refused}).encode())


def start_open(bus: Bus, sink: Sink, request: StreamRequest) -> int:
    """First half of opening a stream (the sink is registered and ``holding``): subscribe the query's channels
    and patterns; returns the global id the stream starts after. The app's ``on_open`` runs next."""
    start = bus.segment.global_id()
    for ch in request.channels:
        sink.set_channel(ch, start)
    for p, kind in request.patterns:
        sink.add_pattern(p, kind, start)
    return start


def finish_open(bus: Bus, sink: Sink, resume: tuple[int, int] | None, start: int) -> None:
    """Second half, after ``on_open``: replay every subscription (the query's and the hook's) from the resume
    point (or from ``start``) up to now, then let live delivery continue above it. Live messages held meanwhile
    are all at or below that id, so each message is sent exactly once."""
    upto = bus.segment.global_id()
    after = start
    if resume is not None:
        epoch, after = resume
        if epoch != sink.epoch or after > upto:
            sink.push(format_event("reset", json.dumps({"epoch": sink.epoch, "previous_epoch": epoch}).encode()))
            after = 0
    if after < upto:
        replay(bus, sink, list(sink.channels), list(sink.patterns), after, upto)
    sink.refloor(upto)
    sink.holding = False


def replay(bus: Bus, sink: Sink, channels: list[str], patterns: list[tuple[str, str]], after: int, upto: int) -> None:
    rp = replay_since(bus, channels, patterns, sink.site, after, upto)
    if rp.gap:
        sink.push(format_event("gap", json.dumps({"epoch": sink.epoch, "channels": rp.gap_channels}).encode()))
    sink.push_allowed(rp.messages)


def on_reset(bus: Bus, sink: Sink, old: int, new: int) -> None:
    """Live reset: tell the client, replay the new epoch's retained backlog, continue live after it."""
    sink.push(format_event("reset", json.dumps({"epoch": new, "previous_epoch": old}).encode()))
    upto = bus.segment.global_id()
    replay(bus, sink, list(sink.channels), list(sink.patterns), 0, upto)
    sink.refloor(upto)


class _HookFailed(Exception):
    """``on_open`` raised (logged): the client gets a 500."""


def _message_event(is_json: bool, named: bool = True) -> Callable[[Message], bytes]:
    def encode(msg: Message) -> bytes:
        # a process-local message (engine=False) has no global id: no SSE id, so a resume cursor never moves back
        event_id = f"{msg.epoch}:{msg.global_id}" if msg.global_id else None
        return format_event(msg.channel if named else None, encode_message(msg, is_json), event_id)

    return encode


def message_encoders(is_json: bool) -> dict[bool, Callable[[Message], bytes]]:
    """The two encoders of an app, keyed by :attr:`StreamRequest.named` (built once, picked per stream)."""
    return {named: _message_event(is_json, named) for named in (True, False)}


class SSEApp(TransportApp):
    """ASGI app serving ``GET <path>`` as an event stream; other requests go to ``app`` (or 404).

    Keywords (``bus``, ``path``, ``keepalive_interval``, ``max_buffer``, ``max_subscriptions``, ``retry_ms``,
    the hooks, the lookups): :class:`~shmbus.adapters.transports.sse_options.SSEOptions`. Lookups are the
    middleware's (scope in, value out; may be async) plus ``client_id_lookup``. ``on_open(connection)`` /
    ``on_close(connection)`` (plain or async) see each stream as a
    :class:`~shmbus.adapters.transports.connection.Connection`: ``on_open`` may subscribe it server-side (then the
    query may name no channel at all); subscriptions it makes are replayed on a resume like the query's. If
    ``on_open`` raises, the client gets a 500.
    """

    def __init__(self, app: Callable[..., Any] | None = None, **keywords: Unpack[SSEKeywords]) -> None:
        options = SSEOptions(**keywords)
        o = options
        super().__init__(app, o.bus, o.path, o.max_buffer, o.max_subscriptions, o, o.on_open, o.on_close)
        self.keepalive_interval = options.keepalive_interval
        self.retry_ms = options.retry_ms
        self._encoders = message_encoders(self.bus.codec.is_json)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or relative_path(scope) != self.path:
            await fallback(self.app, scope, receive, send)
            return
        if scope.get("method") not in ("GET", "HEAD"):
            await send_simple(send, 405, b"use GET", extra=[(b"allow", b"GET")])
            return
        try:
            sink, conn = await self._open(scope)
        except ProtocolError as exc:
            await send_simple(send, exc.status, exc.reason.encode())
            return
        except _HookFailed:
            await send_simple(send, 500, b"the application's on_open hook failed (see the server log)")
            return
        except Exception:  # a bug, not bad input (that is a ProtocolError): _open left nothing registered
            log.exception("shmbus: opening an SSE stream failed")
            await send_simple(send, 500, b"internal error while opening the stream (see the server log)")
            return
        try:
            await self._stream(sink, scope, receive, send)
        finally:
            self.hub.unregister(sink)
            if conn is not None:
                await self.closed(conn)

    async def _open(self, scope: Scope) -> tuple[Sink, Connection | None]:
        raw_id = header(scope, b"last-event-id")
        request = parse_request(
            scope.get("query_string", b""),
            raw_id.decode("latin-1") if raw_id is not None else None,
            self.max_subscriptions,
            need_channels=self.on_open is None,
        )
        identity = await self.lookups.identity(scope, request.query)
        gate = self.lookups.gate(identity, scope)
        refused = None
        if gate is not None:  # before anything is registered: a refused channel is never subscribed
            refused = refuse_channels(request, [ch for ch in request.channels if not await gate.decide(ch)])
        bus = self.bus
        # the initial replay is bounded by the backlogs; the buffer limit applies from the first write on
        sink = Sink(
            bus, identity, self._encoders[request.named], max_buffer=1 << 62, on_reset=self._on_reset, gate=gate
        )
        if refused is not None:
            sink.push(refused)
        # Register first and hold live delivery while opening (see finish_open: nothing twice, nothing lost).
        sink.holding = True
        self.hub.register(sink)
        conn: Connection | None = None
        try:  # whatever fails from here on, no sink (and no connection) stays behind
            start = start_open(bus, sink, request)
            conn = self.connection(sink, scope) if self.on_open or self.on_close else None
            if conn is not None:
                try:
                    await self.opened(conn)
                except Exception as exc:
                    log.exception("shmbus: SSE on_open hook %r failed", self.on_open)
                    raise _HookFailed from exc
            finish_open(bus, sink, request.resume, start)
        except BaseException:
            self.hub.unregister(sink)
            if conn is not None:
                await self.closed(conn)
            raise
        return sink, conn

    def _on_reset(self, sink: Sink, old: int, new: int) -> None:
        on_reset(self.bus, sink, old, new)

    async def _stream(self, sink: Sink, scope: Scope, receive: Receive, send: Send) -> None:
        loop = asyncio.get_running_loop()
        ready = asyncio.Event()
        task = asyncio.current_task()
        sending = [False]

        def wake() -> None:
            ready.set()
            if sink.dropped and sending[0] and task is not None:
                task.cancel()  # stuck in send() to a client that does not read

        sink.wake = wake
        gone = asyncio.ensure_future(until_disconnect(receive))

        def on_gone(_t: object) -> None:
            sink.closed = True
            ready.set()

        gone.add_done_callback(on_gone)
        await send({"type": "http.response.start", "status": 200, "headers": list(SSE_HEADERS)})
        if scope.get("method") == "HEAD":
            await send({"type": "http.response.body", "body": b""})
            gone.cancel()
            return
        pace = StreamPace(sink, self.keepalive_interval, self.retry_ms)
        try:
            first = pace.opening(loop.time())
            sink.max_buffer = self.max_buffer
            sending[0] = True
            await send({"type": "http.response.body", "body": first, "more_body": True})
            sending[0] = False
            while not sink.closed and not sink.dropped:
                timeout = pace.timeout(loop.time())
                if timeout > 0:
                    try:
                        await asyncio.wait_for(ready.wait(), timeout)
                    except asyncio.TimeoutError:
                        pass
                ready.clear()
                if sink.closed or sink.dropped:
                    break
                out = pace.next_write(loop.time())
                if out:
                    sending[0] = True
                    await send({"type": "http.response.body", "body": out, "more_body": True})
                    sending[0] = False
            if sink.dropped:
                self.dropped += 1
                return
            if not gone.done():
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if sink.dropped:
                self.dropped += 1
                return  # we cancelled ourselves: the client stopped reading
            raise
        except OSError:  # the server reports a closed connection on send
            return
        finally:
            if not gone.done():
                gone.cancel()
