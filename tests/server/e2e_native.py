"""The browser tests' app (tests/e2e/e2e_app.py) served by ``shmbus.adapters.server.GunicornWorker`` natively.

``app`` is a :class:`MessageBusMiddleware` around e2e_app's inner app (page, scripts, ``/publish``), so the
worker answers the message-bus routes itself. e2e_app logs polls by wrapping the ASGI app, which the native
path bypasses; here the same log lines (``SHMBUS_E2E_LOG``) come from a :class:`MessageBusProtocol` subclass
that sees every poll start, every body piece the server writes and every end.
"""

from __future__ import annotations

import time
from typing import Any

from shmbus.adapters import asgi
from shmbus.adapters.http import MessageBusProtocol, Poll, Waiter
from shmbus.adapters.http.protocol import null_lock
from shmbus.adapters.server import bus_routes
from tests.e2e import e2e_app

_entries: dict[int, dict[str, Any]] = {}


class LoggingProtocol(MessageBusProtocol):
    def start_poll(self, req: Any, lk: Any, extra: Any, **kw: Any) -> Poll:
        t0 = time.monotonic()
        poll = super().start_poll(req, lk, extra, **kw)
        entry = e2e_app.poll_entry("dlp=t" if req.dlp else "", req.dont_chunk, t0)
        entry["status"] = 200
        entry["ctype"] = "text/plain; charset=utf-8" if poll.mode == "stream" else "application/json; charset=utf-8"
        if poll.mode == "immediate":
            assert poll.response is not None
            e2e_app._note_body(entry, poll.response.body)
            self._end(entry)
        else:
            assert poll.waiter is not None
            _entries[id(poll.waiter)] = entry
            e2e_app._note_body(entry, poll.first_chunk)
        return poll

    def _end(self, entry: dict[str, Any] | None) -> None:
        if entry is not None:
            entry["t1"] = time.monotonic()
            e2e_app.log(entry)

    def stream_chunks(self, c: Waiter) -> list[bytes]:
        chunks = super().stream_chunks(c)
        if chunks and id(c) in _entries:
            e2e_app._note_body(_entries[id(c)], b"".join(chunks))
        return chunks

    def stream_end(self, c: Waiter) -> list[bytes]:
        end = super().stream_end(c)
        entry = _entries.pop(id(c), None)
        if entry is not None:
            e2e_app._note_body(entry, b"".join(end))
        self._end(entry)
        return end

    def long_poll_response(self, c: Waiter) -> bytes:
        body = super().long_poll_response(c)
        entry = _entries.pop(id(c), None)
        if entry is not None:
            e2e_app._note_body(entry, body)
        self._end(entry)
        return body

    def abandon(self, c: Waiter) -> None:
        super().abandon(c)
        entry = _entries.pop(id(c), None)
        if entry is not None and not entry["ctype"].startswith("text/plain"):
            entry["status"] = None  # a long poll that got no response (a stream's head was already sent)
        self._end(entry)


class _LoggingFanout(asgi._LoopFanout):
    def __init__(self, bus: Any, options: Any, loop: Any) -> None:
        super().__init__(bus, options, loop)
        self.proto = LoggingProtocol(bus, options, null_lock())


_inline_wake = bus_routes._wake


def _logging_wake(w: Waiter) -> None:
    """The server's waker writes a stream's queued chunks itself (inline, without ``stream_chunks``, when the
    stream is parked and its transport takes writes): note what it is about to write."""
    conn = w.signal
    parked = conn.parked
    entry = _entries.get(id(w))
    if (
        entry is not None
        and parked is not None
        and parked.waiter is w
        and w.streaming
        and w.pending
        and w.ending is None
        and not w.done
        and not conn.paused_w
    ):
        e2e_app._note_body(entry, b"".join(w.pending))
    _inline_wake(w)


bus_routes._wake = _logging_wake  # this process only (the test server)
asgi._LoopFanout = _LoggingFanout  # type: ignore[misc]  # this process only (the test server)
app = asgi.MessageBusMiddleware(e2e_app._asgi_inner, bus=e2e_app.bus, subscribe_allowed=e2e_app.may_subscribe)
