"""The ASGI http bridge of :mod:`shmbus.adapters.server`: runs a wrapped ASGI app for every non-bus request.

Why minimal: the server exists to make parked message-bus polls cheap; other routes only need a correct
ASGI 3 ``http`` cycle: the request body streamed through ``receive()`` (``100 Continue`` sent on the first
read), ``http.response.start``/``http.response.body`` written as they come, chunked framing when the app gives
no ``content-length`` (HTTP/1.1; HTTP/1.0 is delimited by closing), HEAD without a body, keep-alive, write
flow control (``send`` waits while the transport is paused) and ``http.disconnect`` when the client leaves or
the response is complete. One cycle per connection runs at a time (pipelined requests wait their turn).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import MutableMapping
from typing import Any, Protocol

from ..probe import PROBE
from .request import Request
from .server import Server

log = logging.getLogger("shmbus.adapters.server")

_NO_BODY_STATUS = frozenset({204, 304})
_DISCONNECT = {"type": "http.disconnect"}


class ResponsePhase(enum.Enum):
    """Where the app's response is: nothing sent yet, head sent (body under way), or complete."""

    NOT_STARTED = "not started"
    STARTED = "started"
    FINISHED = "finished"


class BridgeConnection(Protocol):
    """What a cycle needs from its connection: write, wait while writing is paused, report progress."""

    @property
    def srv(self) -> Server: ...

    def write_paused(self) -> bool:
        """The open transport is over its high-water mark: ``send`` waits for :meth:`Cycle.writable`."""

    def write(self, data: bytes) -> None: ...

    def body_taken(self) -> None:
        """The app took the buffered body: reading may resume."""

    def cycle_done(self, cycle: Cycle, keep: bool) -> None:
        """The response is complete; ``keep``: the connection may serve the next request."""


