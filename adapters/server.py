"""A lean HTTP/1.1 server for the message bus: parked polls cost a few hundred bytes, not a task and a scope.

Why: under uvicorn every open request carries h11/httptools protocol objects, an ASGI task with its
coroutines and a scope dict (~10 KB), and the ASGI middleware adds ~4 KB per parked poll. Here message-bus
routes are served natively from ``asyncio.Protocol`` callbacks through the sans-IO core
(:mod:`shmbus.adapters.protocol`): a parked poll is this module's connection object (``__slots__``), the core's
:class:`~shmbus.adapters.protocol.Client` and one timer; bytes go straight to the transport. Every other
request goes to the wrapped ASGI app through a minimal ASGI bridge (:mod:`shmbus.adapters._server_asgi`).

Use it through gunicorn::

    gunicorn -k shmbus.adapters.server.GunicornWorker -w 2 myapp:app

where ``myapp:app`` is a :class:`shmbus.adapters.asgi.MessageBusMiddleware` (its bus, options and wrapped
app are used natively), or any ASGI app plus ``shmbus_options = {"bus": "name", **middleware options}`` in
the gunicorn config file (``-c conf.py``). Without either, it is a plain ASGI server. Or standalone (forks
``--workers`` processes after binding): ``python -m shmbus.adapters.server myapp:app --bind 127.0.0.1:8000``.

HTTP: keep-alive, pipelined requests answered one at a time in order, ``Expect: 100-continue`` (bus routes:
answered before the body is read; refused with ``413`` and a close when the declared body is over
``max_body_size``), HTTP/1.0 (never chunked; keep-alive only when asked), a 64 KiB limit on a request head
(``431``), malformed requests get ``400`` and a close, an idle keep-alive connection is closed after
``keepalive`` seconds. A client that disconnects is unregistered at once (``connection_lost``). A streaming
client that stops reading: while the transport is paused nothing more is taken from the core, which drops the
client once ``max_stream_buffer`` bytes are queued for it; the connection is then aborted. ``TCP_NODELAY`` is
set on every accepted TCP socket. Hostile clients are bounded by :class:`Limits` (a request head must arrive within
``header_timeout``, a body within ``body_timeout``: ``408``; pipelined input is held to ``max_pipeline_bytes``
while a request is answered, reading pauses beyond it; at most ``max_connections`` per worker: ``503``; bodies over
``max_body_size``: ``413``; chunked bodies on message-bus routes: ``411``), and every error response is followed by
a lingering close, so the client reads it instead of a connection reset. Parses with ``httptools`` when
importable, else with a small strict parser
(:mod:`shmbus.adapters._server_parser`). Limitations: no TLS, no WebSocket or other upgrades (an upgrade request
is served as plain HTTP and the connection closed), lookups that are coroutine functions make every bus request
go through the ASGI bridge (the middleware's own path: correct, not lean).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import inspect
import logging
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass, fields
from email.utils import formatdate
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote

from ._server_asgi import Cycle
from .asgi import MessageBusMiddleware
from .protocol import (
    BASE_HEADERS,
    STREAM_HEADERS,
    Client,
    MessageBusProtocol,
    PollRequest,
    ProtocolError,
    form_params,
    match_route,
    parse_body,
    parse_query_dlp,
    triple_response,
)

try:
    import httptools as _httptools

    _Parser: Any = _httptools.HttpRequestParser
    _ParserError: Any = _httptools.HttpParserError
    _ParserUpgrade: Any = _httptools.HttpParserUpgrade
    PARSER = "httptools"
except ImportError:  # pragma: no cover - exercised with SHMBUS_SERVER_PARSER=pure
    _httptools = None  # type: ignore[assignment,unused-ignore]
    PARSER = "pure"

if _httptools is None or os.environ.get("SHMBUS_SERVER_PARSER") == "pure":
    from . import _server_parser

    _Parser = _server_parser.HttpRequestParser
    _ParserError = _server_parser.HttpParserError
    _ParserUpgrade = _server_parser.HttpParserUpgrade
    PARSER = "pure"

__all__ = ["PARSER", "GunicornWorker", "HttpConnection", "Limits", "Request", "Server", "gunicorn_config_value", "main",
           "serve"]

log = logging.getLogger("shmbus.adapters.server")

#: Largest request head (request line + headers) accepted; larger gets ``431`` and a close.
MAX_HEAD_SIZE = 64 * 1024
#: Request body bytes buffered for a bridged (ASGI) request the app has not read yet before reading pauses.
MAX_BUFFERED = 256 * 1024
#: Input is fed to the parser in pieces of this size, so that pipelined requests stop being parsed (and queued)
#: soon after one is waiting behind the request being answered, whatever one read delivers.
FEED_STEP = 2048


@dataclass(frozen=True)
class Limits:
    """What one connection, and one worker, may cost: the server's defence against hostile clients.

    Every limit is per worker process. Exceeding one gets the status below, then a lingering close (the
    response is written, the write side shut down, and input drained for ``linger`` seconds, so the client
    reads the response rather than a reset).
    """

    #: Seconds from a request's first byte to the end of its head (slowloris): ``408``.
    header_timeout: float = 15.0
    #: Seconds from the end of a head to the end of its body, while the server is reading it: ``408``.
    body_timeout: float = 30.0
    #: Pipelined input held while a request is parked or answered; reading pauses beyond it.
    max_pipeline_bytes: int = 64 * 1024
    #: Open connections per worker; one more gets ``503`` and is closed.
    max_connections: int = 10_000
    #: Largest request body for routes served by the wrapped ASGI app (message-bus routes use the
    #: middleware's ``max_body_size``): ``413``.
    max_body_size: int = 64 << 20
    #: Largest request head (request line and headers): ``431``.
    max_head_size: int = MAX_HEAD_SIZE
    #: Seconds an error response's connection keeps draining input before it is closed.
    linger: float = 2.0

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"server limit {f.name} must be a number > 0, got {v!r}")

    @classmethod
    def from_mapping(cls, values: MutableMapping[str, Any] | dict[str, Any] | None) -> Limits:
        """From a config mapping (gunicorn's ``shmbus_server``): unknown names are an error, not ignored."""
        values = dict(values or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise TypeError(f"unknown server limit(s) {unknown}; known: {sorted(known)}")
        return cls(**values)

_LONG, _STREAM = 1, 2
_BAD_HEADER = re.compile(r"[\r\n\x00]")
_EMPTY_HEADERS: list[tuple[bytes, bytes]] = []


def _enc_headers(headers: list[tuple[str, str]]) -> bytes:
    return b"".join(b"%s: %s\r\n" % (k.encode("latin-1"), v.encode("latin-1")) for k, v in headers)


_BASE_BLOCK = _enc_headers(BASE_HEADERS)
_STREAM_BLOCK = _enc_headers(STREAM_HEADERS) + b"transfer-encoding: chunked\r\n"


class Request:
    """One parsed request (head, buffered body) while it is read and answered; released when answered."""

    __slots__ = ("body", "body_size", "bus", "chunked", "complete", "cycle", "expect_continue", "head_done", "headers",
                 "keep", "method", "path", "query", "raw_path", "refused", "started", "too_large", "url", "version")

    def __init__(self) -> None:
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.body_size = 0
        self.method = "GET"
        self.path = "/"
        self.raw_path = b"/"
        self.query = b""
        self.version = "1.1"
        self.keep = True
        self.bus = False
        self.complete = False
        self.started = False
        self.too_large = False
        self.expect_continue = False
        self.head_done = False
        self.chunked = False
        self.refused: tuple[int, str] | None = None  # answered with this error instead of being served
        self.cycle: Cycle | None = None

    def header(self, name: bytes) -> bytes | None:
        for k, v in self.headers:
            if k == name:
                return v
        return None


def _wake(c: Client) -> None:
    """The core's waker: the connection that parked ``c`` is its ``signal``."""
    c.signal.woken(c)


def _expire(conn: HttpConnection) -> None:
    conn.timer = None
    conn.expire()


class HttpConnection(asyncio.Protocol):
    """One client connection; also the parked-poll state (``client``, ``timer``) when a poll waits."""

    __slots__ = ("buffered", "client", "closing", "cur", "cycle", "deadline", "drain_fut", "eof", "feeding", "head",
                 "idle", "inbox", "kind", "linger_until", "parser", "paused_r", "paused_w", "phase", "pumping",
                 "queue", "req", "srv", "timer", "transport")

    def __init__(self, srv: Server) -> None:
        self.srv = srv
        self.transport: Any = None
        self.parser: Any = None
        self.req: Request | None = None  # being parsed
        self.cur: Request | None = None  # being answered
        self.queue: list[Request] | None = None  # parsed, waiting for cur to finish
        self.client: Client | None = None
        self.kind = 0
        self.head: bytes | None = None  # a parked long poll's response head (None: the common one)
        self.timer: asyncio.TimerHandle | None = None
        self.idle = 0.0  # when the connection became idle (0: busy); the server's clock sweeps idle ones
        self.cycle: Cycle | None = None
        self.drain_fut: asyncio.Future[None] | None = None
        self.paused_r = False
        self.paused_w = False
        self.pumping = False
        self.closing = False
        self.buffered = 0
        self.inbox = bytearray()  # pipelined input held (not parsed) while a request is answered
        self.feeding = False
        self.deadline = 0.0  # when the request being read must be complete (0: none); the tick enforces it
        self.phase = "request head"  # what the deadline waits for
        self.linger_until = 0.0  # a lingering close ends then at the latest
        self.eof = False  # the client half-closed: answer what it sent, then close

    # ------------------------------------------------------------------ asyncio.Protocol
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.parser = _Parser(self)
        srv = self.srv
        srv.connections.add(self)
        if srv.stopping:
            transport.close()
            self.closing = True
            return
        if len(srv.connections) > srv.limits.max_connections:
            log.warning("shmbus server: %d connections (max_connections): refusing one with 503",
                        len(srv.connections) - 1)
            self.fail(503, f"server busy: more than {srv.limits.max_connections} connections to this worker")
            return
        self._arm_idle()

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return  # answered with an error (or closing): drain and discard
        if self.inbox or self._must_hold():
            self.inbox += data
            self._update_reading()
            if not self.feeding and not self._must_hold():
                self._feed_inbox()
            return
        self._feed(data)

    def _must_hold(self) -> bool:
        """Stop parsing: a request is being answered (its body read) and another one is already queued."""
        cur = self.cur
        return cur is not None and cur.complete and bool(self.queue)

    def _feed(self, data: bytes | bytearray) -> None:
        """Parse ``data`` piece by piece, holding what follows once a request waits behind the current one."""
        self.feeding = True
        pos, n = 0, len(data)
        try:
            while pos < n and not self.closing:
                if self._must_hold():
                    self.inbox += data[pos:]
                    self.deadline = 0.0  # we stopped reading it: its clock restarts when we resume
                    break
                self.parser.feed_data(data[pos:pos + FEED_STEP] if n > FEED_STEP else data)
                pos += FEED_STEP
        except _ParserUpgrade:
            # no upgrades: the request was handed over as plain HTTP; nothing after it is read
            if self.req is not None or self.cur is None:
                self.fail(400, "upgrade not supported")
            else:
                self.cur.keep = False
                self.closing = True
        except _ParserError as exc:
            if not self.closing:
                if "head too large" in str(exc):
                    self.fail(431, "request head too large")
                else:
                    self.fail(400, f"malformed request ({exc})" if str(exc) else "malformed request")
        finally:
            self.feeding = False
        self._update_reading()

    def _feed_inbox(self) -> None:
        """Parse held input now that the current request is done (called when nothing is being fed)."""
        if not self.inbox or self.feeding or self.closing:
            return
        data, self.inbox = bytes(self.inbox), bytearray()
        if self.req is not None:  # its clock stopped while we held its bytes
            self._restart_deadline(self.req)
        self._feed(data)

    def _update_reading(self) -> None:
        """Pause reading while held input or an unread bridged body is over its limit; resume below it."""
        if self.closing:
            return
        want = len(self.inbox) >= self.srv.limits.max_pipeline_bytes or self.buffered > MAX_BUFFERED
        if want and not self.paused_r:
            self.paused_r = True
            self.transport.pause_reading()
            self.deadline = 0.0  # we stopped reading: the client is not late (an app reading slowly is not)
        elif not want and self.paused_r:
            self.paused_r = False
            self.transport.resume_reading()
            if self.req is not None and not self.deadline:  # its clock runs again from now
                self._restart_deadline(self.req)

    def _restart_deadline(self, req: Request) -> None:
        limits = self.srv.limits
        if req.head_done:
            self._arm_deadline(limits.body_timeout, "request body")
        else:
            self._arm_deadline(limits.header_timeout, "request head")

    def _arm_deadline(self, seconds: float, phase: str) -> None:
        self.deadline = self.srv.now + seconds
        self.phase = phase

    def tick(self, now: float, idle_cutoff: float) -> None:
        """The server's clock, once a second: idle keep-alive, head and body deadlines, lingering closes."""
        if self.closing:
            if self.linger_until and now >= self.linger_until:
                self.linger_until = 0.0
                self.transport.abort()  # the client neither read the response nor closed: enough
            return
        if self.idle:
            self.idle_expired(idle_cutoff)
        elif self.deadline and now >= self.deadline:
            self.deadline = 0.0
            self.fail(408, f"{self.phase} not received within {self._limit_for(self.phase):g} s")

    def _limit_for(self, phase: str) -> float:
        limits = self.srv.limits
        return limits.body_timeout if phase == "request body" else limits.header_timeout

    def eof_received(self) -> bool | None:
        if self.closing or self.client is not None:
            return None  # closing anyway, or a parked poll whose client went away: unregister it at once
        if self.cur is None and self.req is None and not self.queue and not self.inbox:
            return None  # idle: close
        if self.cur is None and not self.queue and not self.inbox and self.req is not None:
            self.eof = True
            self.fail(400, "the client closed its side in the middle of a request")  # it can never complete
            return True  # the lingering close ends the connection
        self.eof = True  # half-closed after sending a request: answer what it sent, then close
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.srv.connections.discard(self)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        c = self.client
        if c is not None:
            self.client = None
            self.srv.proto.abandon(c)
        if self.cycle is not None:
            self.cycle.lost()
        self._release_drain()

    def pause_writing(self) -> None:
        self.paused_w = True

    def resume_writing(self) -> None:
        self.paused_w = False
        self._release_drain()
        c = self.client
        if c is not None and self.kind == _STREAM:
            self.woken(c)

    # ------------------------------------------------------------------ parser callbacks
    def on_message_begin(self) -> None:
        self.req = Request()
        self.idle = 0.0
        self._arm_deadline(self.srv.limits.header_timeout, "request head")

    def on_url(self, url: bytes) -> None:
        req = self.req
        if req is None or self.closing:
            return
        req.url += url
        if len(req.url) > self.srv.limits.max_head_size:
            self.fail(431, "request head too large")

    def on_header(self, name: bytes, value: bytes) -> None:
        req = self.req
        if req is None or self.closing:
            return
        req.headers.append((name.lower(), value))
        req.body_size += len(name) + len(value) + 4  # head size until the head is complete
        if req.body_size + len(req.url) > self.srv.limits.max_head_size:
            self.fail(431, "request head too large")

    def on_headers_complete(self) -> None:
        req = self.req
        if req is None or self.closing:
            return
        srv = self.srv
        p = self.parser
        req.body_size = 0
        req.method = p.get_method().decode("ascii", "replace")
        req.version = p.get_http_version()
        req.keep = bool(p.should_keep_alive())
        url = req.url
        if url[:1] != b"/":
            if url == b"*" or _httptools is None:
                raw = url
            else:
                try:
                    parsed = _httptools.parse_url(url)
                except Exception:
                    self.fail(400, "malformed request target")
                    return
                raw = (parsed.path or b"/") + (b"?" + parsed.query if parsed.query else b"")
        else:
            raw = url
        raw, _, _frag = raw.partition(b"#")
        path, _, query = raw.partition(b"?")
        req.raw_path = path
        req.query = query
        try:
            req.path = unquote(path.decode("ascii")) if b"%" in path else path.decode("ascii")
        except UnicodeDecodeError:
            req.path = unquote(path.decode("latin-1"))
        expect = req.header(b"expect")
        if expect is not None:
            if expect.lower() != b"100-continue":
                self.fail(417, "unsupported Expect")
                return
            req.expect_continue = req.version == "1.1"
        req.head_done = True
        self._arm_deadline(srv.limits.body_timeout, "request body")
        te = req.header(b"transfer-encoding")
        req.chunked = te is not None and b"chunked" in te.lower()
        req.bus = srv.native and req.path.startswith(srv.prefix)
        cl = req.header(b"content-length")
        limit = srv.options.max_body_size if req.bus else srv.limits.max_body_size
        if cl is not None and cl.isdigit() and int(cl) > limit:
            req.too_large = True
            if not req.bus:
                req.refused = (413, f"request body too large (limit {limit} bytes)")
        q = self.queue
        if q is None:
            self.queue = [req]
        else:
            q.append(req)
        self._pump()

    def on_body(self, body: bytes) -> None:
        req = self.req
        if req is None or self.closing:
            return
        if req.bus:
            if req.too_large:
                return
            req.body_size += len(body)
            if req.body_size > self.srv.options.max_body_size:
                req.too_large = True
                req.body.clear()
                return
            req.body.append(body)
            return
        if req.cycle is None and req is not self.cur and req.started:
            return  # answered before its body was read: dropped (the connection closes)
        req.body_size += len(body)
        if req.body_size > self.srv.limits.max_body_size:
            self.fail(413, f"request body too large (limit {self.srv.limits.max_body_size} bytes)")
            return
        req.body.append(body)
        self.buffered += len(body)
        if self.buffered > MAX_BUFFERED and not self.paused_r:
            self._update_reading()
        if req.cycle is not None:
            req.cycle.notify()

    def on_message_complete(self) -> None:
        req = self.req
        if req is None or self.closing:
            return
        self.req = None
        req.complete = True
        self.deadline = 0.0
        if req is self.cur:
            if req.bus:
                if not req.started:
                    self._bus(req)
            elif req.cycle is not None:
                req.cycle.notify()
        if self.cur is None and self.req is None and not self.queue:
            self._arm_idle()

    # ------------------------------------------------------------------ request flow
    def _pump(self) -> None:
        """Start queued requests one at a time (a request answered synchronously lets the next one start)."""
        if self.pumping:
            return
        self.pumping = True
        try:
            q = self.queue
            while self.cur is None and q and not self.closing:
                self._start(q.pop(0))
        finally:
            self.pumping = False
        if self.queue is not None and not self.queue:
            self.queue = None

    def _start(self, req: Request) -> None:
        self.cur = req
        if req.refused is not None:
            self.fail(*req.refused)
            return
        if req.bus:
            if req.too_large or req.chunked:
                req.keep = False  # the body is not read: the connection cannot be reused
                self._bus(req)
            elif req.complete:
                self._bus(req)
            elif req.expect_continue:
                self.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            return
        srv = self.srv
        if srv.app is None:
            req.started = True
            self._respond(req, 404, [("content-type", "text/plain")], b"not found")
            return
        cycle = req.cycle = self.cycle = Cycle(self, req)
        req.started = True
        cycle.task = srv.loop.create_task(cycle.run(srv.app, self.scope(req)))

    def _done(self, req: Request, keep: bool) -> None:
        """``req`` is answered: next request, idle wait, or close."""
        if self.cur is req:
            self.cur = None
        req.headers = _EMPTY_HEADERS
        req.body = []
        srv = self.srv
        srv.requests += 1
        if srv.max_requests and srv.requests >= srv.max_requests and srv.on_max_requests is not None:
            cb, srv.on_max_requests = srv.on_max_requests, None
            srv.loop.call_soon(cb)
        if not keep or srv.stopping:
            self._linger_close()
            return
        self.buffered = 0
        self._pump()
        if not self._must_hold():
            self._feed_inbox()  # what was held while this one was answered (the next request's body, too)
        self._update_reading()
        if self.cur is None and self.req is None and not self.queue and not self.inbox and not self.closing:
            if self.eof:
                self._linger_close()
            else:
                self._arm_idle()

    def _arm_idle(self) -> None:
        if not self.idle:
            self.idle = self.srv.now  # no timer per request: the server's 1 s tick closes expired idle ones

    def idle_expired(self, cutoff: float) -> None:
        if self.idle and self.idle <= cutoff and self.cur is None and self.req is None and not self.queue \
                and not self.closing:
            self.closing = True
            self.transport.close()

    def body_taken(self) -> None:
        """The bridge consumed buffered body bytes: reading may resume."""
        self.buffered = 0
        self._update_reading()

    def cycle_done(self, cycle: Cycle, keep: bool) -> None:
        if self.cycle is cycle:
            self.cycle = None
        cycle.req.cycle = None
        if not self.closing:
            self._done(cycle.req, keep)

    def write(self, data: bytes) -> None:
        if not self.transport.is_closing():
            self.transport.write(data)

    async def drain(self) -> None:
        """Wait until the transport accepts more (bridge ``send`` under flow control)."""
        if not self.paused_w or self.transport.is_closing():
            return
        fut = self.drain_fut
        if fut is None:
            fut = self.drain_fut = self.srv.loop.create_future()
        await fut

    def _release_drain(self) -> None:
        fut = self.drain_fut
        if fut is not None:
            self.drain_fut = None
            if not fut.done():
                fut.set_result(None)

    def fail(self, status: int, reason: str) -> None:
        """A request we cannot parse or accept: answer (unless another response is under way) and close."""
        if self.closing:
            return
        self.req = None
        cur, cycle = self.cur, self.cycle
        answer = cur is None or cur.refused is not None or (not cur.started and cycle is None)
        if cycle is not None and not cycle.started:
            answer = True
            cycle.started = True  # the app's own response, if it still sends one, is discarded
            cycle.lost()
        if self.client is not None:  # a parked poll: unregister it
            c, self.client = self.client, None
            self.srv.proto.abandon(c)
            answer = False  # its response head is already out (a stream) or it is mid-wait: just close
        if answer:
            body = reason.encode()
            self.transport.write(b"%scontent-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\n"
                                 b"connection: close\r\n%s\r\n%s" % (self.srv.status_line(status), len(body),
                                                                     self.srv.date, body))
        self._linger_close()

    def _linger_close(self) -> None:
        """Close after the response: shut the write side, drain (discard) input until the client closes or
        ``linger`` passes. Closing with unread input would make the kernel send a reset, which can destroy the
        response before the client reads it."""
        self.closing = True
        self.deadline = 0.0
        self.inbox = bytearray()
        t = self.transport
        if t.is_closing():
            return
        if self.eof:  # the client already closed its side: nothing left to drain
            t.close()
            return
        if self.paused_r:
            self.paused_r = False
            t.resume_reading()
        try:
            if not t.can_write_eof():
                raise OSError("no half-close")
            t.write_eof()
        except (OSError, RuntimeError, NotImplementedError):
            t.close()
            return
        self.linger_until = self.srv.now + self.srv.limits.linger

    def scope(self, req: Request) -> MutableMapping[str, Any]:
        """The ASGI scope of ``req`` (for the bridge, and for the middleware's lookups)."""
        t = self.transport
        scope: dict[str, Any] = {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": req.version,
            "server": t.get_extra_info("sockname"), "client": t.get_extra_info("peername"), "scheme": "http",
            "method": req.method, "root_path": "", "path": req.path, "raw_path": req.raw_path,
            "query_string": req.query, "headers": req.headers,
        }
        if self.srv.state is not None:
            scope["state"] = dict(self.srv.state)
        return scope

    # ------------------------------------------------------------------ message-bus routes (native)
    def _respond(self, req: Request, status: int, headers: list[tuple[str, str]] | None, body: bytes,
                 block: bytes | None = None) -> None:
        srv = self.srv
        keep = req.keep and not srv.stopping
        conn = b"" if keep == (req.version == "1.1") else (b"connection: keep-alive\r\n" if keep
                                                          else b"connection: close\r\n")
        self.transport.write(b"%s%scontent-length: %d\r\n%s%s\r\n%s" % (
            srv.status_line(status), block if block is not None else _enc_headers(headers or []), len(body),
            conn, srv.date, body if req.method != "HEAD" else b""))
        self._done(req, keep)

    def _bus(self, req: Request) -> None:
        req.started = True
        srv = self.srv
        proto = srv.proto
        opts = srv.options
        scope = self.scope(req) if srv.needs_scope else None
        try:
            route = match_route(req.method, req.path, opts)
            if route.kind == "options":
                extra = srv.extra(scope)
                self._respond(req, 200, BASE_HEADERS + extra, b"OK", None if extra else _BASE_BLOCK)
                return
            if route.error is not None:
                raise route.error
            if req.too_large:
                raise ProtocolError(413, f"request body too large (limit {opts.max_body_size} bytes)")
            if req.chunked:  # its chunk sizes are the client's word: bus bodies must declare their length
                raise ProtocolError(411, "message-bus requests must send Content-Length, not a chunked body")
            body = b"".join(req.body) if len(req.body) != 1 else req.body[0]
            ct = req.header(b"content-type")
            ctype = ct.decode("latin-1") if ct is not None else None
            query = req.query.decode("latin-1")
            if route.kind == "broadcast":
                resp = proto.broadcast(form_params(query, body, ctype))
                self._respond(req, resp.status, resp.headers, resp.body)
                return
            channels, seq = parse_body(ctype, body, opts)
            preq = PollRequest(route.client_id, channels, seq, dlp=parse_query_dlp(query) or req.method == "HEAD",
                               dont_chunk=req.header(b"dont-chunk") is not None, http11=req.version == "1.1")
            if scope is not None:
                lk = proto.lookups(srv.lookup(opts.user_id_lookup, scope), srv.lookup(opts.group_ids_lookup, scope),
                                   srv.lookup(opts.site_id_lookup, scope))
                extra = srv.extra(scope)
            else:
                lk = srv.no_lookups
                extra = []
            poll = proto.start_poll(preq, lk, extra, waker=_wake, signal=self)
        except Exception as exc:
            self._bus_error(req, scope, exc)
            return
        if poll.mode == "immediate":
            r = poll.response
            assert r is not None
            self._respond(req, 200, r.headers, r.body, None if extra else _BASE_BLOCK)
            return
        c = poll.client
        assert c is not None
        self.client = c
        req.headers = _EMPTY_HEADERS
        req.body = []
        if poll.mode == "long":
            self.kind = _LONG
            self.head = _enc_headers(poll.headers) if extra else None
            if c.done or c.dropped:
                self.woken(c)
                return
        else:
            self.kind = _STREAM
            first = poll.first_chunk
            pending = proto.stream_chunks(c) if c.pending and not c.done else None
            if pending:
                first += b"".join(pending)
            block = _STREAM_BLOCK if not extra else _enc_headers(poll.headers) + b"transfer-encoding: chunked\r\n"
            keep = b"" if req.keep and not srv.stopping else b"connection: close\r\n"
            self.transport.write(b"%s%s%s%s\r\n%x\r\n%s\r\n" % (srv.status_line(200), block, keep, srv.date,
                                                                len(first), first))
            if c.done or c.dropped:
                self.woken(c)
                return
        self.timer = srv.loop.call_later(opts.long_polling_interval, _expire, self)

    def _bus_error(self, req: Request, scope: Any, exc: Exception) -> None:
        srv = self.srv
        handler = srv.options.on_middleware_error
        if handler is not None:
            try:
                result = srv.lookup(handler, scope if scope is not None else self.scope(req), exc)
            except Exception:
                log.exception("shmbus server: on_middleware_error failed")
                result = None
            if result:
                resp = triple_response(result)
                self._respond(req, resp.status, resp.headers, resp.body)
                return
        if isinstance(exc, ProtocolError):
            resp = exc.response()
            try:
                resp.headers += srv.extra(scope if scope is not None or srv.options.extra_response_headers_lookup
                                          is None else self.scope(req))
            except Exception:
                pass
            if req.too_large:
                req.keep = False
            self._respond(req, resp.status, resp.headers, resp.body)
            return
        log.error("shmbus server: error on %s %s", req.method, req.path, exc_info=exc)
        req.keep = False
        self._respond(req, 500, [("content-type", "text/plain; charset=utf-8")], b"Internal Server Error")

    # ------------------------------------------------------------------ parked polls
    def woken(self, c: Client) -> None:
        """The core has something for ``c`` (or it must end); also after the transport resumes writing."""
        if self.client is not c:
            return
        if c.dropped:
            self._drop(c)
            return
        if self.kind == _LONG:
            if c.done:
                self._end_long(c)
            return
        if c.done:
            self._end_stream(c)
            return
        if not self.paused_w and c.pending:
            chunks = self.srv.proto.stream_chunks(c)
            if chunks:
                data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                self.transport.write(b"%x\r\n%s\r\n" % (len(data), data))

    def expire(self) -> None:
        c = self.client
        if c is None:
            return
        if self.kind == _LONG:
            self._end_long(c)
        else:
            self._end_stream(c)

    def _unpark(self) -> Request | None:
        self.client = None
        self.kind = 0
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        return self.cur

    def _drop(self, c: Client) -> None:
        self._unpark()
        self.srv.proto.abandon(c)
        self.closing = True
        self.transport.abort()

    def _end_long(self, c: Client) -> None:
        req = self._unpark()
        body = self.srv.proto.long_poll_response(c)
        assert req is not None
        head = self.head
        self.head = None
        self._respond(req, 200, None, body, head if head is not None else _BASE_BLOCK)

    def _end_stream(self, c: Client) -> None:
        req = self._unpark()
        end = self.srv.proto.stream_end(c)
        if c.dropped:
            self.closing = True
            self.transport.abort()
            return
        data = b"".join(end)
        self.transport.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data) if data else b"0\r\n\r\n")
        assert req is not None
        self._done(req, req.keep)


