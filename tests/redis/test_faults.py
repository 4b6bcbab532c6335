"""Redis bridge under faults: relay SIGKILL (real processes), Redis restart/stop, read-only replica, fork."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from shmbus import Bus, EngineError, PublishOutcomeUnknown
from shmbus.adapters.redis import RedisReadOnly, RedisUnavailable
from tests.harness.services import RedisServer

from .bridge_util import wait_for, wait_relaying

pytestmark = pytest.mark.redis

CHILD = """
import os, sys, time
from shmbus import Bus
from shmbus.adapters.redis import RedisBridge
bus = Bus(sys.argv[1], keepalive_interval=0, create=True, engine=RedisBridge(sys.argv[2], election_interval=0.1))
bridge = bus.default
print("READY", os.getpid(), flush=True)
was = False
while True:
    now = bridge.health()["relay_state"] == "relaying"
    if now and not was:
        print("RELAY", os.getpid(), flush=True)
    was = now
    time.sleep(0.005)
"""


class _Lines:
    """Collects ``(tag, pid)`` lines printed by children, from reader threads (pipes never fill up)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []
        self.cond = threading.Condition()

    def follow(self, proc: subprocess.Popen[str]) -> None:
        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                parts = line.split()
                if len(parts) == 2 and parts[1].isdigit():
                    with self.cond:
                        self.seen.append((parts[0], int(parts[1])))
                        self.cond.notify_all()

        threading.Thread(target=read, daemon=True).start()

    def pids(self, tag: str) -> list[int]:
        with self.cond:
            return [pid for t, pid in self.seen if t == tag]

    def wait(self, tag: str, count: int = 1, timeout: float = 30.0) -> list[int]:
        """The pids of the first ``count`` lines tagged ``tag`` (waiting for them)."""
        with self.cond:
            if not self.cond.wait_for(lambda: len(self.pids(tag)) >= count, timeout):
                raise AssertionError(f"fewer than {count} {tag} lines from the children within {timeout}s: {self.seen}")
            return self.pids(tag)[:count]


def _segment_records(bus: Bus) -> list[tuple[int, int, bytes, bytes]]:
    return [(r.global_id, r.message_id, r.channel, r.payload) for r in bus.segment.global_backlog(0)]


@pytest.mark.slow
def test_sigkill_of_the_relay_under_load_loses_and_doubles_nothing(
    redis_server: Any, make_host: Callable[..., Bus], plain_bus: Callable[[str], Bus], procs: Any, bus_name: str
) -> None:
    a = make_host("a", redis_server.url)
    wait_relaying(a)
    lines = _Lines()
    children = [procs.spawn_python(CHILD, f"{bus_name}b", redis_server.url) for _ in range(3)]
    for c in children:
        lines.follow(c)
    assert set(lines.wait("READY", 3)) == {c.pid for c in children}
    first_relay = lines.wait("RELAY")[0]
    n = 3000
    killed_at = n // 3
    new_relay: list[int] = []

    def publish() -> None:
        for i in range(1, n + 1):
            a.publish(f"/k{i % 3}", i)
            if i == killed_at:
                os.kill(first_relay, signal.SIGKILL)
            time.sleep(0.0005)

    t = threading.Thread(target=publish)
    t.start()
    new_relay.append(lines.wait("RELAY", 2)[1])
    t.join(120)
    assert not t.is_alive()
    assert new_relay[0] != first_relay and new_relay[0] in {c.pid for c in children}
    reader = plain_bus("b")
    wait_for(lambda: reader.segment.global_id() == n, timeout=60, what=f"host b to reach global id {n}")
    recs = _segment_records(reader)
    assert [r[0] for r in recs] == list(range(1, n + 1))  # every id once, in order
    per_channel: dict[bytes, list[int]] = {}
    for gid, mid, ch, payload in recs:
        assert int(payload) == gid  # message i is global id i: nothing reordered or swapped
        per_channel.setdefault(ch, []).append(mid)
    for mids in per_channel.values():
        assert mids == list(range(1, len(mids) + 1))
    for c in children:
        if c.pid != first_relay:
            c.kill()
        c.wait(10)


@pytest.mark.slow
def test_redis_restart_under_load_keeps_what_redis_kept(redis_server: Any, make_host: Callable[..., Bus]) -> None:
    a = make_host("a", redis_server.url)
    b = make_host("b", redis_server.url)
    wait_relaying(a, b)
    epoch = b.epoch
    errors: list[BaseException] = []
    stop = threading.Event()
    after_restart = threading.Event()
    ok_after = [0]

    def publish() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            try:
                a.publish(f"/r{i % 2}", i)
                if after_restart.is_set():
                    ok_after[0] += 1
            except (EngineError, PublishOutcomeUnknown) as exc:  # killed mid-reply: the outcome is unknown
                errors.append(exc)
                time.sleep(0.01)

    t = threading.Thread(target=publish)
    t.start()
    wait_for(lambda: b.segment.global_id() > 300, what="load before the restart")
    redis_server.kill()
    time.sleep(0.3)  # an outage of some length, not synchronisation
    redis_server.start()
    after_restart.set()
    wait_for(lambda: ok_after[0] > 300, what="publishes after the restart")
    stop.set()
    t.join(30)
    assert errors and all(isinstance(e, (RedisUnavailable, PublishOutcomeUnknown)) for e in errors)
    r = redis.Redis.from_url(redis_server.url, protocol=2)
    kept = [int(s) for _, s in r.zrange("__mb_global_backlog_n", 0, -1, withscores=True)]
    assert kept and kept[0] == 1 and kept == list(range(1, len(kept) + 1))
    wait_for(lambda: b.segment.global_id() == kept[-1], what="host b caught up after the restart")
    assert b.epoch != epoch  # ids went backwards: clients are told to resynchronise
    recs = _segment_records(b)
    assert [x[0] for x in recs] == kept
    for gid, mid, ch, payload in recs:
        line = r.zrangebyscore(f"__mb_backlog_n_{ch.decode()}", mid, mid)[0]
        assert line.startswith(f"{gid}|{mid}|".encode()) and b'"data":' + payload + b"," in line


