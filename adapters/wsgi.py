"""WSGI shell of the message_bus protocol: ``MessageBusMiddleware(app=None, *, bus=None, **options)``.

Mount it around any WSGI app (``app=None`` answers 404 outside the bus routes)::

    from shmbus import Bus
    from shmbus.adapters.wsgi import MessageBusMiddleware

    bus = Bus("myapp", create=True)
    application = MessageBusMiddleware(django_or_flask_wsgi_app, bus=bus,
                                       user_id_lookup=lambda environ: environ.get("REMOTE_USER"))

Options are those of :class:`shmbus.adapters.http.Options` (the gem's names in snake_case, times in
seconds): ``base_route``, ``long_polling_enabled``, ``long_polling_interval`` (25), ``chunked_encoding_enabled``,
``max_active_clients`` (1000, per process), ``allow_broadcast``, the lookups (called with the WSGI environ),
``on_middleware_error``, ``max_body_size``, ``max_channels_per_poll``, ``max_stream_buffer`` and
``long_polling_on_sync_workers``. ``environ['message_bus.channels']`` (and ``'message_bus.seq'``) set by an
upstream middleware replace the request body, as in the gem.

How waiting works, per server model (a WSGI request that waits holds its worker thread or greenlet):

* **Threaded servers** (gunicorn ``gthread``, uwsgi ``--threads``, waitress, ...: ``wsgi.multithread`` is
  true): a waiting request blocks its thread on a per-request lock with a timeout (no timer threads); the bus
  listener thread delivers each batch and releases the locks of the concerned requests only. Each parked
  request occupies one server thread, so when the thread count is known (the gunicorn hooks in
  :mod:`shmbus.adapters.integrations.gunicorn` report it, or call :func:`configure_server`) at most
  ``threads - max(1, threads // 8)`` requests park at once and further long polls are answered at once (the
  ``max_active_clients`` fallback): the worker always keeps threads for ordinary requests.
* **gevent** (gunicorn ``gevent`` worker, uwsgi ``--gevent``, or any monkey-patched process): requests wait
  in greenlets; the bus listener stays a real OS thread and hands every batch to the hub through one
  ``loop.async_()`` watcher, and a greenlet delivers it. Parking is limited only by ``max_active_clients``.
* **One request at a time** (gunicorn ``sync``, uwsgi without threads: ``wsgi.multithread`` false, no gevent):
  a parked long poll would block the whole worker for ``long_polling_interval``. By default such workers answer
  every poll at once, as if ``dlp=t`` were sent (JS clients then poll about every 15 s; latency up to that).
  ``long_polling_on_sync_workers=True`` allows parking anyway — only sensible with many workers and a short
  ``long_polling_interval``.

Streaming (chunked) responses are generators: the server writes each chunk as it is yielded (one write per
wake-up, however many messages). A client that disconnects is noticed when the next chunk is written or, while
waiting, within about a second when the server exposes the socket (``gunicorn.socket``); a streaming client
that stops reading is dropped once ``max_stream_buffer`` bytes are queued for it (its thread may stay blocked
in the server's socket write until the kernel gives up). WSGI cannot see an HTTP/1.0 client's socket close
before the response, so non-streaming long polls end at the timeout or the first message.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from shmbus.bus import Bus
from shmbus.message import Message

from .http import MessageBusProtocol, Options, ProtocolError
from .http.flow import RequestHead, request_flow, run_sync
from .http.options import bus_or_default
from .http.waiter import Ending
from .http.wire import CHUNKED_BODY_REFUSED
from .looptap import ProcessTap
from .wsgi_support import (
    PEER_CHECK_INTERVAL,
    BatchDispatcher,
    Environ,
    StartResponse,
    configure_server,
    may_park,
    peer_closed,
    server_threads,
    start_whole,
)

log = logging.getLogger(__name__)

#: Largest single ``wsgi.input.read()``: bodies are read in pieces, never all at once.
READ_PIECE = 16 * 1024

__all__ = ["MessageBusMiddleware", "configure_server", "server_threads"]

_SYNC_WARNING = (
    "shmbus: this WSGI server handles one request at a time (%s), so long polls are answered at once and "
    "browsers see a message only at their next poll (about 15 s later; no streaming either). For a WSGI app use "
    "gunicorn -c python:shmbus.adapters.integrations.gunicorn (32 threads per worker) or -k gevent; for many "
    "clients an ASGI worker (docs/web.md, 'Serving'); long_polling_on_sync_workers=True parks polls anyway"
)
_warned_sync = False


def warn_if_sync_server(options: Options, where: str | None = None) -> bool:
    """Log, once per process, that polls will not park: at construction in a gunicorn ``sync`` worker (``where`` is
    None), or at the first poll of any other one-request-at-a-time server (``where`` says why). True if it did."""
    global _warned_sync
    if _warned_sync or options.long_polling_on_sync_workers:
        return False
    if where is None:
        threaded = ("gunicorn.workers.gthread", "gunicorn.workers.ggevent", "gunicorn.workers.geventlet")
        if "gunicorn.workers.sync" not in sys.modules or any(m in sys.modules for m in threaded):
            return False
        where = "gunicorn's sync worker: run without the shmbus config module, or with --threads 1"
    _warned_sync = True
    log.warning(_SYNC_WARNING, where)
    return True


def _release(c: Any) -> None:
    lock = c.signal
    try:
        lock.release()
    except RuntimeError:  # already released: a wake is pending
        pass


class _ProcessFanout:
    """This process's protocol (its registry of waiting requests) and the dispatcher that hands it the bus
    listener's batches."""

    def __init__(self, bus: Bus, options: Options) -> None:
        self.proto = MessageBusProtocol(bus, options, threading.Lock())
        self.dispatcher = BatchDispatcher(self.proto.dispatch_batches, options.batch_window)


