"""Server-Sent Events for WSGI apps (Flask, Django, falcon.App under gunicorn gevent/gthread or uwsgi):
``SSEWSGIApp(app=None, *, bus=None, path="/sse", ...)``.

The wire format, ids, resume, gaps, resets, targeting and the ``on_open``/``on_close`` connection hooks are the
ASGI :class:`~shmbus.adapters.transports.sse.SSEApp`'s (the request parsing and the replay logic are shared);
only the waiting differs. A stream holds its worker thread or greenlet for its whole life, so:

* **gevent** (gunicorn ``gevent`` worker, uwsgi ``--gevent``): each stream waits in its greenlet; the bus
  listener (a real OS thread) hands every batch to the hub with one ``loop.async_()`` watcher and a greenlet
  fans it out. Streams are limited only by ``max_streams``.
* **threads** (gunicorn ``gthread``, uwsgi ``--threads``): each stream blocks its thread on an event the
  listener thread sets. When the thread count is known (:func:`shmbus.adapters.wsgi.configure_server` or the
  gunicorn hooks), at most ``threads - max(1, threads // 8)`` streams run at once, so ordinary requests always
  find a thread; beyond that, and beyond ``max_streams``, a stream is refused with 503 and the reason.
* **one request at a time** (gunicorn ``sync``): a stream would block the worker, so it is refused with 503
  (``allow_sync_workers=True`` overrides, for many workers and short streams).

A client that goes away is noticed at the next write or, while waiting, within about a second when the server
exposes its socket (``gunicorn.socket``). Lookups and hooks are plain functions called with the WSGI environ.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any

from shmbus.bus import Bus
from shmbus.message import Message

from ..http import ProtocolError
from ..http.options import bus_or_default
from ..http.wire import status_line
from ..wsgi import PEER_CHECK_INTERVAL, gevent_active, peer_closed, server_threads
from .connection import Connection
from .hub import DEFAULT_MAX_BUFFER, Sink, SinkIndex
from .identity import LookupOptions
from .sse import (
    KEEPALIVE,
    SSE_HEADERS,
    finish_open,
    message_encoders,
    on_reset,
    parse_request,
    start_open,
)
from .validation import MAX_SUBSCRIPTIONS

__all__ = ["SSEWSGIApp"]

log = logging.getLogger(__name__)

Environ = dict[str, Any]
StartResponse = Callable[..., Any]
_HEADERS = [(k.decode(), v.decode()) for k, v in SSE_HEADERS]


class _ProcessHub:
    """This process's streams: one bus tap, one index, one lock (the listener thread or the gevent hub's
    greenlet dispatches; request threads subscribe and take under the same lock)."""

    def __init__(self, bus: Bus) -> None:
        self.pid = os.getpid()
        self.bus = bus
        self.lock = threading.RLock()
        self.index = SinkIndex(None, bus)
        self.gevent = gevent_active()
        self.queue: deque[list[Message]] = deque()
        self.draining = False
        self.watcher: Any = None
        if self.gevent:
            import gevent

            self.watcher = gevent.get_hub().loop.async_()
            self.watcher.start(self._on_async)
            self._spawn = gevent.spawn
        bus.tap(self.on_batch)

    def on_batch(self, msgs: list[Message]) -> None:
        """Listener thread: fan out here (threads), or hand the batch to the gevent hub (one async send)."""
        if not self.index.sinks or self.pid != os.getpid():
            return
        if self.gevent:
            self.queue.append(msgs)
            self.watcher.send()
        else:
            with self.lock:
                self.index.dispatch(msgs)

    def _on_async(self) -> None:  # in the gevent hub: never block here
        if not self.draining:
            self.draining = True
            self._spawn(self._drain)

    def _drain(self) -> None:
        self.draining = False
        while self.queue:
            msgs = self.queue.popleft()
            with self.lock:
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

    def close(self) -> None:
        self.bus.untap(self.on_batch)
        if self.gevent:
            self.watcher.stop()


class SSEWSGIApp:
    """WSGI app serving ``GET <path>`` as an event stream; other requests go to ``app`` (or 404).

    Options as :class:`~shmbus.adapters.transports.sse.SSEApp` (``keepalive_interval``, ``max_buffer``,
    ``max_subscriptions``, ``retry_ms``, ``on_open``, ``on_close``, the lookups), plus ``max_streams`` (per
    process) and ``allow_sync_workers``. If ``on_open`` raises, the client gets a 500.
    """

    def __init__(
        self,
        app: Callable[..., Any] | None = None,
        *,
        bus: Bus | None = None,
        path: str = "/sse",
        keepalive_interval: float = 15.0,
        max_buffer: int = DEFAULT_MAX_BUFFER,
        max_subscriptions: int = MAX_SUBSCRIPTIONS,
        max_streams: int = 1000,
        retry_ms: int | None = 2000,
        allow_sync_workers: bool = False,
        on_open: Callable[[Connection], Any] | None = None,
        on_close: Callable[[Connection], Any] | None = None,
        **lookups: Any,
    ) -> None:
        if not keepalive_interval > 0:
            raise ValueError("keepalive_interval must be > 0 seconds")
        for name, hook in (("on_open", on_open), ("on_close", on_close)):
            if hook is not None and not callable(hook):
                raise TypeError(f"{name} must be callable, got {hook!r}")
        self.app = app
        self.bus = bus_or_default(bus)
        self.path = path
        self.keepalive_interval = keepalive_interval
        self.max_buffer = max_buffer
        self.max_subscriptions = max_subscriptions
        self.max_streams = max_streams
        self.retry_ms = retry_ms
        self.allow_sync_workers = allow_sync_workers
        self.on_open = on_open
        self.on_close = on_close
        self.lookups = LookupOptions(**lookups)
        self.dropped = 0
        self._encoders = message_encoders(self.bus.codec.is_json)
        self._hub: _ProcessHub | None = None
        self._hub_lock = threading.Lock()

    def _get_hub(self) -> _ProcessHub:
        hub = self._hub
        if hub is not None and hub.pid == os.getpid():
            return hub
        with self._hub_lock:
            hub = self._hub
            if hub is None or hub.pid != os.getpid():
                hub = self._hub = _ProcessHub(self.bus)  # a forked child never touches its parent's hub
        return hub

    def stats(self) -> dict[str, int]:
        hub = self._hub
        live = len(hub.index.sinks) if hub is not None and hub.pid == os.getpid() else 0
        return {"connections": live, "dropped": self.dropped}

    def close(self) -> None:
        """Stop receiving batches (open streams end at their next wake-up; the bus stays open)."""
        hub, self._hub = self._hub, None
        if hub is not None and hub.pid == os.getpid():
            hub.close()

    # ------------------------------------------------------------------ WSGI
    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        if (environ.get("PATH_INFO") or "/") != self.path:
            if self.app is None:
                return _simple(start_response, 404, "not found")
            response: Iterable[bytes] = self.app(environ, start_response)
            return response
        method = environ.get("REQUEST_METHOD", "GET")
        if method not in ("GET", "HEAD"):
            return _simple(start_response, 405, "use GET", [("allow", "GET")])
        hub = self._get_hub()
        refusal = self._capacity_problem(hub, environ)
        if refusal:
            return _simple(start_response, 503, refusal, [("retry-after", "5")])
        try:
            request = parse_request(
                environ.get("QUERY_STRING", ""),
                environ.get("HTTP_LAST_EVENT_ID"),
                self.max_subscriptions,
                need_channels=self.on_open is None,
            )
            identity = self.lookups.identity_sync(environ, request.query)
        except ProtocolError as exc:
            return _simple(start_response, exc.status, exc.reason)
        bus = self.bus
        event = threading.Event()
        encode = self._encoders[request.named]
        sink = Sink(bus, identity, encode, max_buffer=1 << 62, on_reset=lambda s, o, n: on_reset(bus, s, o, n))
        sink.wake = event.set
        sink.holding = True
        hub.register(sink)
        conn = None
        if self.on_open or self.on_close:
            conn = Connection(bus, sink, environ, hub.run, self.max_subscriptions)
        try:
            with hub.lock:
                start = start_open(bus, sink, request)
            if conn is not None and self.on_open is not None:
                self.on_open(conn)
            with hub.lock:
                finish_open(bus, sink, request.resume, start)
                first = sink.take()
        except Exception:
            log.exception("shmbus: opening an SSE stream failed (on_open hook %r)", self.on_open)
            self._end(hub, sink, conn)
            return _simple(start_response, 500, "the application's on_open hook failed (see the server log)")
        start_response("200 OK", list(_HEADERS))
        if method == "HEAD":
            self._end(hub, sink, conn)
            return [b""]
        sink.max_buffer = self.max_buffer
        head = (b"retry: %d\n" % self.retry_ms if self.retry_ms else b"") + b": connected\n\n"
        stream = self._stream(hub, sink, conn, event, head + b"".join(first), environ.get("gunicorn.socket"))
        return _Response(stream, lambda: self._end(hub, sink, conn))

    def _capacity_problem(self, hub: _ProcessHub, environ: Environ) -> str | None:
        streams = len(hub.index.sinks)
        if streams >= self.max_streams:
            return f"too many event streams in this worker (max_streams={self.max_streams}); retry later"
        if hub.gevent:
            return None
        if not environ.get("wsgi.multithread"):
            if self.allow_sync_workers:
                return None
            return (
                "event streams need a gevent or threaded WSGI worker (gunicorn -k gevent / gthread); this worker "
                "serves one request at a time, so a stream would block it"
            )
        threads = server_threads()
        if threads is not None and streams >= threads - max(1, threads // 8):
            return f"all of this worker's stream threads are busy ({threads} threads, some kept for requests)"
        return None

    def _stream(
        self,
        hub: _ProcessHub,
        sink: Sink,
        conn: Connection | None,
        event: threading.Event,
        first: bytes,
        sock: Any,
    ) -> Generator[bytes, None, None]:
        try:
            yield first
            next_ping = time.monotonic() + self.keepalive_interval
            while not sink.closed and not sink.dropped:
                now = time.monotonic()
                timeout = next_ping - now
                if sock is not None:
                    timeout = min(timeout, PEER_CHECK_INTERVAL)
                if timeout > 0 and not sink.pending:
                    event.wait(timeout)
                event.clear()
                if sink.closed or sink.dropped or (sock is not None and peer_closed(sock)):
                    break
                with hub.lock:
                    out = sink.take()
                    if time.monotonic() >= next_ping:
                        sink.check_epoch()
                        out += sink.take()
                        out.append(KEEPALIVE)
                        next_ping = time.monotonic() + self.keepalive_interval
                if out:
                    yield b"".join(out)
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


def _simple(
    start_response: StartResponse, status: int, text: str, extra: list[tuple[str, str]] | None = None
) -> list[bytes]:
    body = text.encode()
    headers = [("content-type", "text/plain; charset=utf-8"), ("content-length", str(len(body))), *(extra or [])]
    start_response(status_line(status), headers)
    return [body]
