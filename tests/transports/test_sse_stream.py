"""transports/sse_stream.StreamPace: what an SSE stream writes next and how long it may wait (both shells' loop)."""

from __future__ import annotations

import pytest

from shmbus import Bus
from shmbus.adapters.http import MessageBusProtocol
from shmbus.adapters.transports.identity import Identity
from shmbus.adapters.transports.sink import Sink
from shmbus.adapters.transports.sse_stream import KEEPALIVE, StreamPace, check_keepalive


def _sink(bus: Bus) -> Sink:
    return Sink(bus, Identity(None, MessageBusProtocol.lookups(None, None, None)), lambda m: b"")


def test_the_first_write_is_the_retry_hint_the_greeting_and_what_the_open_queued(bus: Bus) -> None:
    sink = _sink(bus)
    sink.push(b"event: /a\ndata: 1\n\n")
    pace = StreamPace(sink, keepalive_interval=15.0, retry_ms=2000)
    assert pace.opening(now=100.0) == b"retry: 2000\n: connected\n\nevent: /a\ndata: 1\n\n"
    assert not sink.pending and pace.timeout(now=100.0) == 15.0
    assert StreamPace(_sink(bus), 15.0, retry_ms=None).opening(now=0.0) == b": connected\n\n"


def test_pending_events_are_written_at_once_and_a_keepalive_only_when_due(bus: Bus) -> None:
    sink = _sink(bus)
    pace = StreamPace(sink, keepalive_interval=10.0, retry_ms=None)
    pace.opening(now=0.0)
    assert pace.next_write(now=1.0) == b""  # nothing pending, no keepalive due
    sink.push(b"data: x\n\n")
    assert pace.timeout(now=2.0) == 0.0  # pending: no waiting
    assert pace.next_write(now=2.0) == b"data: x\n\n"
    assert pace.timeout(now=4.0) == 6.0
    sink.push(b"data: y\n\n")
    assert pace.next_write(now=10.0) == b"data: y\n\n" + KEEPALIVE  # due: after what was pending
    assert pace.timeout(now=10.0) == 10.0  # the next one counts from this one
    assert pace.next_write(now=15.0) == b""


@pytest.mark.parametrize("interval", [0, -1.0, float("nan")])
def test_a_keepalive_interval_a_stream_cannot_keep_is_refused(interval: float) -> None:
    with pytest.raises(ValueError, match="keepalive_interval"):
        check_keepalive(interval)