def test_redis_stopped_publish_errors_clearly_and_the_bus_recovers(
    redis_server: Any, make_host: Callable[..., Bus]
) -> None:
    a, b = make_host("a", redis_server.url), make_host("b", redis_server.url)
    wait_relaying(a, b)
    assert a.publish("/s", 1) == 1
    redis_server.stop()
    with pytest.raises(RedisUnavailable, match="unreachable") as info:
        a.publish("/s", 2)
    assert isinstance(info.value, EngineError)
    assert str(redis_server.port) in str(info.value)
    h = a.health()["engine_health"]
    assert h["state"] == "unreachable" and "Error" in h["last_error"]
    wait_for(lambda: b.default.health()["relay_state"] == "reconnecting", what="relay notices the outage")
    redis_server.start()
    wait_relaying(b)  # reconnected by itself
    assert a.publish("/s", 3) == 1  # an empty Redis: ids restart, and the bus follows
    wait_for(lambda: [m.data for m in b.backlog("/s")] == [3], what="message after recovery on host b")
    assert a.health()["engine_health"]["state"] == "ok"


def test_queue_in_memory_flushes_in_order_when_redis_returns(redis_server: Any, make_host: Callable[..., Bus]) -> None:
    a = make_host("a", redis_server.url, queue_in_memory=True, max_in_memory_publish_backlog=3)
    b = make_host("b", redis_server.url)
    wait_relaying(a, b)
    redis_server.stop()
    assert [a.publish("/q", i) for i in range(4)] == [None] * 4
    h = a.default.health()
    assert h["queued"] == 3 and h["dropped_from_queue"] == 1  # bounded: the oldest went
    redis_server.start()
    wait_for(lambda: [m.data for m in b.backlog("/q")] == [1, 2, 3], what="queued messages flushed in order")
    assert [m.message_id for m in b.backlog("/q")] == [1, 2, 3]
    assert a.default.health()["queued"] == 0


def test_read_only_replica_is_reported_and_queued_publishes_flush_after_promotion(
    redis_server: Any, make_host: Callable[..., Bus]
) -> None:
    replica = RedisServer(redis_server.binary)
    try:
        replica.start()
        rr = redis.Redis.from_url(replica.url, protocol=2)
        rr.execute_command("REPLICAOF", "127.0.0.1", str(redis_server.port))
        wait_for(lambda: rr.info("replication").get("master_link_status") == "up", what="replication link")
        a = make_host("a", replica.url)
        q = make_host("q", replica.url, queue_in_memory=True)
        wait_relaying(a, q)
        with pytest.raises(RedisReadOnly, match="read-only replica"):
            a.publish("/ro", 1)
        h = a.health()["engine_health"]
        assert h["state"] == "readonly" and h["redis_role"] == "slave" and "ReadOnly" in h["last_error"]
        assert q.publish("/ro", "queued") is None
        assert q.default.health()["queued"] == 1
        rr.execute_command("REPLICAOF", "NO", "ONE")  # failover done: the replica is the primary now
        wait_for(lambda: [m.data for m in q.backlog("/ro")] == ["queued"], what="flush after promotion")
        assert a.publish("/ro", 2) == 2
        assert a.health()["engine_health"]["state"] == "ok"
    finally:
        replica.close()


def test_a_forked_child_neither_shares_nor_steals_the_relay_lock(
    redis_server: Any, make_host: Callable[..., Bus]
) -> None:
    a = make_host("a", redis_server.url)
    wait_relaying(a)
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: the inherited bridge restarted itself (after_fork) with a lock fd of its own
        code = 1
        try:
            bridge: Any = a.default
            deadline = time.monotonic() + 1.0
            relay_while_parent_holds = False
            while time.monotonic() < deadline:
                relay_while_parent_holds |= bridge.health()["relay"]
                time.sleep(0.01)
            os.write(w1, b"N" if not relay_while_parent_holds else b"Y")
            os.read(r2, 1)  # the parent released the lock
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and bridge.health()["relay_state"] != "relaying":
                time.sleep(0.01)
            os.write(w1, b"T" if bridge.health()["relay_state"] == "relaying" else b"F")
            bridge.close()
            code = 0
        finally:
            os._exit(code)
    try:
        assert os.read(r1, 1) == b"N"  # while the parent lives it stays the relay, alone
        assert a.default.health()["relay"] is True
        a.default.close()  # releases the lock
        os.write(w2, b"x")
        assert os.read(r1, 1) == b"T"  # the child took over
    finally:
        deadline = time.monotonic() + 10
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                break
            time.sleep(0.01)
        for fd in (r1, w1, r2, w2):
            os.close(fd)
