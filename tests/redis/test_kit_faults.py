"""The Redis bridge on the bridge kit's rules (issue 22): a FLUSHDB is another history (reset, then every new message
delivered: no duplicate window swallows them), PUBLISHed lines are doorbells, sizes are checked before the script,
a cron job's ``Bus(name)`` publishes through the recorded engine, the relay's figures and ``shmbus stats --redis``
tell the truth. Every test runs on a private Redis (it flushes it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from shmbus import Bus, PayloadTooLarge
from shmbus.metrics import read_snapshot
from tests.harness.prom import sample

from .bridge_util import wait_for, wait_relaying

pytestmark = pytest.mark.redis


def test_a_flushdb_resets_once_and_every_new_message_is_delivered(
    redis_server: Any, make_host: Callable[..., Bus]
) -> None:
    """After a catch-up from a fresh segment and a FLUSHDB (subscriptions stay connected), Redis's new ids start at
    1 again: host b resets once and receives all 300 new messages (the issue: 0 of 500, no reset)."""
    a = make_host("a", redis_server.url)
    for i in range(50):
        a.publish("/f", i)
    b = make_host("b", redis_server.url)  # a fresh segment: it catches up 50 messages
    wait_relaying(a, b)
    wait_for(lambda: b.last_id("/f") == 50, what="b caught up")
    got: list[Any] = []
    b.subscribe("/f", lambda m: got.append(m.data), last_id=b.last_id("/f"))
    epoch = b.epoch
    redis.Redis.from_url(redis_server.url).flushdb()
    sent = [a.publish("/f", f"new {i}") for i in range(300)]
    assert sent[0] == 1  # Redis's ids restarted
    wait_for(lambda: b.epoch != epoch, what="b reset for the new history")
    wait_for(lambda: [m.data for m in b.backlog("/f")] == [f"new {i}" for i in range(300)], what="all new on b")
    wait_for(lambda: got[-1:] == ["new 299"], what="b's live subscriber got the last one")
    assert got == [f"new {i}" for i in range(300)]  # exactly once each, in order
    assert b.default.health()["resets"] == 1 and b.default.health()["relay_lost"] == 0


def test_published_lines_are_doorbells_never_stored(redis_server: Any, make_host: Callable[..., Bus]) -> None:
    """A line PUBLISHed by any Redis client (stale, repeated or forged with a future id) is never stored: only
    Redis's backlog is. The real message that later gets the forged id is delivered, without a reset."""
    a, b = make_host("a", redis_server.url), make_host("b", redis_server.url)
    wait_relaying(a, b)
    first = a.publish("/chat", "hello")
    wait_for(lambda: b.last_id("/chat") == first, what="b has the first message")
    r = redis.Redis.from_url(redis_server.url)
    forged = '{"data":"<script>alert(1)</script>","user_ids":null,"group_ids":null,"client_ids":null}'
    for gid in (first, first + 1, 10**9):
        r.publish("_message_bus_0", f"{gid}|{gid}|/chat|{forged}")
    time.sleep(0.5)
    real = a.publish("/chat", "the real one")
    for host in (a, b):
        wait_for(lambda h=host: h.last_id("/chat") == real, what=f"{host.name} has the real message")
        assert [m.data for m in host.backlog("/chat")] == ["hello", "the real one"]
        assert host.default.health()["resets"] == 0


