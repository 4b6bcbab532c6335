"""What the RabbitMQ bridge's cheaper paths must keep: the relay acknowledges its deliveries in bulk and still never
runs out of the consumer's credit; a connection's reads go through one buffer of its own and still hand over every
frame whole, a message larger than the buffer included; publishers on many threads each get their own connection,
and a thread that ended does not keep one open."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from shmbus import Bus
from shmbus.adapters.rabbitmq import reader
from shmbus.adapters.rabbitmq.connection import AmqpConnection
from tests.redis.bridge_util import wait_for, wait_relaying


def test_the_relay_acknowledges_in_bulk_and_keeps_its_credit(
    make_host: Callable[..., Bus], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One ack per delivery cost the broker and the relay a frame each; acks every ``ACK_EVERY`` deliveries must
    still renew the consumer's credit (2000 deliveries unacknowledged stop it): more than that all arrive."""
    acks: list[int] = []
    ack = AmqpConnection.ack

    def counted(self: AmqpConnection, channel: int, tag: int) -> None:
        acks.append(tag)
        ack(self, channel, tag)

    monkeypatch.setattr(AmqpConnection, "ack", counted)
    a = make_host("a")
    wait_relaying(a)
    singles = [a.publish("/c", i) for i in range(40)]
    bridge = a.default
    ids = bridge.publish_many(a, [("/c", i) for i in range(5000)])  # type: ignore[attr-defined]
    assert singles == sorted(singles) and ids == sorted(ids)
    wait_for(lambda: a.segment.global_id() >= ids[-1], what="every message stored by the relay")
    assert len(acks) <= 5040 // reader.ACK_EVERY + 2  # one ack per delivery: about 40 for the singles alone
    assert a.health()["engine_health"]["relay_lost"] == 0


def test_a_message_larger_than_a_read_arrives_whole(make_host: Callable[..., Bus]) -> None:
    """Reads go into the connection's own buffer (``_READ`` bytes), which the next read overwrites: a message of
    several frames and several reads must reach both hosts intact."""
    from shmbus.adapters.rabbitmq import connection

    a, b = make_host("a"), make_host("b")
    wait_relaying(a, b)
    big = "".join(chr(65 + i % 26) for i in range(connection._READ * 2 + 12345))
    mid = a.publish("/big", {"s": big})
    wait_for(lambda: [m.message_id for m in b.backlog("/big")] == [mid], what="the big message on b")
    assert b.backlog("/big")[0].data == {"s": big}
    assert a.backlog("/big")[0].data == {"s": big}


def test_threads_publish_on_connections_of_their_own_and_an_ended_one_releases_its_own(
    make_host: Callable[..., Bus],
) -> None:
    """A thread per request (a threading dev server) must not leave a connection open per request it served."""
    a = make_host("a")
    wait_relaying(a)
    backend = a.default.rabbit  # type: ignore[attr-defined]
    got: list[int] = []
    for round_ in range(5):
        threads = [
            threading.Thread(target=lambda r=round_, n=n: got.append(a.publish("/t", [r, n]))) for n in range(4)
        ]  # distinct messages: identical ones published at the same moment may be given one id (see the docs)
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert sorted(got) == sorted(set(got)) and len(got) == 20
    a.publish("/t", "main")
    open_ones = [p for _, p in backend._publishers if not p.conn.closed]
    assert len(open_ones) == 1  # the main thread's: each new connection closed those of the threads that ended
