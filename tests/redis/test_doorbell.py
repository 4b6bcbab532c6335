"""The Redis doorbell reads its socket itself (hiredis) on the relay's wake-up path: every reply arrives whole and in
order however the bytes are cut into reads, PONGs are seen, and a closed connection raises (the relay reconnects).
The redis-py path (no hiredis, TLS) gives the same rings."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from shmbus.adapters.bridge.seals import seal_of
from shmbus.adapters.redis import doorbell as doorbell_module
from shmbus.adapters.redis.doorbell import RedisDoorbell

pytestmark = pytest.mark.redis


def _drain(bell: RedisDoorbell, want: int) -> tuple[list[bytes], list[int]]:
    lines: list[bytes] = []
    seals: list[int] = []
    for _ in range(10_000):
        ring = bell.ring(0.5)
        lines += ring.lines
        seals += sorted(ring.seals)
        if len(lines) + len(seals) >= want:
            break
    return lines, seals


@pytest.mark.parametrize("direct", [True, False], ids=["hiredis", "redis-py"])
def test_every_line_arrives_whole_and_in_order(redis_server: Any, direct: bool, monkeypatch: Any) -> None:
    if not direct:
        monkeypatch.setattr(doorbell_module, "_hiredis", None)
    r = redis.Redis.from_url(redis_server.url, protocol=2)  # as the bridge makes its client
    bell = RedisDoorbell(r, "/ch", "/ch_seals", socket_timeout=5.0)
    assert (bell._sock is not None) is direct
    try:
        pipe = r.pipeline(transaction=False)
        sent = []
        for i in range(1, 601):  # 600 lines of ~1 KB and 600 seals: many reads of 64 KiB, replies cut between them
            line = b"%d|%d|/c|%s" % (i, i, b"x" * (900 + i % 50))
            sent.append(line)
            pipe.publish("/ch", line)
            pipe.publish("/ch_seals", b"%d|%d|%s" % (i, i, b"f" * 40))
        pipe.execute()
        lines, seals = _drain(bell, 1200)
        assert lines == sent and seals == list(range(1, 601))
        bell.keepalive()
        assert bell.ping_sent
        ring = bell.ring(2.0)
        assert ring.top == 0 and not bell.ping_sent  # the PONG was read
        r.publish("/ch", b"not a line")  # a doorbell only: no id, but it rings
        ring = bell.ring(2.0)
        assert ring.lines == [b"not a line"] and ring.top == 0
        r.publish("/ch_seals", b"garbage")
        assert bell.ring(2.0).seals == {} and seal_of(b"garbage") is None
    finally:
        bell.close()


def test_a_closed_connection_raises(redis_server: Any) -> None:
    r = redis.Redis.from_url(redis_server.url, protocol=2)  # as the bridge makes its client
    bell = RedisDoorbell(r, "/ch", "/ch_seals", socket_timeout=5.0)
    try:
        r.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
        with pytest.raises((redis.exceptions.ConnectionError, OSError)):
            for _ in range(50):
                bell.ring(0.2)
    finally:
        bell.close()


def test_a_reply_half_in_redis_pys_buffer_keeps_redis_py_reading() -> None:
    """Taking the socket over while redis-py's parser holds the start of a reply would cut it in two: the
    doorbell then leaves the reading to redis-py (the SUBSCRIBE replies and a message may come in one read)."""
    from types import SimpleNamespace

    hiredis = pytest.importorskip("hiredis")
    reader = hiredis.Reader()
    conn = SimpleNamespace(_parser=SimpleNamespace(_reader=reader))
    assert doorbell_module._nothing_buffered(conn)
    reader.feed(b"*3\r\n$7\r\nmessage\r\n$3\r\n/ch\r\n$10\r\n12|")
    assert reader.gets() is False and not doorbell_module._nothing_buffered(conn)
    assert not doorbell_module._nothing_buffered(SimpleNamespace(_parser=SimpleNamespace()))  # a Python parser


@pytest.mark.parametrize("direct", [True, False], ids=["hiredis", "redis-py"])
def test_a_line_with_a_huge_id_is_a_doorbell_not_an_error(redis_server: Any, direct: bool, monkeypatch: Any) -> None:
    """Issue 31: anyone who may PUBLISH sent ``9999…9|…`` (5,000 digits): ``int`` refuses past 4,300 digits with a
    ValueError, which ended the relay's connection (a reconnect, with backoff, per line). An id is at most 19
    ASCII digits: anything else names no id (it still rings); a seal with such ids is no seal."""
    if not direct:
        monkeypatch.setattr(doorbell_module, "_hiredis", None)
    r = redis.Redis.from_url(redis_server.url, protocol=2)
    bell = RedisDoorbell(r, "/ch", "/ch_seals", socket_timeout=5.0)
    try:
        huge = b"9" * 5000
        forged = [huge + b"|1|/c|{}", b"-7|1|/c|{}", b"+7|1|/c|{}", b"99999999999999999999|1|/c|{}", b"8|8|/c|{}"]
        for line in forged:
            r.publish("/ch", line)
        for seal in (b"1|" + huge + b"|zz", b"1|100000000000000000000|zz", b"-1|5|zz", b"1|99999999999|zz"):
            r.publish("/ch_seals", seal)
        lines: list[bytes] = []
        seals: dict[int, tuple[int, bytes]] = {}
        top = 0
        for _ in range(50):
            ring = bell.ring(0.5)
            lines += ring.lines
            seals.update(ring.seals)
            top = max(top, ring.top)
            if len(lines) == len(forged) and seals:
                break
        assert lines == forged and top == 8
        assert seals == {1: (99999999999, b"zz")}  # well-formed; the ring's size refuses it (seals.sealed_rows)
    finally:
        bell.close()


def test_a_flood_of_notices_ends_no_ring_on_redis_pys_path(redis_server: Any, monkeypatch: Any) -> None:
    """redis-py's path read replies while any were readable: a client publishing faster than the relay parses kept
    one ring going for good. A ring takes at most its bound; the rest come with the next rings, none lost."""
    monkeypatch.setattr(doorbell_module, "_hiredis", None)
    r = redis.Redis.from_url(redis_server.url, protocol=2)
    bell = RedisDoorbell(r, "/ch", "/ch_seals", socket_timeout=5.0)
    try:
        count = 3 * doorbell_module._REPLIES_PER_RING
        pipe = r.pipeline(transaction=False)
        for i in range(1, count + 1):
            pipe.publish("/ch", b"%d|" % i)
        pipe.execute()
        sizes: list[int] = []
        while sum(sizes) < count:
            ring = bell.ring(2.0)
            assert ring.lines, f"{sum(sizes)} of {count} arrived"
            sizes.append(len(ring.lines))
        assert max(sizes) <= doorbell_module._REPLIES_PER_RING and sum(sizes) == count
    finally:
        bell.close()