class Server:
    """Per-process server state: the wrapped app, the middleware and its protocol engine, limits, the clock."""

    def __init__(self, app: Any, loop: asyncio.AbstractEventLoop, *, options: dict[str, Any] | None = None,
                 keepalive: float = 5.0, max_requests: int = 0, on_max_requests: Callable[[], Any] | None = None,
                 limits: Limits | None = None) -> None:
        self.loop = loop
        self.root_app = app
        mw: MessageBusMiddleware | None = None
        if isinstance(app, MessageBusMiddleware):
            mw = app
            self.app = app.app
        elif options:
            opts = dict(options)
            bus = opts.pop("bus", None)
            if isinstance(bus, str):
                from shmbus import Bus

                bus = Bus(bus)
            mw = MessageBusMiddleware(app, bus=bus, **opts)
            self.app = app
        else:
            self.app = app
        self.mw = mw
        self.native = False
        if mw is not None:
            o = mw.options
            lookups = (o.user_id_lookup, o.group_ids_lookup, o.site_id_lookup, o.extra_response_headers_lookup,
                       o.on_middleware_error)
            if any(f is not None and _is_async(f) for f in lookups):
                log.warning("shmbus server: async lookups: message-bus requests go through the ASGI bridge")
                self.app = mw  # the middleware's own (coroutine) path for everything
            else:
                self.native = True
            self.options = o
            self.prefix = o.prefix
            self.needs_scope = any(f is not None for f in lookups)
        else:
            from .protocol import Options

            self.options = Options()
            self.prefix = "\x00"
            self.needs_scope = False
        from .protocol import Lookups

        self.no_lookups = Lookups()
        self._proto: MessageBusProtocol | None = None
        self.keepalive = keepalive
        self.max_requests = max_requests
        self.on_max_requests = on_max_requests
        self.limits = limits or Limits()
        self.connections: set[HttpConnection] = set()
        self.requests = 0
        self.stopping = False
        self.state: dict[str, Any] | None = None
        self._status: dict[int, bytes] = {}
        self.date = b""
        self.now = loop.time()
        self._lifespan: _Lifespan | None = None
        self._tick()

    @property
    def proto(self) -> MessageBusProtocol:
        p = self._proto
        if p is None:
            assert self.mw is not None
            p = self._proto = self.mw.protocol()  # this loop's engine (and the bus tap) of the middleware
        return p

    def _tick(self) -> None:
        """Every second: the Date header, the coarse clock, and closing keep-alive connections idle too long."""
        self.date = b"date: %s\r\n" % formatdate(usegmt=True).encode()
        self.now = now = self.loop.time()
        cutoff = now - self.keepalive
        for conn in list(self.connections):
            conn.tick(now, cutoff)
        if not self.loop.is_closed():
            self.loop.call_at(now + 1.0, self._tick)

    def status_line(self, code: int) -> bytes:
        b = self._status.get(code)
        if b is None:
            try:
                phrase = HTTPStatus(code).phrase
            except ValueError:
                phrase = "Unknown"
            b = self._status[code] = b"HTTP/1.1 %d %s\r\n" % (code, phrase.encode())
        return b

    @staticmethod
    def lookup(fn: Callable[..., Any] | None, *args: Any) -> Any:
        if fn is None:
            return None
        v = fn(*args)
        if inspect.isawaitable(v):
            if inspect.iscoroutine(v):
                v.close()
            raise TypeError("a lookup returned an awaitable on the native path (declare it 'async def')")
        return v

    def extra(self, scope: Any) -> list[tuple[str, str]]:
        """``extra_response_headers_lookup``'s headers; a name or value with CR, LF or NUL is dropped (logged)."""
        fn = self.options.extra_response_headers_lookup
        if fn is None:
            return []
        out = MessageBusProtocol.extra_headers(self.lookup(fn, scope))
        for k, v in out:
            if _BAD_HEADER.search(k) or _BAD_HEADER.search(v):
                log.error("shmbus server: dropping response header %r with CR/LF/NUL", k)
                return [(k, v) for k, v in out if not _BAD_HEADER.search(k) and not _BAD_HEADER.search(v)]
        return out

    def protocol_factory(self) -> HttpConnection:
        return HttpConnection(self)

    # ------------------------------------------------------------------ lifecycle
    async def startup(self) -> None:
        """Run the app's lifespan startup (if it speaks lifespan) and create this loop's protocol engine."""
        if self.mw is not None and self.native:
            _ = self.proto
        if self.root_app is not None:
            self._lifespan = _Lifespan(self.root_app)
            self.state = await self._lifespan.startup()

    async def shutdown(self, timeout: float = 5.0) -> None:
        """Graceful: end parked polls now (clients re-poll elsewhere), close idle connections, wait for
        in-flight ASGI responses up to ``timeout`` seconds, then close everything."""
        self.stopping = True
        for conn in list(self.connections):
            if conn.client is not None:
                conn.expire()
            elif conn.cur is None and conn.req is None and not conn.closing:
                conn.closing = True
                conn.transport.close()
        deadline = time.monotonic() + timeout
        while any(c.cycle is not None for c in self.connections) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for conn in list(self.connections):
            if conn.cycle is not None and conn.cycle.task is not None:
                conn.cycle.task.cancel()
            conn.closing = True
            conn.transport.close()
        if self._lifespan is not None:
            await self._lifespan.shutdown()
        await asyncio.sleep(0)