class Cycle:
    """One request/response handled by the wrapped ASGI app."""

    __slots__ = (
        "body_done",
        "chunked",
        "conn",
        "continue_sent",
        "drain_fut",
        "gone",
        "head",
        "head_only",
        "keep",
        "left",
        "phase",
        "req",
        "started",
        "task",
        "waiter",
    )

    def __init__(self, conn: BridgeConnection, req: Request) -> None:
        self.conn = conn
        self.req = req
        self.phase = ResponsePhase.NOT_STARTED
        self.gone = False
        self.body_done = False
        self.continue_sent = False
        self.chunked = False
        self.head_only = req.method == "HEAD"
        self.keep = req.keep
        self.left: int | None = None
        self.head = b""
        self.waiter: asyncio.Future[None] | None = None
        self.task: asyncio.Task[None] | None = None
        self.drain_fut: asyncio.Future[None] | None = None  # ``send`` waits on it while writing is paused
        self.started = time.perf_counter() if PROBE is not None else 0.0

    # ------------------------------------------------------------------ driven by the connection
    def notify(self) -> None:
        """More body, the end of the body, or a disconnect: wake a pending ``receive()``."""
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    def lost(self) -> None:
        self.gone = True
        self.notify()
        self.writable()

    def writable(self) -> None:
        """The transport takes more again (or is gone): a ``send`` waiting under flow control goes on."""
        fut = self.drain_fut
        if fut is not None:
            self.drain_fut = None
            if not fut.done():
                fut.set_result(None)

    async def run(self, app: Any, scope: MutableMapping[str, Any]) -> None:
        try:
            await app(scope, self.receive, self.send)
        except BaseException as exc:
            if not isinstance(exc, asyncio.CancelledError):
                log.exception("shmbus server: ASGI app raised on %s %s", self.req.method, self.req.path)
            if self.phase is ResponsePhase.NOT_STARTED and not self.gone:
                self.phase = ResponsePhase.STARTED
                self.keep = False
                self.conn.write(self.conn.srv.error_response(500, "Internal Server Error"))
                self.finish()
            elif self.phase is not ResponsePhase.FINISHED:
                self.keep = False
                self.finish()
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        if self.phase is not ResponsePhase.FINISHED:
            if self.phase is ResponsePhase.NOT_STARTED and not self.gone:
                log.error(
                    "shmbus server: ASGI app returned without a response on %s %s", self.req.method, self.req.path
                )
                self.phase = ResponsePhase.STARTED
                self.conn.write(
                    b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\nconnection: close\r\n"
                    b"%s\r\n" % self.conn.srv.date
                )
            self.keep = False
            self.finish()

    def finish(self) -> None:
        if self.phase is ResponsePhase.FINISHED:
            return
        self.phase = ResponsePhase.FINISHED
        if PROBE is not None:
            PROBE.note("request", time.perf_counter() - self.started)
        self.notify()
        self.conn.cycle_done(self, self.keep and self.req.complete and not self.gone)

    # ------------------------------------------------------------------ ASGI callables
    async def receive(self) -> MutableMapping[str, Any]:
        req = self.req
        conn = self.conn
        while True:
            if self.gone or self.phase is ResponsePhase.FINISHED:
                return _DISCONNECT
            if not self.body_done and (req.body or req.complete):
                parts = req.body
                body = parts[0] if len(parts) == 1 else b"".join(parts)
                parts.clear()
                conn.body_taken()
                more = not req.complete
                if not more:
                    self.body_done = True
                return {"type": "http.request", "body": body, "more_body": more}
            if req.expect_continue and not self.continue_sent and self.phase is ResponsePhase.NOT_STARTED:
                self.continue_sent = True
                conn.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            loop = asyncio.get_running_loop()
            self.waiter = loop.create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None

    async def send(self, message: MutableMapping[str, Any]) -> None:
        t = message["type"]
        if self.phase is ResponsePhase.FINISHED:
            if t == "http.response.body" and not message.get("more_body", False) and not message.get("body"):
                return
            raise RuntimeError(f"ASGI message {t!r} after the response completed")
        if self.gone:
            return  # the client left, or the server answered for the app (a 408): it learns so from receive()
        if self.phase is ResponsePhase.NOT_STARTED:
            if t != "http.response.start":
                raise RuntimeError(f"expected 'http.response.start', got {t!r}")
            self._start(message)
            return
        if t != "http.response.body":
            raise RuntimeError(f"expected 'http.response.body', got {t!r}")
        body = message.get("body", b"")
        more = bool(message.get("more_body", False))
        if self.head_only:
            body = b""
        elif self.left is not None:
            if len(body) > self.left:
                raise RuntimeError("response body longer than its content-length")
            self.left -= len(body)
        if self.chunked:
            data = b"%x\r\n%s\r\n" % (len(body), body) if body else b""
            if not more:
                data += b"0\r\n\r\n"
        else:
            data = body
        if self.head:
            data = self.head + data
            self.head = b""
        if data:
            self.conn.write(data)
        if not more:
            if self.left:  # shorter than announced: the connection cannot be reused
                self.keep = False
            self.finish()
        elif not self.gone and self.conn.write_paused():
            if self.drain_fut is None:
                self.drain_fut = asyncio.get_running_loop().create_future()
            await self.drain_fut

    def _start(self, message: MutableMapping[str, Any]) -> None:
        srv = self.conn.srv
        status = int(message["status"])
        out = [srv.status_line(status)]
        length: int | None = None
        for name, value in message.get("headers") or ():
            if b"\r" in name or b"\n" in name or b"\r" in value or b"\n" in value or b"\x00" in value:
                raise RuntimeError(f"invalid character in response header {bytes(name)!r}")
            low = bytes(name).lower()
            if low == b"content-length":
                length = int(value)
            elif low == b"transfer-encoding":
                continue  # the server frames the body itself
            elif low == b"connection":
                if b"close" in bytes(value).lower():
                    self.keep = False
                continue
            elif low == b"date":
                continue
            out.append(b"%s: %s\r\n" % (bytes(name), bytes(value)))
        bodyless = self.head_only or status in _NO_BODY_STATUS or status < 200
        if length is not None:
            out.append(b"content-length: %d\r\n" % length)
            if not bodyless:
                self.left = length
        elif not bodyless:
            if self.req.version == "1.1":
                self.chunked = True
                out.append(b"transfer-encoding: chunked\r\n")
            else:
                self.keep = False  # HTTP/1.0 without a length: the end of the body is the close
        if srv.stopping:
            self.keep = False
        if not self.keep:
            out.append(b"connection: close\r\n")
        elif self.req.version == "1.0":
            out.append(b"connection: keep-alive\r\n")
        out.append(srv.date)
        out.append(b"\r\n")
        self.phase = ResponsePhase.STARTED
        self.head = b"".join(out)