def test_a_forged_seal_is_not_stored_and_only_the_buss_key_seals(
    redis_server: Any, make_host: Callable[..., Bus]
) -> None:
    """A line with a seal on the seal channel is stored without reading Redis only when the seal verifies: made
    with the bus's key (which a pub/sub-only client cannot read) for the history host b records. Forged seals (a
    guessed key, another history, the real seal of another line) are not stored; the one made with the key is,
    though Redis does not hold that message: whoever may read the key is a writer of the bus."""
    from shmbus.adapters.bridge.seals import mac
    from shmbus.adapters.redis import layout

    a, b = make_host("a", redis_server.url), make_host("b", redis_server.url)
    wait_relaying(a, b)
    first = a.publish("/chat", "hello")
    wait_for(lambda: b.last_id("/chat") == first, what="b has the first message")
    r = redis.Redis.from_url(redis_server.url)
    key, history = r.get(layout.SEAL_KEY), b.segment.history_id()
    assert key and history
    real_line = r.zrangebyscore(layout.backlog_key("/chat"), first, first)[0]
    seals = layout.seal_channel("_message_bus_0")

    def ring(line: bytes, tag: bytes, last: int = first + 1) -> None:
        pipe = r.pipeline(transaction=True)  # both in one delivery, as the publish script sends them
        pipe.publish("_message_bus_0", line)
        pipe.publish(seals, b"%d|%d|%s" % (first + 1, last, tag))
        pipe.execute()

    forged = b'%d|%d|/chat|{"data":"<script>alert(1)</script>","user_ids":null,"group_ids":null,"client_ids":null}'
    line = forged % (first + 1, first + 1)
    ring(line, mac("sha1", b"0" * len(key), history, [line]))  # a guessed key
    ring(line, mac("sha1", key, history + 1, [line]))  # another history
    ring(line, mac("sha1", key, history, [real_line]))  # the real seal of the first line
    ring(line, mac("sha1", key, history, [line]), last=first + 2)  # a run whose second line never came
    time.sleep(0.5)
    for host in (a, b):
        assert [m.data for m in host.backlog("/chat")] == ["hello"]
    sealed = b'%d|%d|/chat|{"data":"sealed","user_ids":null,"group_ids":null,"client_ids":null}' % (
        first + 1,
        first + 1,
    )
    ring(sealed, mac("sha1", key, history, [sealed]))
    wait_for(lambda: b.last_id("/chat") == first + 1, what="b stored the sealed line")
    assert [m.data for m in b.backlog("/chat")] == ["hello", "sealed"]
    assert r.zrangebyscore(layout.backlog_key("/chat"), first + 1, first + 1) == []  # not read from Redis


def test_the_publish_scripts_seal_as_the_kit_verifies(redis_server: Any, make_host: Callable[..., Bus]) -> None:
    """Both publish scripts send one seal per run on the seal channel (one message: a run of one; a batch: one
    run), equal to the kit's ``seals.mac`` of the run's lines with the key and history Redis holds (else every
    notice would silently cost a read)."""
    from shmbus.adapters.bridge.seals import mac, seal_of
    from shmbus.adapters.redis import layout

    a = make_host("a", redis_server.url)
    wait_relaying(a)
    r = redis.Redis.from_url(redis_server.url)
    key, history = r.get(layout.SEAL_KEY), int(r.get(layout.HISTORY_KEY))
    ps = r.pubsub(ignore_subscribe_messages=True)
    ps.subscribe("_message_bus_0", layout.seal_channel("_message_bus_0"))
    wait_for(lambda: r.pubsub_numsub("_message_bus_0")[0][1] >= 2, what="the test subscribed")
    a.publish("/s", "one")
    a.default.publish_many(a, [("/s", i) for i in range(3)])
    got: list[Any] = []
    wait_for(lambda: got.append(ps.get_message(timeout=0.1)) or len([m for m in got if m]) >= 6, what="4 + 2")
    msgs = [m for m in got if m]
    lines = {int(m["data"].split(b"|")[0]): m["data"] for m in msgs if m["channel"] == b"_message_bus_0"}
    seals = [seal_of(m["data"]) for m in msgs if m["channel"] != b"_message_bus_0"]
    assert sorted(lines) == [1, 2, 3, 4]
    assert seals == [
        (1, 1, mac("sha1", key, history, [lines[1]])),
        (2, 4, mac("sha1", key, history, [lines[2], lines[3], lines[4]])),
    ]
    ps.close()


def test_an_oversized_message_raises_before_the_script(redis_server: Any, make_host: Callable[..., Bus]) -> None:
    a = make_host("a", redis_server.url)
    a.publish("/big", "small")
    with pytest.raises(PayloadTooLarge):
        a.publish("/big", "x" * (9 << 20))
    assert int(redis.Redis.from_url(redis_server.url).get("__mb_global_id_n")) == 1  # Redis took nothing