def _hand_on(fanout: _ProcessFanout, msgs: list[Message]) -> None:
    """Listener thread: the batch goes to this process's dispatcher."""
    fanout.dispatcher.on_batch(msgs)


class MessageBusMiddleware:
    """WSGI middleware serving ``<base_route>message-bus/...`` from a :class:`shmbus.Bus`.

    ``bus`` defaults to :func:`shmbus.default_bus`. One instance per process (forked workers each get fresh
    state automatically); it taps the bus on the first poll.
    """

    def __init__(self, app: Callable[..., Any] | None = None, *, bus: Bus | None = None, **options: Any) -> None:
        self.app = app
        self.bus = bus = bus_or_default(bus)
        self.options = Options.from_kwargs(options)
        self._fanout: ProcessTap[_ProcessFanout] = ProcessTap(bus, lambda: _ProcessFanout(bus, self.options), _hand_on)
        warn_if_sync_server(self.options)  # at start-up: gunicorn's sync worker polls at once, silently otherwise

    # ------------------------------------------------------------------ plumbing
    @property
    def protocol(self) -> MessageBusProtocol:
        return self._fanout.get().proto

    def close(self) -> None:
        """Stop receiving batches (the bus itself stays open)."""
        fanout = self._fanout.close()
        if fanout is not None:
            fanout.dispatcher.close()

    # ------------------------------------------------------------------ WSGI
    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or ""
        if not path.startswith(self.options.prefix):
            if self.app is None:
                return start_whole(start_response, 404, [("content-type", "text/plain")], b"not found")
            response: Iterable[bytes] = self.app(environ, start_response)
            return response
        return self._handle(environ, start_response, path)

    def _read_body(self, environ: Environ) -> bytes:
        """The request body, read in pieces of at most ``READ_PIECE`` bytes and never beyond ``max_body_size``."""
        limit = self.options.max_body_size
        stream = environ.get("wsgi.input")
        if "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower():
            raise ProtocolError(411, CHUNKED_BODY_REFUSED)
        cl = environ.get("CONTENT_LENGTH")
        if cl:
            try:
                n = int(cl)
            except ValueError:
                raise ProtocolError(400, "invalid Content-Length")
            if n < 0:
                raise ProtocolError(400, "invalid Content-Length")
            if n > limit:
                raise ProtocolError(413, f"request body too large (limit {limit} bytes)")
            if n == 0 or stream is None:
                return b""
            parts = []
            while n > 0:
                chunk = stream.read(min(n, READ_PIECE))
                if not chunk:
                    break
                parts.append(chunk)
                n -= len(chunk)
            return b"".join(parts)
        if stream is not None and environ.get("wsgi.input_terminated"):
            parts, size = [], 0
            while size <= limit:
                chunk = stream.read(min(limit + 1 - size, READ_PIECE))
                if not chunk:
                    break
                parts.append(chunk)
                size += len(chunk)
            if size > limit:
                raise ProtocolError(413, f"request body too large (limit {limit} bytes)")
            return b"".join(parts)
        return b""

    def _can_park(self, fanout: _ProcessFanout, environ: Environ) -> bool:
        if fanout.dispatcher.gevent:
            return True
        if not environ.get("wsgi.multithread"):
            warn_if_sync_server(self.options, "wsgi.multithread is false and gevent is not active")
            return self.options.long_polling_on_sync_workers
        return may_park(fanout.proto.registry.parked)

    def _handle(self, environ: Environ, start_response: StartResponse, path: str) -> Iterable[bytes]:
        opts = self.options
        fanout = self._fanout.get()
        proto = fanout.proto
        can_park = self._can_park(fanout, environ)
        signal = None
        if can_park:
            signal = threading.Lock()
            signal.acquire()
        head = RequestHead(
            environ.get("REQUEST_METHOD", "GET"),
            path,
            environ.get("QUERY_STRING", ""),
            environ.get("CONTENT_TYPE"),
            dont_chunk="HTTP_DONT_CHUNK" in environ,
            http11=environ.get("SERVER_PROTOCOL", "HTTP/1.0") not in ("HTTP/1.0", "HTTP/0.9"),
            override=environ.get("message_bus.channels"),
            override_seq=environ.get("message_bus.seq"),
        )
        poll = run_sync(
            request_flow(proto, head, can_park=can_park, waker=_release, signal=signal),
            lambda: self._read_body(environ),
            lambda step: step.fn(environ, *step.args),
        )
        if poll.mode == "immediate":
            assert poll.response is not None
            resp = poll.response
            return start_whole(start_response, resp.status, resp.headers, resp.body)
        c = poll.waiter
        assert c is not None
        sock = environ.get("gunicorn.socket")
        deadline = time.monotonic() + opts.long_polling_interval
        if poll.mode == "long":
            try:
                _wait(proto, c, deadline, sock)
                body = proto.long_poll_response(c)
            except BaseException:
                proto.abandon(c)
                raise
            start_response("200 OK", [*poll.headers, ("content-length", str(len(body)))])
            return [body]
        start_response("200 OK", list(poll.headers))  # a copy: servers may add to it, the core shares it
        return _stream(proto, c, poll.first_chunk, deadline, sock)


def _wait(proto: MessageBusProtocol, c: Any, deadline: float, sock: Any, once: bool = False) -> None:
    """Block until ``c`` is woken (once), done, its client went away, or ``deadline``."""
    lock = c.signal
    while not c.done:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        if sock is not None and remaining > PEER_CHECK_INTERVAL:
            if lock.acquire(True, PEER_CHECK_INTERVAL):
                if once:
                    return
                continue
            if peer_closed(sock):
                proto.end(c, Ending.DROPPED)  # under the registry's lock: the listener may be ending it too
                return
            continue
        if lock.acquire(True, remaining) and once:
            return


def _stream(proto: MessageBusProtocol, c: Any, first: bytes, deadline: float, sock: Any) -> Iterator[bytes]:
    try:
        yield first
        while not c.done and not c.dropped:
            if time.monotonic() >= deadline:
                break
            _wait(proto, c, deadline, sock, once=True)
            chunks = proto.stream_chunks(c)
            if chunks:
                yield chunks[0] if len(chunks) == 1 else b"".join(chunks)
        if not c.dropped:
            end = proto.stream_end(c)
            if end:
                yield b"".join(end)
    finally:
        proto.abandon(c)
