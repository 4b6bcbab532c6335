"""The pace of one open SSE stream, sans-IO: what it writes next and how long it may wait for it.

Both SSE shells run the same loop, :class:`~.sse.SSEApp` on an event loop and :class:`~.sse_wsgi.SSEWSGIApp` in
a thread or greenlet: wait up to :meth:`StreamPace.timeout` for a wake-up (none while something is pending),
then write :meth:`StreamPace.next_write`. Only the waiting and the writing differ, so the keepalive, the reset
check that rides on it and the stream's first bytes are decided here once.
"""

from __future__ import annotations

from .sink import Sink

__all__ = ["KEEPALIVE", "StreamPace", "check_keepalive"]

KEEPALIVE = b": keepalive\n\n"


def check_keepalive(keepalive_interval: float) -> None:
    """Refuse a keepalive interval a stream could not keep (both shells' constructors)."""
    if not keepalive_interval > 0:
        raise ValueError("keepalive_interval must be > 0 seconds")


class StreamPace:
    """One stream's writes: the sink's pending events, plus a keepalive comment (after a check for a bus reset
    with no new message) every ``keepalive_interval`` seconds. ``now`` is the shell's monotonic clock."""

    __slots__ = ("interval", "next_ping", "retry_ms", "sink")

    def __init__(self, sink: Sink, keepalive_interval: float, retry_ms: int | None) -> None:
        self.sink = sink
        self.interval = keepalive_interval
        self.retry_ms = retry_ms
        self.next_ping = 0.0

    def opening(self, now: float) -> bytes:
        """The first write: the ``retry:`` hint, a ``: connected`` comment and what the open replayed."""
        self.next_ping = now + self.interval
        head = (b"retry: %d\n" % self.retry_ms if self.retry_ms else b"") + b": connected\n\n"
        return head + b"".join(self.sink.take())

    def timeout(self, now: float) -> float:
        """How long to wait for a wake-up (0 or less: write at once)."""
        return 0.0 if self.sink.pending else self.next_ping - now

    def next_write(self, now: float) -> bytes:
        """What to write now (may be empty): the pending events, and a keepalive when one is due."""
        sink = self.sink
        out = sink.take()
        if now >= self.next_ping:
            sink.check_epoch()
            out += sink.take()
            out.append(KEEPALIVE)
            self.next_ping = now + self.interval
        return b"".join(out)