def test_a_publish_into_a_new_history_is_not_landed_in_the_old_one(
    redis_server: Any, make_host: Callable[..., Bus]
) -> None:
    """After a FLUSHDB Redis's ids start again at 1, so a new id can directly follow the segment's newest of the old
    history. A publisher used to append it there (a message of the new history in the old epoch: out of order and
    counted twice once the relay resets); now it lands only in the history its segment recorded."""
    a = make_host("a", redis_server.url)
    for i in range(50):
        a.publish("/h", i)
    wait_relaying(a)
    seg = a.segment
    assert seg.history_id() != 0 and seg.global_id() == 50
    a.close()  # no relay on this host from now on: nothing resets the segment behind the test's back
    cron = make_host("a", redis_server.url, relay=False)  # another process of the host (a cron job)
    r = redis.Redis.from_url(redis_server.url)
    r.flushdb()
    r.set("__mb_global_id_n", 50)  # the new history's next id follows the segment's newest
    assert cron.publish("/h", "new history") == 1
    assert cron.segment.global_id() == 50  # not landed: it would have been id 51 of the old history
    r.set("__mb_shmbus_history", str(seg.history_id()))  # the recorded history again: the same publish lands
    r.set("__mb_global_id_n", 50)
    cron.publish("/h", "same history")
    assert cron.segment.global_id() == 51 and cron.backlog("/h")[-1].data == "same history"


CRON = """
import sys
from shmbus import Bus
bus = Bus(sys.argv[1], keepalive_interval=0)  # a cron job attaches: the app made the bus
print("ID", bus.publish("/cron", sys.argv[2]), type(bus.default).__name__, flush=True)
bus.close()
"""


def test_a_cron_job_attaching_a_redis_bridged_bus_publishes_through_redis(
    redis_server: Any, make_host: Callable[..., Bus]
) -> None:
    """The README's cron job: ``Bus("app").publish(...)`` on a Redis-bridged host. It used to take a local id that
    Redis later gave another message (both lost on that host); now it publishes through Redis."""
    a, b = make_host("a", redis_server.url), make_host("b", redis_server.url)
    wait_relaying(a, b)
    a.publish("/cron", "worker")
    env = {k: v for k, v in os.environ.items() if k != "SHMBUS_ENGINE_URL"}
    res = subprocess.run(
        [sys.executable, "-c", CRON, a.name, "cron"], capture_output=True, text=True, timeout=60, env=env
    )
    assert res.returncode == 0, res.stderr
    _, mid, engine = res.stdout.split()
    assert engine == "RedisBridge" and int(mid) == 2
    after = a.publish("/cron", "worker again")
    assert after == 3
    for host in (a, b):
        wait_for(lambda h=host: h.last_id("/cron") == 3, what=f"{host.name} has all three")
        assert [m.data for m in host.backlog("/cron")] == ["worker", "cron", "worker again"]


RELAY_ONLY = """
import sys, time
from shmbus import Bus
from shmbus.adapters.redis import RedisBridge
bus = Bus(sys.argv[1], keepalive_interval=0, create=True, engine=RedisBridge(sys.argv[2], election_interval=0.05))
print("READY", flush=True)
time.sleep(120)
"""


def test_the_relay_is_shown_without_subscriptions_and_after_a_reset(
    redis_server: Any, make_host: Callable[..., Bus], procs: Any, bus_name: str
) -> None:
    """A process that relays without subscribing has no listener thread; its relay figures still reach the host's
    metrics (shmbus_relay_up 1, ``shmbus top``'s relay line), and again after a FLUSHDB reset."""
    from shmbus.adapters.metrics import render
    from shmbus.top import frame_lines

    child = procs.spawn_python(RELAY_ONLY, f"{bus_name}r", redis_server.url)
    assert child.stdout.readline().strip() == "READY"
    a = make_host("a", redis_server.url)
    looker = Bus(f"{bus_name}r", keepalive_interval=0, create=True)
    try:

        def relaying() -> bool:
            snap = read_snapshot(looker, exclude_self=True)
            return snap.relay is not None and snap.relay.pid == child.pid and snap.relay.relay_state == "relaying"

        wait_for(relaying, what="the child shown relaying")
        assert "shmbus_relay_up" in render(looker) and sample(render(looker), "shmbus_relay_up") == 1
        a.publish("/x", 1)
        wait_for(lambda: looker.last_id("/x") == 1, what="relayed")
        epoch = looker.epoch
        redis.Redis.from_url(redis_server.url).flushdb()
        a.publish("/y", "after")
        wait_for(lambda: looker.epoch != epoch, what="the reset")
        wait_for(lambda: looker.last_id("/y") == 1, what="the new history relayed")
        wait_for(relaying, what="the child still shown relaying after the reset")
        assert sample(render(looker), "shmbus_relay_up") == 1
        frame = "\n".join(frame_lines(read_snapshot(looker, exclude_self=True), None))
        assert "relay: NONE" not in frame and f"relay pid {child.pid} relaying" in frame
    finally:
        child.kill()
        child.wait(10)
        looker.destroy()