def _is_async(fn: Any) -> bool:
    call = type(fn).__call__ if not inspect.isfunction(fn) and not inspect.ismethod(fn) else None
    return inspect.iscoroutinefunction(fn) or (call is not None and inspect.iscoroutinefunction(call))


class _Lifespan:
    """ASGI lifespan for the wrapped app: optional (an app that raises on it is taken not to support it)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None
        self.supported = True
        self.state: dict[str, Any] = {}

    async def _run(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": self.state}
        try:
            await self.app(scope, self.queue.get, self._send)
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError):
                raise
            self.supported = False
            log.debug("shmbus server: lifespan not supported by the app (%r)", exc)
        finally:
            self.events.put_nowait({"type": "_ended"})

    async def _send(self, message: dict[str, Any]) -> None:
        self.events.put_nowait(message)

    async def startup(self) -> dict[str, Any] | None:
        self.task = asyncio.get_running_loop().create_task(self._run())
        await self.queue.put({"type": "lifespan.startup"})
        ev = await self.events.get()
        if ev["type"] == "lifespan.startup.failed":
            raise RuntimeError(f"ASGI lifespan startup failed: {ev.get('message', '')}")
        if ev["type"] != "lifespan.startup.complete":
            self.supported = False
            return None
        return self.state

    async def shutdown(self) -> None:
        if not self.supported or self.task is None or self.task.done():
            return
        await self.queue.put({"type": "lifespan.shutdown"})
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.events.get(), 5.0)


# ---------------------------------------------------------------------------------------------------- serving
async def serve(app: Any, sockets: Sequence[socket.socket], *, options: dict[str, Any] | None = None,
                keepalive: float = 5.0, max_requests: int = 0, graceful_timeout: float = 5.0,
                stop: asyncio.Event | None = None, heartbeat: Callable[[], Any] | None = None,
                heartbeat_interval: float = 1.0, backlog: int = 2048, limits: Limits | None = None) -> None:
    """Serve ``app`` on already-bound listening ``sockets`` until ``stop`` is set (or ``max_requests``)."""
    loop = asyncio.get_running_loop()
    stop = stop or asyncio.Event()
    srv = Server(app, loop, options=options, keepalive=keepalive, max_requests=max_requests,
                 on_max_requests=stop.set, limits=limits)
    await srv.startup()
    servers = [await loop.create_server(srv.protocol_factory, sock=s, backlog=backlog) for s in sockets]
    try:
        while not stop.is_set():
            if heartbeat is not None:
                heartbeat()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), heartbeat_interval)
    finally:
        for s in servers:
            s.close()
        await srv.shutdown(graceful_timeout)
        if srv.mw is not None:
            srv.mw.close()


def gunicorn_config_value(worker: Any, name: str) -> Any:
    """A shmbus setting (``shmbus_options``, ``shmbus_server``) from the worker's gunicorn config file, or None.

    gunicorn refuses unknown settings on its command line but keeps a config file's other names to itself; this
    reads them back (a ``python:module`` config too).
    """
    path = getattr(worker.cfg, "config", None)
    if not path:
        return None
    try:
        if path.startswith("python:"):
            ns = vars(importlib.import_module(path[len("python:"):]))
        elif not os.path.exists(path):
            return None  # gunicorn's default ./gunicorn.conf.py, absent
        else:
            ns = worker.app.get_config_from_filename(path)
    except Exception:
        log.exception("shmbus server: could not read %s from %s", name, path)
        return None
    return ns.get(name)


def _gunicorn_base() -> Any:
    try:
        from gunicorn.workers.base import Worker
    except ImportError:  # pragma: no cover - gunicorn is in the web extra
        return object
    return Worker


class GunicornWorker(_gunicorn_base()):  # type: ignore[misc]
    """``gunicorn -k shmbus.adapters.server.GunicornWorker``: one asyncio loop per worker, no task per poll.

    SIGTERM: graceful (stop accepting, end parked polls, wait up to ``graceful_timeout`` for other responses);
    SIGQUIT/SIGINT: quick. ``max_requests`` (+ jitter) is honoured; heartbeats every second. Options for a
    plain ASGI app come from ``shmbus_options`` in the gunicorn config file (``-c``).
    """

    def init_signals(self) -> None:
        # gunicorn's handlers would run on the loop thread between callbacks anyway; the loop's are precise
        for s in self.SIGNALS:
            signal.signal(s, signal.SIG_DFL)
        signal.signal(signal.SIGUSR1, self.handle_usr1)
        signal.siginterrupt(signal.SIGUSR1, False)

    def _shmbus_options(self) -> dict[str, Any] | None:
        opts = gunicorn_config_value(self, "shmbus_options")
        return dict(opts) if opts else None

    def _limits(self) -> Limits:
        """``shmbus_server = {"header_timeout": 10, ...}`` in the gunicorn config file (see :class:`Limits`)."""
        return Limits.from_mapping(gunicorn_config_value(self, "shmbus_server"))

    def run(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        stop = asyncio.Event()
        self._stop = stop
        self._graceful = True

        def quick() -> None:
            self._graceful = False
            self.alive = False
            stop.set()

        def graceful() -> None:
            self.alive = False
            stop.set()

        loop.add_signal_handler(signal.SIGTERM, graceful)
        loop.add_signal_handler(signal.SIGQUIT, quick)
        loop.add_signal_handler(signal.SIGINT, quick)
        loop.add_signal_handler(signal.SIGABRT, quick)

        def beat() -> None:
            self.notify()
            if self.ppid != os.getppid():
                log.info("shmbus server: parent changed, shutting down")
                graceful()

        socks = [s.sock if hasattr(s, "sock") else s for s in self.sockets]
        try:
            loop.run_until_complete(serve(
                self.wsgi, socks, options=self._shmbus_options(), keepalive=float(self.cfg.keepalive or 2),
                max_requests=int(self.max_requests or 0) if self.cfg.max_requests else 0,
                graceful_timeout=float(self.cfg.graceful_timeout), stop=stop, heartbeat=beat,
                heartbeat_interval=min(1.0, max(self.timeout / 4, 0.1)) if self.timeout else 1.0,
                backlog=int(self.cfg.backlog), limits=self._limits()))
        except Exception:
            log.exception("shmbus server: worker failed")
            sys.exit(1)
        finally:
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
            for sig in (signal.SIGTERM, signal.SIGQUIT, signal.SIGINT, signal.SIGABRT):
                loop.remove_signal_handler(sig)  # a late signal must not hit the closed loop's wakeup fd
                signal.signal(sig, signal.SIG_IGN)  # exiting anyway
            loop.close()


# ---------------------------------------------------------------------------------------------------- CLI
def _import_app(spec: str) -> Any:
    mod, _, attr = spec.partition(":")
    obj: Any = importlib.import_module(mod)
    for part in (attr or "app").split("."):
        obj = getattr(obj, part)
    return obj


def _bind(addr: str, backlog: int) -> socket.socket:
    host, _, port = addr.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.bind((host, int(port)))
    s.listen(backlog)
    s.set_inheritable(True)
    return s


def _child(spec: str, sock: socket.socket, args: argparse.Namespace) -> int:
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):
        signal.signal(s, signal.SIG_DFL)
    app = _import_app(spec)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    parent = os.getppid()

    def beat() -> None:
        if os.getppid() != parent:
            stop.set()

    options = None
    if args.options:
        import json

        options = json.loads(args.options)
    try:
        loop.run_until_complete(serve(app, [sock], options=options, keepalive=args.keepalive,
                                      max_requests=args.max_requests, graceful_timeout=args.graceful_timeout,
                                      stop=stop, heartbeat=beat, backlog=args.backlog, limits=args.limits))
    finally:
        loop.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m shmbus.adapters.server module:app --bind HOST:PORT --workers N``."""
    ap = argparse.ArgumentParser(prog="python -m shmbus.adapters.server", description=__doc__.split("\n")[0])
    ap.add_argument("app", help="module:attribute of the ASGI app (or MessageBusMiddleware)")
    ap.add_argument("--bind", "-b", default="127.0.0.1:8000")
    ap.add_argument("--workers", "-w", type=int, default=1)
    ap.add_argument("--keepalive", type=float, default=5.0)
    ap.add_argument("--max-requests", type=int, default=0)
    ap.add_argument("--graceful-timeout", type=float, default=5.0)
    ap.add_argument("--backlog", type=int, default=2048)
    ap.add_argument("--options", default="", help="JSON middleware options for a plain ASGI app ({'bus': name,...})")
    defaults = Limits()
    for f in fields(Limits):
        ap.add_argument(f"--{f.name.replace('_', '-')}", type=type(getattr(defaults, f.name)), dest=f.name,
                        default=getattr(defaults, f.name),
                        help=f"server limit (default {getattr(defaults, f.name)}; see shmbus.adapters.server.Limits)")
    args = ap.parse_args(argv)
    args.limits = Limits(**{f.name: getattr(args, f.name) for f in fields(Limits)})
    logging.basicConfig(level=logging.INFO, format="[%(process)d] %(levelname)s %(name)s: %(message)s")
    sys.path.insert(0, os.getcwd())
    sock = _bind(args.bind, args.backlog)
    kids: dict[int, int] = {}
    stopping = False

    def spawn() -> None:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _child(args.app, sock, args)
            except BaseException:
                log.exception("shmbus server: worker failed")
            finally:
                os._exit(code)
        kids[pid] = pid

    def stop(signum: int, _frame: Any) -> None:
        nonlocal stopping
        stopping = True
        for pid in list(kids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log.info("shmbus server: listening on %s (%d workers, %s parser)", args.bind, args.workers, PARSER)
    for _ in range(args.workers):
        spawn()
    while kids:
        try:
            pid, status = os.wait()
        except InterruptedError:
            continue
        except ChildProcessError:
            break
        kids.pop(pid, None)
        if not stopping:
            log.warning("shmbus server: worker %d exited (%d); restarting", pid, status)
            time.sleep(0.1)
            spawn()
    sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
