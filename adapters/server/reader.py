"""The parser's side of a connection (:class:`RequestReader`): it turns parser callbacks into :class:`Request`
objects, checks head and body limits as bytes arrive, and tells its connection what happened.

Why an object of its own: httptools and the pure parser call ``on_*`` methods on one object; keeping them here
(not on the connection) gives the connection a few events instead (:class:`ReaderOwner`) and lets the callbacks
be driven one by one in tests.
"""

from __future__ import annotations

from typing import Protocol
from urllib.parse import unquote

from .parser import Parser, ParserError, ParserUpgrade, httptools
from .request import Request
from .server import Server

__all__ = ["ReaderOwner", "RequestReader"]


class ReaderOwner(Protocol):
    """What the reader tells its connection (and the one thing it asks: is the connection closing?)."""

    @property
    def closing(self) -> bool: ...

    def message_begun(self) -> None:
        """A request's first byte: the connection is busy, the head's deadline runs."""

    def head_ready(self, req: Request) -> None:
        """A complete head: the body's deadline runs; the request waits its turn to be answered."""

    def upgraded(self) -> None:
        """The parser met an upgrade request (not supported): refuse it, or close after the one being answered."""

    def body_buffered(self, req: Request, nbytes: int) -> None:
        """``nbytes`` of a bridged request's body were buffered for the app."""

    def message_complete(self, req: Request) -> None:
        """The whole request was read."""

    def fail(self, status: int, reason: str) -> None:
        """Refuse the request being read: answer ``status`` and close (the reader's ``req`` is dropped)."""


class RequestReader:
    """The parser callbacks of one connection; ``req`` is the request being read (None between requests)."""

    __slots__ = ("owner", "parser", "req", "srv")

    def __init__(self, srv: Server, owner: ReaderOwner) -> None:
        self.srv = srv
        self.owner = owner
        self.req: Request | None = None
        self.parser = Parser(self)

    def feed(self, data: bytes | bytearray) -> bool:
        """Parse ``data``; false when the connection cannot go on (a malformed request or an upgrade)."""
        try:
            self.parser.feed_data(data)
        except ParserUpgrade:
            self.owner.upgraded()
            return False
        except ParserError as exc:
            if not self.owner.closing:
                if "head too large" in str(exc):
                    self.owner.fail(431, "request head too large")
                else:
                    self.owner.fail(400, f"malformed request ({exc})" if str(exc) else "malformed request")
            return False
        return True

    def on_message_begin(self) -> None:
        self.req = Request()
        self.owner.message_begun()

    def on_url(self, url: bytes) -> None:
        req = self.req
        if req is None or self.owner.closing:
            return
        req.url += url
        if len(req.url) > self.srv.limits.max_head_size:
            self.owner.fail(431, "request head too large")

    def on_header(self, name: bytes, value: bytes) -> None:
        req = self.req
        if req is None or self.owner.closing:
            return
        req.headers.append((name.lower(), value))
        req.body_size += len(name) + len(value) + 4  # head size until the head is complete
        if req.body_size + len(req.url) > self.srv.limits.max_head_size:
            self.owner.fail(431, "request head too large")

    def on_headers_complete(self) -> None:
        req = self.req
        if req is None or self.owner.closing:
            return
        srv = self.srv
        p = self.parser
        req.body_size = 0
        req.method = p.get_method().decode("ascii", "replace")
        req.version = p.get_http_version()
        req.keep = bool(p.should_keep_alive())
        if not self._target(req):
            return
        expect = req.header(b"expect")
        if expect is not None:
            if expect.lower() != b"100-continue":
                self.owner.fail(417, "unsupported Expect")
                return
            req.expect_continue = req.version == "1.1"
        req.head_done = True
        te = req.header(b"transfer-encoding")
        req.chunked = te is not None and b"chunked" in te.lower()
        req.bus = srv.native and req.path.startswith(srv.prefix)
        cl = req.header(b"content-length")
        limit = srv.options.max_body_size if req.bus else srv.limits.max_body_size
        if cl is not None and cl.isdigit() and int(cl) > limit:
            req.too_large = True
            if not req.bus:
                req.refused = (413, f"request body too large (limit {limit} bytes)")
        self.owner.head_ready(req)

    def _target(self, req: Request) -> bool:
        """Split the request target into path and query (an absolute-form target keeps only its path)."""
        url = req.url
        if url[:1] != b"/" and url != b"*" and httptools is not None:
            try:
                parsed = httptools.parse_url(url)
            except Exception:
                self.owner.fail(400, "malformed request target")
                return False
            url = (parsed.path or b"/") + (b"?" + parsed.query if parsed.query else b"")
        raw, _, _frag = url.partition(b"#")
        path, _, query = raw.partition(b"?")
        req.raw_path = path
        req.query = query
        try:
            req.path = unquote(path.decode("ascii")) if b"%" in path else path.decode("ascii")
        except UnicodeDecodeError:
            req.path = unquote(path.decode("latin-1"))
        return True

    def on_body(self, body: bytes) -> None:
        req = self.req
        if req is None or self.owner.closing:
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
        if req.answered:
            return  # answered before its body was read: dropped (the connection closes)
        req.body_size += len(body)
        limit = self.srv.limits.max_body_size
        if req.body_size > limit:
            self.owner.fail(413, f"request body too large (limit {limit} bytes)")
            return
        req.body.append(body)
        self.owner.body_buffered(req, len(body))

    def on_message_complete(self) -> None:
        req = self.req
        if req is None or self.owner.closing:
            return
        self.req = None
        req.complete = True
        self.owner.message_complete(req)