def test_stats_never_says_lags_by_0_across_histories(redis_server: Any, make_host: Callable[..., Bus]) -> None:
    """``shmbus stats --redis`` compares the segment's recorded history with Redis's before giving a lag: host a's
    segment holds 3 messages of a history Redis no longer has, Redis holds 1 of a new one; that is not "lags by 0"."""
    a = make_host("a", redis_server.url)
    wait_relaying(a)
    for i in range(3):
        a.publish("/s", i)
    wait_for(lambda: a.segment.global_id() == 3, what="stored")
    a.close()  # host a stops; its segment stays
    redis.Redis.from_url(redis_server.url).flushdb()
    c = make_host("c", redis_server.url)
    wait_relaying(c)
    c.publish("/s", "new")
    out = subprocess.run(
        [sys.executable, "-m", "shmbus", "stats", "--bus", a.name, "--redis", redis_server.url, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    view = json.loads(out.stdout)["redis"]
    assert view["lag"] is None and "another history" in view["standing"], view


def test_a_forged_seal_with_a_huge_range_stops_no_relay(redis_server: Any, make_host: Callable[..., Bus]) -> None:
    """Issue 31, 1: one PUBLISHed line plus the seal ``1|99999999999|zz`` (any pub/sub client can send both) made
    host b's relay build a list over the whole range: 0 of the next 169 messages, 19 s of CPU in 20 s, health
    "relaying". The seal names more ids than the ring brought lines: passed over, and the relay keeps delivering."""
    from shmbus.adapters.redis import layout

    a, b = make_host("a", redis_server.url), make_host("b", redis_server.url)
    wait_relaying(a, b)
    first = a.publish("/chat", "hello")
    wait_for(lambda: b.last_id("/chat") == first, what="b has the first message")
    r = redis.Redis.from_url(redis_server.url)
    forged = b'%d|%d|/chat|{"data":"forged","user_ids":null,"group_ids":null,"client_ids":null}'
    for last in (b"99999999999", b"9223372036854775807", b"100000000000000000000", b"-1", b"9" * 5000):
        pipe = r.pipeline(transaction=True)  # both in one delivery, as the publish script sends them
        pipe.publish("_message_bus_0", forged % (first + 1, first + 1))
        pipe.publish(layout.seal_channel("_message_bus_0"), b"1|%s|zz" % last)
        pipe.execute()
    sent = [a.publish("/chat", f"after {i}") for i in range(50)]
    wait_for(lambda: b.last_id("/chat") == sent[-1], what="b got every message after the forged seals")
    assert [m.data for m in b.backlog("/chat")] == ["hello", *(f"after {i}" for i in range(50))]
    health = b.default.health()
    assert health["relay_state"] == "relaying" and health["relay_lost"] == 0 and health["resets"] == 0


def test_a_relay_that_makes_no_progress_says_stalled(
    redis_server: Any, make_host: Callable[..., Bus], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 31, 1: a relay thread stuck in a step said "relaying" for good. Whoever reads health or the metrics
    sees "stalled" once it made no step for ``stall_after`` s, and "relaying" again when it moves."""
    import threading

    from shmbus.adapters.redis.doorbell import RedisDoorbell

    b = make_host("b", redis_server.url)
    wait_relaying(b)
    status = b.default.status  # type: ignore[union-attr]
    status.relay.stall_after = 0.2
    held, release = threading.Event(), threading.Event()
    ring = RedisDoorbell.ring

    def stuck_ring(self: RedisDoorbell, timeout: float) -> Any:
        if not release.is_set():
            held.set()
            release.wait(30)
        return ring(self, timeout)

    monkeypatch.setattr(RedisDoorbell, "ring", stuck_ring)
    try:
        assert held.wait(10), "the relay never waited on its doorbell"
        wait_for(lambda: b.default.health()["relay_state"] == "stalled", what="health says stalled")
        assert b.metrics.flush()  # as the listener thread would (the relay's own flush is stuck with it)
        snap = read_snapshot(b)
        assert snap.relay is not None and snap.relay.relay_state == "stalled"
    finally:
        release.set()
    wait_for(lambda: b.default.health()["relay_state"] == "relaying", what="relaying again")


def test_a_new_host_owes_nothing_trimmed_before_it_began(
    redis_server: Any, make_host: Callable[..., Bus], caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 31, 7: a new host counted the backend's history trimmed before it existed as its own relay_lost
    (2,000-27,323 at start) and logged ~1,000 one-id warnings (ids whose channel backlog no longer held them). It
    is owed what was published after it began relaying: 0 lost, no warning; a later loss still counts, once."""
    import logging

    a = make_host("a", redis_server.url, bus_options={"max_global_backlog_size": 300, "max_backlog_size": 50})
    wait_relaying(a)
    with a.default.batch():  # type: ignore[union-attr]
        for i in range(2000):
            a.publish(f"/c{i % 40}", i)  # the global backlog and each channel's are trimmed
    with caplog.at_level(logging.WARNING, "shmbus.redis"):
        b = make_host("b", redis_server.url)
        wait_relaying(b)
        wait_for(lambda: b.segment.global_id() == 2000, what="b caught up")
        assert b.default.health()["relay_lost"] == 0
        said = [r.getMessage() for r in caplog.records if "gone from the backend" in r.getMessage()]
        assert not said, said
    # host a's relay may read its own burst before a's publisher landed it, trimmed already: it waits for the
    # publisher instead of counting a loss (it did lose some of them on a loaded machine)
    assert a.default.health()["relay_lost"] == 0 and a.segment.global_id() == 2000


def test_a_loss_of_many_single_ids_is_counted_and_logged_once(
    redis_server: Any, make_host: Callable[..., Bus], caplog: pytest.LogCaptureFixture
) -> None:
    """Ids the global backlog still names but whose channel backlog was trimmed came one by one, each with its own
    warning (~1,000 lines). They still count, each once, in one line per catch-up."""
    import logging

    limits = {"max_global_backlog_size": 5000, "max_backlog_size": 10}
    a, b = make_host("a", redis_server.url, bus_options=limits), make_host("b", redis_server.url, bus_options=limits)
    wait_relaying(a, b)
    first = a.publish("/c0", "before")
    wait_for(lambda: b.segment.global_id() == first, what="b up to date")
    b.close()  # a rolling deploy: host b's only process exits, its segment stays
    with a.default.batch():  # type: ignore[union-attr]
        for i in range(1000):
            a.publish(f"/c{i % 20}", i)  # each channel keeps its newest 10: 800 ids name trimmed lines
    with caplog.at_level(logging.WARNING, "shmbus.redis"):
        b2 = make_host("b", redis_server.url, bus_options=limits)
        wait_relaying(b2)
        wait_for(lambda: b2.segment.global_id() == first + 1000, what="b caught up")
    assert b2.default.health()["relay_lost"] == 800
    assert a.default.health()["relay_lost"] == 0  # a's own burst, landed by its publisher, trims or not
    gone = [r.getMessage() for r in caplog.records if "gone from the backend" in r.getMessage()]
    assert len(gone) == 1 and f"bus {b2.name!r} misses" in gone[0] and "800 message(s)" in gone[0], gone


def test_a_message_too_large_for_a_hosts_smaller_ring_is_a_loss_with_its_reason(
    redis_server: Any, make_host: Callable[..., Bus], caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 31, 7: hosts with different ring sizes; a 2 MiB message fits host a's ring, not host b's (a quarter of
    4 MiB). b's live subscriber missed it and its listener warned "overwritten". Now b's relay says why and counts
    it in relay_lost; the listener counts nothing (the ring overwrote nothing); a backlog read across it is filled
    from Redis."""
    import logging

    a = make_host("a", redis_server.url, bus_options={"ring_size": 32 << 20})
    b = make_host("b", redis_server.url, bus_options={"ring_size": 4 << 20})
    wait_relaying(a, b)
    got: list[Any] = []
    with caplog.at_level(logging.WARNING):
        b.subscribe("/big", lambda m: got.append(m.data))
        a.publish("/big", "small")
        big = a.publish("/big", "x" * (2 << 20))
        last = a.publish("/big", "after")
        wait_for(lambda: got[-1:] == ["after"], what="b's subscriber got the message after the big one")
        assert got == ["small", "after"]
    figures = b.figures()
    assert figures.relay_lost == 1 and figures.listener.lost == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [w for w in warnings if "overwritten" in w], warnings
    assert [w for w in warnings if f"message {big} is too large for bus {b.name!r}" in w], warnings
    assert [len(m.data) for m in b.backlog("/big", 0)] == [5, 2 << 20, 5] and last == 3  # filled from Redis
