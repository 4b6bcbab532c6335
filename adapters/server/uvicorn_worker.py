"""uvicorn with the request-head and body deadlines it lacks.

Use: ``gunicorn -k shmbus.adapters.server.uvicorn_worker.UvicornWorker -c conf.py app:app``.

Why: uvicorn (0.2x-0.5x) times out only idle keep-alive connections. A client that sends half a request head, or a
body that never ends (a chunk size of ``ffffffffffffffff``), holds its connection and its request task forever;
500 such connections are a cheap denial of service. This worker runs uvicorn with :class:`GuardedHttpToolsProtocol`,
which answers ``408`` and closes when a head is not complete within ``header_timeout`` or a body within
``body_timeout``, and caps open connections per worker at ``max_connections`` (uvicorn's ``limit_concurrency``:
``503`` beyond it), and refuses a WebSocket frame over ``max_ws_frame`` (64 KiB) with close code 1009 as soon
as its length is read (uvicorn's ``ws_max_size``, 16 MiB by default). Limits come from ``shmbus_server = {...}``
in the gunicorn config file, with the names and defaults of :class:`shmbus.adapters.server.Limits`: pipelined
input is held to ``max_pipeline_bytes`` while requests are queued (uvicorn itself resumes reading after every
response, so a pipelining client could queue requests without bound). Body size limits on message-bus routes are
the middleware's (``max_body_size``, ``411`` for chunked bodies).

Plain ``uvicorn`` can use the protocol too (default limits):
``uvicorn app:app --http shmbus.adapters.server.uvicorn_worker:GuardedHttpToolsProtocol --ws-max-size 65536``.
Needs ``httptools`` (in the ``web`` extra).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.workers import UvicornWorker as _UvicornWorker

from .limits import FEED_STEP, Limits, gunicorn_config_value

__all__ = ["GuardedHttpToolsProtocol", "UvicornWorker"]


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol plus head and body deadlines (``408``, then a lingering close)."""

    limits = Limits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._guard: asyncio.TimerHandle | None = None
        self._phase_open = False  # between a request's first byte and its last
        self._lingering = False
        self._eof = False
        self._held = bytearray()  # pipelined input not parsed yet (see _feed)

    def _arm(self, seconds: float, phase: str) -> None:
        self._disarm()
        self._guard = self.loop.call_later(seconds, self._expired, phase, seconds)

    def _disarm(self) -> None:
        if self._guard is not None:
            self._guard.cancel()
            self._guard = None

    def _expired(self, phase: str, seconds: float) -> None:
        self._guard = None
        transport = self.transport
        if transport is None or transport.is_closing() or self._lingering:
            return
        if self.flow is not None and self.flow.read_paused:
            # We are not reading (an app consuming its body slowly, or requests queued): the client is not
            # late. Its clock starts again.
            self._arm(seconds, phase)
            return
        cycle = self.cycle  # on a kept-alive connection: the previous request's, possibly long complete
        if cycle is None or cycle.response_complete or not cycle.response_started:
            body = f"{phase} not received within {seconds:g} s".encode()
            transport.write(
                b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
                b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
            )
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # the app's receive() sees http.disconnect; its response is discarded
            cycle.message_event.set()
        self._linger_close()

    def _linger_close(self) -> None:
        """Half-close and drain input for ``linger`` s, so the client reads the 408 instead of a reset."""
        self._lingering = True
        transport = self.transport
        try:
            if self.flow is not None:
                self.flow.resume_reading()
            transport.write_eof()
        except (OSError, RuntimeError, NotImplementedError):
            transport.close()
            return
        self.loop.call_later(self.limits.linger, transport.close)

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return  # drained and discarded
        if self._held or self.pipeline:
            self._hold(data)
            return
        self._feed(data)

    def _feed(self, data: bytes) -> None:
        """Parse in small steps and stop once a request waits behind the one being answered. uvicorn parses
        whole reads and resumes reading after every response even while requests are queued, so a client
        that pipelines faster than it is answered grows the queue without bound (measured: 585 MB of RSS for
        1 GB offered on one connection)."""
        pos, n = 0, len(data)
        while pos < n:
            if self.pipeline:
                self._hold(data[pos:])
                return
            super().data_received(data[pos : pos + FEED_STEP] if n > FEED_STEP else data)
            pos += FEED_STEP
            if self.transport is None or self.transport.is_closing() or self._lingering:
                return

    def _hold(self, data: bytes) -> None:
        self._held += data
        if len(self._held) >= self.limits.max_pipeline_bytes:
            self.flow.pause_reading()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._held and not self.pipeline and not self._lingering:
            data, self._held = bytes(self._held), bytearray()
            self._feed(data)
        if self.pipeline or len(self._held) >= self.limits.max_pipeline_bytes:
            self.flow.pause_reading()  # uvicorn just resumed reading although requests are still queued
        self._close_after_eof()

    def eof_received(self) -> bool | None:  # type: ignore[override]
        """The client half-closed. A request cut short gets ``400`` (uvicorn closed it silently); one whose
        response has not started is answered before the close (uvicorn dropped its response); a streaming
        response ends (the client is gone)."""
        if self._lingering:
            return None
        if self._guard is not None and self._phase_open:
            self._disarm()
            body = b"the client closed its side in the middle of a request"
            self.transport.write(
                b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\n"
                b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
            )
            if self.cycle is not None:
                self.cycle.disconnected = True
                self.cycle.message_event.set()
            return None
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete and not cycle.response_started:
            self._eof = True
            return True  # keep the write side: close once the response is out (on_response_complete)
        # Nothing to answer, or a response already streaming (a message-bus stream): a client that closed while
        # a stream runs is gone. Closing now tells the app (http.disconnect), which unregisters the poll at once;
        # keeping the connection would hold it, and keep writing to it, until long_polling_interval.
        return None

    def _close_after_eof(self) -> None:
        if (
            self._eof
            and not self.pipeline
            and not self._held
            and self.transport is not None
            and not self.transport.is_closing()
        ):
            self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._phase_open = True
        self._arm(self.limits.header_timeout, "request head")

    def on_headers_complete(self) -> None:
        self._arm(self.limits.body_timeout, "request body")
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._phase_open = False
        self._disarm()
        super().on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


class UvicornWorker(_UvicornWorker):
    """gunicorn's uvicorn worker with :class:`GuardedHttpToolsProtocol` and ``limit_concurrency``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        limits = Limits.from_mapping(gunicorn_config_value(self, "shmbus_server"))
        self.config.http = type("ConfiguredGuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,), {"limits": limits})
        self.config.limit_concurrency = limits.max_connections
        # uvicorn checks ws_max_size when it reads a frame's length; its 16 MiB default let a client make a worker
        # buffer 16 MiB per frame before the app's 64 KiB max_frame could refuse it
        self.config.ws_max_size = limits.max_ws_frame
        # uvicorn waits for every open request on shutdown, parked 25 s polls included, and gunicorn kills the
        # worker at graceful_timeout ("Perhaps out of memory?"): cancel them a second before that instead.
        self.config.timeout_graceful_shutdown = max(int(self.cfg.graceful_timeout) - 1, 1)
