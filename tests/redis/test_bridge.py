"""Redis bridge, in one process: wire compatibility with the gem, two hosts, moving clients, gap fill, flush."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import redis

from shmbus import Bus, Message
from shmbus.adapters.bridge.wire import required_line

from .bridge_util import wait_for, wait_relaying

pytestmark = pytest.mark.redis


def _r(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, protocol=2)


def _ids(msgs: list[Message]) -> list[tuple[int, int, str, Any]]:
    return [(m.global_id, m.message_id, m.channel, m.data) for m in msgs]


def _commands(r: redis.Redis) -> int:
    """Commands Redis executed so far, not counting INFO (this probe) and PING (idle relay liveness)."""
    stats: dict[str, Any] = r.info("commandstats")  # type: ignore[assignment]
    return sum(int(v["calls"]) for k, v in stats.items() if k not in ("cmdstat_info", "cmdstat_ping"))


def test_redis_layout_and_lines_are_the_gems(redis_server: Any, make_host: Callable[..., Bus]) -> None:
    a = make_host("a", redis_server.url)
    r = _r(redis_server.url)
    ps = r.pubsub()
    ps.subscribe("_message_bus_0")
    wait_for(lambda: ps.get_message(timeout=0.1), what="subscribe confirmation")
    assert a.publish("/a", "a1") == 1
    assert a.publish("/b", "b1") == 1
    assert a.publish("/a", "a2", user_ids=[1, 2]) == 2
    assert a.publish("/p|q", {"k": [1]}, site_id="s") == 1
    assert r.get("__mb_global_id_n") == b"4"
    assert r.get("__mb_backlog_id_n_/a") == b"2"
    assert r.zrange("__mb_backlog_n_/a", 0, -1, withscores=True) == [
        (b'1|1|/a|{"data":"a1","user_ids":null,"group_ids":null,"client_ids":null}', 1.0),
        (b'3|2|/a|{"data":"a2","user_ids":[1,2],"group_ids":null,"client_ids":null}', 2.0),
    ]
    assert r.zrange("__mb_global_backlog_n", 0, -1, withscores=True) == [
        (b"1|/a", 1.0),
        (b"1|/b", 2.0),
        (b"2|/a", 3.0),
        (b"1|/p|q$|$s", 4.0),
    ]
    # the site suffix is part of the backend channel, and its pipes travel escaped in the line
    assert r.zrange("__mb_backlog_n_/p|q$|$s", 0, -1) == [
        b'4|1|/p$$123$$q$$$123$$$s|{"data":{"k":[1]},"user_ids":null,"group_ids":null,"client_ids":null}'
    ]
    assert r.ttl("__mb_backlog_n_/a") == 604800
    assert r.ttl("__mb_backlog_id_n_/a") == 604800
    assert r.ttl("__mb_global_backlog_n") == 604800
    assert r.ttl("__mb_global_id_n") == -1
    published = [wait_for(lambda: ps.get_message(timeout=0.1), what="pub/sub line")["data"] for _ in range(4)]
    assert published[0] == b'1|1|/a|{"data":"a1","user_ids":null,"group_ids":null,"client_ids":null}'
    assert [required_line(p).global_id for p in published] == [1, 2, 3, 4]
    ps.close()


# The gem's publish, step by step, in one script as the gem runs it: atomic, so a relay reading Redis between two
# of the steps cannot see an id drawn whose message is not stored yet (done command by command, it would count
# that id as gone).
_GEM_PUBLISH = """
local gid = redis.call('INCR', '__mb_global_id_n')
local cid = redis.call('INCR', '__mb_backlog_id_n_' .. ARGV[1])
local line = gid .. '|' .. cid .. '|' .. ARGV[2] .. '|' .. ARGV[3]
redis.call('ZADD', '__mb_backlog_n_' .. ARGV[1], cid, line)
redis.call('ZADD', '__mb_global_backlog_n', gid, cid .. '|' .. ARGV[1])
redis.call('PUBLISH', '_message_bus_0', line)
"""


def _gem_publish(r: redis.Redis, chan: str, envelope: str) -> None:
    """A Ruby app's publish, as the gem's script does it."""
    r.eval(_GEM_PUBLISH, 0, chan, chan.replace("|", "$$123$$"), envelope)


def test_a_gem_publisher_is_seen_with_its_ids_and_targets(redis_server: Any, make_host: Callable[..., Bus]) -> None:
    """A Ruby app's publish reaches the bus."""
    b = make_host("b", redis_server.url)
    wait_relaying(b)
    got: list[Message] = []
    b.subscribe("/chat|x", got.append)
    r = _r(redis_server.url)
    envelope = json.dumps({"data": {"msg": "héllo"}, "user_ids": [7], "group_ids": None, "client_ids": ["c1"]})
    _gem_publish(r, "/chat|x$|$site1", envelope)
    wait_for(lambda: got, what="the gem's message")
    m = got[0]
    assert (m.global_id, m.message_id, m.channel, m.site_id) == (1, 1, "/chat|x", "site1")
    assert m.data == {"msg": "héllo"}
    assert (m.user_ids, m.group_ids, m.client_ids) == ([7], None, ["c1"])
    assert b.last_id("/chat|x", site_id="site1") == 1


