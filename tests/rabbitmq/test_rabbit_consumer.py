"""The relay's stream consumer against a real broker: one that delivers nothing is attached again, and a page read
again after a hole in the offsets is served from what the reader holds instead of a new consumer.

Both faults were seen together under load (the fault suite's stale-notices scenario on a busy machine): the relay
restarted its consumer at every hole the broker's own entries leave in the offsets, one restart landed just below
the stream's first offset while retention deleted that segment, and RabbitMQ 3.10 never delivered to it again.
The host fell behind without a word: no gap, no loss counted, its publishers' ids found only in the stream.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from shmbus import Bus
from shmbus.adapters.rabbitmq.connection import AmqpConnection
from tests.redis.bridge_util import wait_for, wait_relaying

RELAY_TAG = "shmbus-relay-"
NEVER = 10**12  # an offset the stream never reaches: a consumer attached there delivers nothing, as the stuck one


def relay_consumers(monkeypatch: pytest.MonkeyPatch, stuck: int = 0) -> list[object]:
    """Record the offset of every relay consumer started in this process; the first ``stuck`` of them are
    attached where nothing ever comes (the broker's stuck consumer, made on purpose)."""
    offsets: list[object] = []
    consume = AmqpConnection.consume

    def recorded(self: AmqpConnection, channel: int, queue: str, tag: str, offset: object, *args: Any) -> None:
        if tag.startswith(RELAY_TAG):
            offsets.append(offset)
            if len(offsets) <= stuck:
                offset = NEVER
        consume(self, channel, queue, tag, offset, *args)

    monkeypatch.setattr(AmqpConnection, "consume", recorded)
    return offsets


def ids(bus: Bus, channel: str) -> list[int]:
    return [m.message_id for m in bus.backlog(channel)]


def test_a_consumer_that_delivers_nothing_is_attached_again(
    make_host: Callable[..., Bus], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first relay consumer never delivers; the keepalive after 5 s without deliveries attaches it again
    where it stands, and that host then stores everything the other published, with nothing counted lost."""
    starts = relay_consumers(monkeypatch, stuck=1)
    a, b = make_host("a"), make_host("b")
    wait_relaying(a, b)
    got = [(a if i % 2 else b).publish("/s", i) for i in range(20)]
    for host in (a, b):
        wait_for(lambda h=host: ids(h, "/s") == got, 30, f"every message on {host.name}")
        assert [m.data for m in host.backlog("/s")] == list(range(20))
        assert host.default.health()["relay_lost"] == 0
    revived = [h.default.rabbit._bell.reader.revived for h in (a, b)]  # type: ignore[attr-defined]
    assert sum(revived) >= 1 and len(starts) >= 3


def test_a_page_read_again_after_a_hole_keeps_the_consumer(
    make_host: Callable[..., Bus], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Small segments: the broker's entry at the head of each (never delivered) leaves a hole in the offsets every
    dozen messages. The kit reads the page again after each hole; the reader serves it from what it holds."""
    starts = relay_consumers(monkeypatch)
    a = make_host("a", max_segment_size_bytes=2_000)
    wait_relaying(a)
    published: list[int | None] = []
    for k in range(40):
        with a.default.batch() as batch:
            for i in range(5):
                a.publish("/h", "x" * 100 + str(k * 5 + i))
        published += batch.ids
    wait_for(lambda: ids(a, "/h") == published, 30, "every message stored")
    assert published[-1] is not None and published[-1] > len(published)  # offsets have holes: ids are sparse
    assert a.default.health()["relay_lost"] == 0
    assert len(starts) <= 3  # the session's consumer (and a revival or two on a slow machine), not one per hole
