"""A request being read (:class:`Request`) and the parser callbacks that fill it, for the lean server's
connections (httptools and the pure parser call the same ``on_*`` methods)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING
from urllib.parse import unquote

from .limits import MAX_BUFFERED
from .parser import httptools
from .state import ConnectionState

if TYPE_CHECKING:
    from .asgi_bridge import Cycle


class Request:
    """One parsed request (head, buffered body) while it is read and answered; released when answered."""

    __slots__ = (
        "body",
        "body_size",
        "bus",
        "chunked",
        "complete",
        "cycle",
        "expect_continue",
        "head_done",
        "headers",
        "keep",
        "method",
        "path",
        "query",
        "raw_path",
        "refused",
        "started",
        "too_large",
        "url",
        "version",
    )

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


class ParserCallbacks(ConnectionState):
    """The part of :class:`~.connection.HttpConnection` the parser calls: it builds :class:`Request` objects,
    checks head and body limits as bytes arrive, and queues complete heads for the connection to answer."""

    __slots__ = ()

    # provided by the connection
    _arm_deadline: Callable[[float, str], None]
    _arm_idle: Callable[[], None]
    _bus: Callable[[Request], None]
    _pump: Callable[[], None]
    _update_reading: Callable[[], None]
    fail: Callable[[int, str], None]

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
            if url == b"*" or httptools is None:
                raw = url
            else:
                try:
                    parsed = httptools.parse_url(url)
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