def test_a_gem_message_on_a_name_without_a_slash_is_skipped_as_documented(
    redis_server: Any, make_host: Callable[..., Bus]
) -> None:
    """The deviation listed in shmbus.adapters.redis's docstring: the gem stores any string, the relay copies in
    only names that follow the bus's channel rule, and counts the others."""
    import shmbus.adapters.redis as module

    assert "Deviations from the gem" in (module.__doc__ or "") and 'pubsub_channel="_message_bus_0"' in module.__doc__
    b = make_host("b", redis_server.url)
    wait_relaying(b)
    got: list[Message] = []
    b.subscribe(None, got.append)
    r = _r(redis_server.url)
    plain = json.dumps({"data": 1, "user_ids": None, "group_ids": None, "client_ids": None})
    _gem_publish(r, "chat", plain)
    _gem_publish(r, "/after", plain)
    wait_for(lambda: got, what="the message after the skipped one")
    assert [(m.global_id, m.channel) for m in got] == [(2, "/after")]
    assert b.default.health()["unrelayable"] == 1  # type: ignore[union-attr]


def test_two_hosts_see_the_same_messages_with_the_same_ids(redis_server: Any, make_host: Callable[..., Bus]) -> None:
    a, b = make_host("a", redis_server.url), make_host("b", redis_server.url)
    wait_relaying(a, b)
    on_b: list[Message] = []
    b.subscribe(None, on_b.append)
    for i in range(30):
        (a if i % 3 else b).publish(f"/c{i % 4}", {"i": i}, group_ids=[i] if i % 5 == 0 else None)
    wait_for(lambda: len(on_b) == 30, what="30 messages on host b")
    assert [m.global_id for m in on_b] == list(range(1, 31))
    wait_for(lambda: a.segment.global_id() == 30, what="host a complete")
    assert _ids(a.global_backlog(0)) == _ids(b.global_backlog(0)) == _ids(on_b)
    for ch in ("/c0", "/c1", "/c2", "/c3"):
        assert a.last_id(ch) == b.last_id(ch) == int(_r(redis_server.url).get(f"__mb_backlog_id_n_{ch}") or 0)
        assert _ids(a.backlog(ch, 2)) == _ids(b.backlog(ch, 2))
    assert [m.group_ids for m in b.backlog("/c0")] == [[0], None, None, None, None, [20], None, None]


def test_a_client_moving_between_hosts_misses_nothing_and_sees_nothing_twice(
    redis_server: Any, make_host: Callable[..., Bus]
) -> None:
    a, b = make_host("a", redis_server.url), make_host("b", redis_server.url)
    wait_relaying(a, b)
    channels = ["/x", "/y"]
    last = {ch: 0 for ch in channels}
    seen: list[tuple[str, int, Any]] = []
    expected: list[tuple[str, int, Any]] = []
    for rnd in range(12):
        pub = a if rnd % 2 else b
        for k in range(5):
            ch = channels[(rnd + k) % 2]
            mid = pub.publish(ch, f"{rnd}.{k}")
            assert mid is not None
            expected.append((ch, mid, f"{rnd}.{k}"))
        poll = b if rnd % 3 else a  # the client hops between hosts with its last ids
        wait_for(lambda p=poll: p.segment.global_id() == len(expected), what="relay")
        for ch in channels:
            for m in poll.backlog(ch, last[ch]):
                seen.append((ch, m.message_id, m.data))
                last[ch] = m.message_id
    for ch in channels:
        mine = [e for e in seen if e[0] == ch]
        assert mine == sorted(e for e in expected if e[0] == ch)
        assert [e[1] for e in mine] == list(range(1, len(mine) + 1))
    assert sorted(seen) == sorted(expected)


