"""Exactly one sender across processes and hosts, and what its cursor admits when a sender is killed.

* Two "hosts" (two bus names bridged through one PostgreSQL table, as in the bridge's tests), four worker
  processes each, every one running a PushConnector on the PostgreSQL store: each device gets each message once,
  also after the sender is SIGKILLed and another process (maybe on the other host) takes over.
* One host with a file store: a sender SIGKILLed in the middle of a slow batch is replaced; every push is made
  (no loss), and the only repeats are of messages above the cursor it had saved (the documented window).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from shmbus import Bus
from shmbus.adapters.push import FileStore, VapidKeys
from shmbus.adapters.push.devservice import PushService
from shmbus.adapters.push.subscriptions import parse_registration
from tests.harness.wait import wait_for

from .push_util import LOCAL

WORKER = str(Path(__file__).with_name("push_worker.py"))


def _workers(procs: Any, n: int, cfg: dict[str, Any]) -> list[subprocess.Popen[str]]:
    started = [procs.spawn([sys.executable, WORKER, json.dumps(cfg)], stdout=subprocess.PIPE, text=True)
               for _ in range(n)]  # fmt: skip
    for p in started:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return started


def _register(store: Any, push_service: PushService, vapid: VapidKeys, users: list[Any]) -> list[dict[str, Any]]:
    subs = []
    for uid in users:
        sub = push_service.subscribe(vapid.public_key)
        store.add(parse_registration({"subscription": sub, "topics": ["/c"]}, uid, None, lambda _c: True, LOCAL, 0.0))
        subs.append(sub)
    return subs


def _leader_pid(store: Any) -> int:
    return int(store.load().leader.rsplit(":", 1)[1]) if store.load().leader else 0


def test_one_push_per_device_across_two_hosts_and_a_takeover(
    pg_dsn: str, bus_name: str, procs: Any, push_service: PushService, vapid: VapidKeys, tmp_path: Path
) -> None:
    from shmbus.adapters.postgres import PostgresBridge
    from shmbus.adapters.push.pgstore import PostgresStore

    channel = f"_mb_{bus_name}"
    hosts = [Bus(f"{bus_name}h{i}", keepalive_interval=0, engine=PostgresBridge(pg_dsn, notify_channel=channel,
                                                                                 election_interval=0.05), create=True)
             for i in (1, 2)]  # fmt: skip
    store = PostgresStore(pg_dsn)
    pem = tmp_path / "vapid.pem"
    pem.write_bytes(vapid.private_pem())
    try:
        subs = _register(store, push_service, vapid, [1, 1, 2, 3])
        for host in hosts:
            _workers(procs, 4, {"bus": host.name, "dsn": pg_dsn, "notify_channel": channel, "vapid_pem": str(pem)})
        wait_for(lambda: _leader_pid(store) and store.load().updated, what="a sender started")
        # the leader is one of the eight workers (on either host), and only one process ever sends per term
        expected: dict[str, set[str]] = {s["endpoint"]: set() for s in subs}

        def publish(tag: str, n: int) -> None:
            for i in range(n):
                to = [1] if i % 3 == 0 else None
                hosts[i % 2].publish(f"/c/{i % 4}", f"{tag}{i}", user_ids=to)
                for sub, uid in zip(subs, [1, 1, 2, 3], strict=True):
                    if to is None or uid in to:
                        expected[sub["endpoint"]].add(f"{tag}{i}")

        def delivered() -> int:
            return len(push_service.deliveries)

        publish("a", 30)
        wait_for(lambda: delivered() == sum(map(len, expected.values())), timeout=30, what="phase 1 pushes")
        last = max(h.segment.global_id() for h in hosts)
        wait_for(lambda: (store.load().cursor or 0) >= last, timeout=15, what="the cursor settled")
        first_leader = _leader_pid(store)
        term = store.load().term
        os.kill(first_leader, signal.SIGKILL)
        wait_for(lambda: store.load().term > term and _leader_pid(store) != first_leader, timeout=15,
                 what="a takeover")  # fmt: skip
        publish("b", 30)
        wait_for(lambda: delivered() == sum(map(len, expected.values())), timeout=30, what="phase 2 pushes")
        time.sleep(0.5)  # a duplicate would arrive now
        per = Counter((d.token, d.payload["data"]) for d in push_service.deliveries)
        assert max(per.values()) == 1, [k for k, v in per.items() if v > 1]
        got = {s["endpoint"]: {d.payload["data"] for d in push_service.received(s)} for s in subs}
        assert got == expected
        assert push_service.refusals == []
    finally:
        store.close()
        for host in hosts:
            host.destroy()


def test_sender_killed_mid_batch_resumes_within_the_cursor_window(
    bus: Bus, procs: Any, push_service: PushService, vapid: VapidKeys, tmp_path: Path
) -> None:
    store = FileStore(str(tmp_path / "push"))
    pem = tmp_path / "vapid.pem"
    pem.write_bytes(vapid.private_pem())
    subs = _register(store, push_service, vapid, list(range(8)))
    for sub in subs:
        push_service.set_mode(sub, "slow", arg=0.02)  # 20 ms per push: the batch takes seconds
    cfg = {"bus": bus.name, "store": store.base, "vapid_pem": str(pem), "workers_per_service": 2, "max_in_flight": 8}
    (first,) = _workers(procs, 1, cfg)
    wait_for(lambda: _leader_pid(store) == first.pid and store.load().updated, what="the first sender started")
    n = 40
    for i in range(n):
        bus.publish(f"/c/{i % 3}", i)
    wait_for(lambda: len(push_service.deliveries) >= 60, timeout=30, what="part of the batch pushed")
    os.kill(first.pid, signal.SIGKILL)
    first.wait(timeout=10)
    cursor = store.load().cursor
    done_before = Counter((d.token, d.payload["global_id"]) for d in push_service.deliveries)
    assert cursor is not None and 0 < cursor < bus.segment.global_id(), "killed mid-batch"
    (second,) = _workers(procs, 1, cfg)
    wait_for(lambda: len({(d.token, d.payload["global_id"]) for d in push_service.deliveries}) == n * len(subs),
             timeout=60, what="every push made")  # fmt: skip
    wait_for(lambda: store.load().cursor == bus.segment.global_id(), timeout=10, what="the cursor at the end")
    per = Counter((d.token, d.payload["global_id"]) for d in push_service.deliveries)
    repeated = {gid for (_t, gid), count in per.items() if count > 1}
    assert all(gid > cursor for gid in repeated), (cursor, sorted(repeated))  # nothing at or below it again
    assert all(count <= 2 for count in per.values())
    # the window: messages in flight at the kill (max_in_flight) plus what settled after the last save
    assert len(repeated) <= 8 + len({gid for (_t, gid) in done_before if gid > cursor})
    second.send_signal(signal.SIGTERM)
    second.wait(timeout=15)
    assert store.load().counters["sent"] >= n * len(subs) - sum(done_before.values())
