"""Server-Sent Events for WSGI apps (Flask, Django, falcon.App under gunicorn gevent/gthread or uwsgi):
``SSEWSGIApp(app=None, *, bus=None, path="/sse", ...)``.

The wire format, ids, resume, gaps, resets, targeting and the ``on_open``/``on_close`` connection hooks are the
ASGI :class:`~shmbus.adapters.transports.sse.SSEApp`'s (the request parsing and the replay logic are shared);
only the waiting differs. A stream holds its worker thread or greenlet for its whole life, so:

* **gevent** (gunicorn ``gevent`` worker, uwsgi ``--gevent``): each stream waits in its greenlet; the bus
  listener (a real OS thread) hands every batch to the hub with one ``loop.async_()`` watcher and a greenlet
  fans it out. Streams are limited only by ``max_streams``.
* **threads** (gunicorn ``gthread``, uwsgi ``--threads``): each stream blocks its thread on an event the
  listener thread sets. When the thread count is known (:func:`shmbus.adapters.wsgi_support.configure_server` or the
  gunicorn hooks), at most ``threads - max(1, threads // 8)`` streams run at once, so ordinary requests always
  find a thread; beyond that, and beyond ``max_streams``, a stream is refused with 503 and the reason.
* **one request at a time** (gunicorn ``sync``): a stream would block the worker, so it is refused with 503
  (``allow_sync_workers=True`` overrides, for many workers and short streams).

A client that goes away is noticed at the next write or, while waiting, within about a second when the server
exposes its socket (``gunicorn.socket``). Lookups and hooks are plain functions called with the WSGI environ.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from shmbus.bus import Bus
from shmbus.message import Message

from ..http import ProtocolError
from ..http.options import bus_or_default
from ..looptap import ProcessTap
from ..wsgi_support import (
    PEER_CHECK_INTERVAL,
    BatchDispatcher,
    Environ,
    StartResponse,
    may_park,
    peer_closed,
    server_threads,
    start_simple,
)
from .connection import Connection
from .hub import SinkIndex
from .sink import Sink
from .sse import (
    SSE_HEADERS,
    finish_open,
    message_encoders,
    on_reset,
    parse_request,
    refuse_channels,
    start_open,
)
from .sse_options import SSEWSGIKeywords, SSEWSGIOptions
from .sse_stream import StreamPace

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["SSEWSGIApp"]

log = logging.getLogger(__name__)

_HEADERS = [(k.decode(), v.decode()) for k, v in SSE_HEADERS]


class _ProcessHub:
    """This process's streams: one index and one lock (the dispatcher delivers under it, on the listener thread
    or in a gevent greenlet; request threads subscribe and take under the same lock)."""

    def __init__(self, bus: Bus) -> None:
        self.lock = threading.RLock()
        self.index = SinkIndex(None, bus)
        self.dispatcher = BatchDispatcher(self._deliver)

    def _deliver(self, batches: list[list[Message]]) -> None:
        with self.lock:
            for msgs in batches:
                self.index.dispatch(msgs)

    def register(self, sink: Sink) -> None:
        with self.lock:
            self.index.add(sink)

    def unregister(self, sink: Sink) -> None:
        with self.lock:
            sink.closed = True
            if sink.index is not None:
                sink.index.remove(sink)
            sink.release_engines()

    def run(self, fn: Callable[[], None]) -> None:
        with self.lock:
            fn()


def _hand_on(hub: _ProcessHub, msgs: list[Message]) -> None:
    """Listener thread: a batch for a process with open streams goes to its dispatcher."""
    if hub.index.sinks:
        hub.dispatcher.on_batch(msgs)


class SSEWSGIApp:
    """WSGI app serving ``GET <path>`` as an event stream; other requests go to ``app`` (or 404).

    Keywords as :class:`~shmbus.adapters.transports.sse.SSEApp`'s, plus ``max_streams`` (per process) and
    ``allow_sync_workers``: :class:`~shmbus.adapters.transports.sse_options.SSEWSGIOptions`. If ``on_open``
    raises, the client gets a 500.
    """

    def __init__(self, app: Callable[..., Any] | None = None, **keywords: Unpack[SSEWSGIKeywords]) -> None:
        self.app = app
        self.lookups = options = SSEWSGIOptions(**keywords)
        self.bus = bus_or_default(options.bus)
        self.path = options.path
        self.keepalive_interval = options.keepalive_interval
        self.max_buffer = options.max_buffer
        self.max_subscriptions = options.max_subscriptions
        self.max_streams = options.max_streams
        self.retry_ms = options.retry_ms
        self.allow_sync_workers = options.allow_sync_workers
        self.on_open = options.on_open
        self.on_close = options.on_close
        self.dropped = 0
        self._encoders = message_encoders(self.bus.codec.is_json)
        # a forked child never touches its parent's hub: it makes its own on its first stream
        self._hubs: ProcessTap[_ProcessHub] = ProcessTap(self.bus, lambda: _ProcessHub(self.bus), _hand_on)

    def stats(self) -> dict[str, int]:
        hub = self._hubs.current()
        return {"connections": len(hub.index.sinks) if hub is not None else 0, "dropped": self.dropped}

    def close(self) -> None:
        """Stop receiving batches (open streams end at their next wake-up; the bus stays open)."""
        hub = self._hubs.close()
        if hub is not None:
            hub.dispatcher.close()

    # ------------------------------------------------------------------ WSGI
    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        if (environ.get("PATH_INFO") or "/") != self.path:
            if self.app is None:
                return start_simple(start_response, 404, b"not found")
            response: Iterable[bytes] = self.app(environ, start_response)
            return response
        method = environ.get("REQUEST_METHOD", "GET")
        if method not in ("GET", "HEAD"):
            return start_simple(start_response, 405, b"use GET", extra=[("allow", "GET")])
        hub = self._hubs.get()
        refusal = self._capacity_problem(hub, environ)
        if refusal:
            return start_simple(start_response, 503, refusal.encode(), extra=[("retry-after", "5")])
        try:
            request = parse_request(
                environ.get("QUERY_STRING", ""),
                environ.get("HTTP_LAST_EVENT_ID"),
                self.max_subscriptions,
                need_channels=self.on_open is None,
            )
            identity = self.lookups.identity_sync(environ, request.query)
            gate = self.lookups.gate(identity, environ)
            refused = None
            if gate is not None:  # before anything is registered: a refused channel is never subscribed
                refused = refuse_channels(request, [ch for ch in request.channels if not gate.decide_sync(ch)])
        except ProtocolError as exc:
            return start_simple(start_response, exc.status, exc.reason.encode())
        bus = self.bus
        event = threading.Event()
        encode = self._encoders[request.named]
        sink = Sink(
            bus, identity, encode, max_buffer=1 << 62, on_reset=lambda s, o, n: on_reset(bus, s, o, n), gate=gate
        )
        if refused is not None:
            sink.push(refused)
        sink.wake = event.set
        sink.holding = True
        hub.register(sink)
        conn = None
        if self.on_open or self.on_close:
            conn = Connection(bus, sink, environ, hub.run, self.max_subscriptions)
        pace = StreamPace(sink, self.keepalive_interval, self.retry_ms)
        try:
            with hub.lock:
                start = start_open(bus, sink, request)
            if conn is not None and self.on_open is not None:
                self.on_open(conn)
            with hub.lock:
                finish_open(bus, sink, request.resume, start)
                first = pace.opening(time.monotonic())
        except Exception:
            log.exception("shmbus: opening an SSE stream failed (on_open hook %r)", self.on_open)
            self._end(hub, sink, conn)
            return start_simple(start_response, 500, b"the application's on_open hook failed (see the server log)")
        start_response("200 OK", list(_HEADERS))
        if method == "HEAD":
            self._end(hub, sink, conn)
            return [b""]
        sink.max_buffer = self.max_buffer
        stream = self._stream(hub, pace, conn, event, first, environ.get("gunicorn.socket"))
        return _Response(stream, lambda: self._end(hub, sink, conn))

    def _capacity_problem(self, hub: _ProcessHub, environ: Environ) -> str | None:
        streams = len(hub.index.sinks)
        if streams >= self.max_streams:
            return f"too many event streams in this worker (max_streams={self.max_streams}); retry later"
        if hub.dispatcher.gevent:
            return None
        if not environ.get("wsgi.multithread"):
            if self.allow_sync_workers:
                return None
            return (
                "event streams need a gevent or threaded WSGI worker (gunicorn -k gevent / gthread); this worker "
                "serves one request at a time, so a stream would block it"
            )
        if not may_park(streams):
            return f"all of this worker's stream threads are busy ({server_threads()} threads, some kept for requests)"
        return None

    def _stream(
        self,
        hub: _ProcessHub,
        pace: StreamPace,
        conn: Connection | None,
        event: threading.Event,
        first: bytes,
        sock: Any,
    ) -> Generator[bytes, None, None]:
        sink = pace.sink
        try:
            yield first
            while not sink.closed and not sink.dropped:
                timeout = pace.timeout(time.monotonic())
                if sock is not None:
                    timeout = min(timeout, PEER_CHECK_INTERVAL)
                if timeout > 0:
                    event.wait(timeout)
                event.clear()
                if sink.closed or sink.dropped or (sock is not None and peer_closed(sock)):
                    break
                with hub.lock:
                    out = pace.next_write(time.monotonic())
                if out:
                    yield out
            if sink.dropped:
                self.dropped += 1
        finally:
            self._end(hub, sink, conn)

    def _end(self, hub: _ProcessHub, sink: Sink, conn: Connection | None) -> None:
        """Unregister the stream, end its connection's subscriptions, run ``on_close``: once, however called."""
        with hub.lock:
            if sink.index is None and sink.closed:
                return
            hub.unregister(sink)
        if conn is not None:
            conn.close()
            if self.on_close is not None:
                try:
                    self.on_close(conn)
                except Exception:
                    log.exception("shmbus: on_close hook %r failed", self.on_close)


class _Response:
    """The stream as a WSGI iterable whose ``close()`` ends the stream even if the server never iterated it
    (closing a generator that never started would skip its ``finally``)."""

    def __init__(self, stream: Generator[bytes, None, None], end: Callable[[], None]) -> None:
        self._stream = stream
        self._end = end

    def __iter__(self) -> Iterator[bytes]:
        return self._stream

    def close(self) -> None:
        try:
            self._stream.close()
        finally:
            self._end()