def test_reads_cost_no_redis_command_and_older_gaps_are_filled_from_redis(
    redis_server: Any, make_host: Callable[..., Bus]
) -> None:
    small = {"max_global_backlog_size": 50}
    a = make_host("a", redis_server.url, bus_options=small)
    wait_relaying(a)
    for i in range(1, 121):
        a.publish("/old", i)
    a.publish("/new", "n")
    b = make_host("b", redis_server.url, bus_options=small)  # joins late: catch-up sees the last 50 only
    wait_relaying(b)
    assert b.segment.global_id() == 121
    r = _r(redis_server.url)
    before = _commands(r)
    for _ in range(200):  # what a long poll does: last ids, then the backlog after the client's ids
        assert b.last_ids("/old", "/new") == {"/old": 120, "/new": 1}
        assert [m.data for m in b.backlog("/old", 100)] == list(range(101, 121))
        assert b.backlog("/new", 0)[0].data == "n"
    assert _commands(r) - before == 0
    full = b.backlog("/old", 0)  # older than b's segment: one Redis read fills the gap
    assert [m.message_id for m in full] == list(range(1, 121))
    assert [m.data for m in full] == list(range(1, 121))
    assert not full.gap and full.last_id == 120
    assert _commands(r) - before == 1
    assert [m.data for m in b.backlog("/old", 10, limit=3)] == [11, 12, 13]
    assert [m.data for m in b.backlog("/old", 10, upto=12)] == [11, 12]


def test_flushall_resets_the_epoch_and_relaying_continues(redis_server: Any, make_host: Callable[..., Bus]) -> None:
    a, b = make_host("a", redis_server.url), make_host("b", redis_server.url)
    wait_relaying(a, b)
    for i in range(5):
        a.publish("/f", i)
    wait_for(lambda: b.last_id("/f") == 5, what="first messages")
    epoch = b.epoch
    _r(redis_server.url).flushall()
    assert a.publish("/f", "after") == 1
    wait_for(lambda: b.epoch != epoch, what="epoch change on host b")
    wait_for(lambda: b.last_id("/f") == 1, what="the new message on host b")
    assert _ids(b.backlog("/f")) == [(1, 1, "/f", "after")]
    assert b.default.health()["resets"] >= 1
    assert a.publish("/f", "again") == 2
    wait_for(lambda: b.last_id("/f") == 2, what="relaying after the reset")


def test_pipelined_batch_keeps_order_and_ids(redis_server: Any, make_host: Callable[..., Bus]) -> None:
    a, b = make_host("a", redis_server.url), make_host("b", redis_server.url)
    wait_relaying(a, b)
    bridge: Any = a.default
    with bridge.batch() as batch:
        for i in range(2500):
            assert a.publish(f"/m{i % 3}", i) is None  # queued in the pipeline until the block ends
    assert batch.ids == [i // 3 + 1 for i in range(2500)]
    assert a.segment.global_id() == 2500  # read-your-writes: stored locally before the block returned
    ids = bridge.publish_many(a, [("/m0", "x"), ("/z", "y", {"user_ids": [1]})])
    assert ids == [835, 1]
    wait_for(lambda: b.segment.global_id() == 2502, what="batch relayed to b")
    assert [m.data for m in b.backlog("/m1", 830)] == [i for i in range(2500) if i % 3 == 1][830:]
    assert b.backlog("/z")[0].user_ids == [1]


def test_msgpack_codec_round_trips_binary_data(redis_server: Any, make_host: Callable[..., Bus]) -> None:
    a = make_host("a", redis_server.url, codec="msgpack")
    b = make_host("b", redis_server.url, codec="msgpack")
    wait_relaying(a, b)
    assert a.publish("/bin", {"blob": b"\x00\xff|x"}, client_ids=["c"]) == 1
    wait_for(lambda: b.last_id("/bin") == 1, what="msgpack message")
    m = b.backlog("/bin")[0]
    assert m.data == {"blob": b"\x00\xff|x"} and m.client_ids == ["c"]


def test_health_and_close(redis_server: Any, make_host: Callable[..., Bus]) -> None:
    a = make_host("a", redis_server.url)
    wait_relaying(a)
    a.publish("/h", 1)
    wait_for(lambda: a.default.health()["relay_highest_global_id"] == 1, what="relay saw the message")
    h = a.health()["engine_health"]
    assert h["state"] == "ok" and h["relay"] is True and h["redis_role"] == "master"
    # stored once: by the publisher itself (then the relay skips it) or, if the relay's copy won the race, by the relay
    assert h["published"] == 1 and h["relayed"] in (0, 1)
    assert [(m.global_id, m.data) for m in a.backlog("/h", 0)] == [(1, 1)] and a.segment.global_id() == 1
    a.close()
    assert a.default.health()["relay_state"] == "off"
    assert a.default.health()["relay"] is False


def test_batch_script_writes_exactly_what_single_publishes_write(
    redis_server: Any, make_host: Callable[..., Bus]
) -> None:
    """The batch path (one Lua run per group) must leave Redis as one EVALSHA per message would."""
    a = make_host("a", redis_server.url)
    r = _r(redis_server.url)
    bridge: Any = a.default
    msgs = [
        ("/a", "a1", {}),
        ("/b", "b1", {}),
        ("/a", "a2", {"user_ids": [1, 2]}),
        ("/p|q", {"k": [1]}, {"site_id": "s"}),
        ("/a", "a3", {"max_backlog_size": 2}),
    ]
    singles = []
    for ch, data, kw in msgs:
        singles.append(a.publish(ch, data, **kw))
    before = {k: r.zrange(k, 0, -1, withscores=True) for k in sorted(r.keys("__mb_*backlog_n*"))}
    r.flushall()
    a.reset()
    with bridge.batch() as batch:
        for ch, data, kw in msgs:
            a.publish(ch, data, **kw)
    assert batch.ids == singles == [1, 1, 2, 1, 3]
    after = {k: r.zrange(k, 0, -1, withscores=True) for k in sorted(r.keys("__mb_*backlog_n*"))}
    assert after == before
    assert r.zrange("__mb_backlog_n_/a", 0, -1) == [  # the per-message size of the last publish trimmed to 2
        b'3|2|/a|{"data":"a2","user_ids":[1,2],"group_ids":null,"client_ids":null}',
        b'5|3|/a|{"data":"a3","user_ids":null,"group_ids":null,"client_ids":null}',
    ]
    assert 604_790 <= r.ttl("__mb_backlog_n_/a") <= 604_800 and r.get("__mb_global_id_n") == b"5"


def test_cli_stats_shows_the_bridge(redis_server: Any, make_host: Callable[..., Bus]) -> None:
    import json
    import subprocess
    import sys

    a = make_host("a", redis_server.url)
    a.publish("/s", 1)
    wait_for(lambda: a.health()["engine_health"]["relay"], what="a relay in this process")
    out = subprocess.run(
        [sys.executable, "-m", "shmbus", "stats", "--bus", a.name, "--redis", redis_server.url, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    view = json.loads(out.stdout)["redis"]
    assert view["role"] == "master" and view["global_id"] == 1 and view["lag"] == 0 and view["relay_active"]
    redis_server.stop()
    out = subprocess.run(
        [sys.executable, "-m", "shmbus", "stats", "--bus", a.name, "--redis", redis_server.url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and "UNREACHABLE" in out.stdout


def test_metrics_show_publishes_the_relay_and_its_lag(redis_server: Any, make_host: Callable[..., Bus]) -> None:
    from shmbus.adapters.metrics import families
    from shmbus.metrics import read_snapshot

    a, b = make_host("a", redis_server.url), make_host("b", redis_server.url)
    wait_relaying(a, b)
    for i in range(12):
        a.publish("/m", i)
    wait_for(lambda: b.segment.global_id() == 12 and a.segment.global_id() == 12, what="both hosts have 12")
    wait_for(lambda: read_snapshot(b).total("relayed") == 12, what="host b's relay counted 12 stores")
    snap_a, snap_b = read_snapshot(a), read_snapshot(b)
    assert snap_a.total("publishes") == 12 and snap_b.total("publishes") == 0  # counted once, where published
    assert snap_a.relay is not None and snap_a.relay.relay_state == "relaying"
    assert snap_b.relay is not None and snap_b.relay_lag == 0
    fams = {f.name: f for f in families(snap_b)}
    assert fams["shmbus_relay_up"].samples[0][1] == 1
    assert fams["shmbus_relayed_messages_total"].samples[0][1] == 12


def test_relay_lag_shows_the_backlog_while_the_relay_is_behind(
    redis_server: Any, make_host: Callable[..., Bus], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lag is Redis's newest id minus what the segment holds: a relay catching up on 12 messages shows 12
    (not the 1 it had in hand), and 0 once it has stored them."""
    import threading

    from shmbus.adapters.bridge import Relay, Row
    from shmbus.metrics import read_snapshot

    a = make_host("a", redis_server.url)
    wait_relaying(a)
    for i in range(12):
        a.publish("/m", i)
    late = f"{a.name[:-1]}b"
    held, release = threading.Event(), threading.Event()
    store = Relay._store

    def held_store(self: Relay, row: Row) -> None:
        if self.bus.name == late and not release.is_set():
            held.set()
            release.wait(30)  # the late host's relay stops at its first store, Redis holding 12
        store(self, row)

    monkeypatch.setattr(Relay, "_store", held_store)
    b = make_host("b", redis_server.url)
    try:
        assert held.wait(30), "the late host's relay never started its catch-up"
        snap = read_snapshot(b)
        assert snap.relay is not None and snap.global_id == 0
        assert snap.relay.relay_highest == 12 and snap.relay_lag == 12
    finally:
        release.set()
    wait_relaying(b)
    wait_for(lambda: b.segment.global_id() == 12, what="host b caught up")
    snap = read_snapshot(b)
    assert snap.relay is not None and snap.relay.relay_highest == 12 and snap.relay_lag == 0
