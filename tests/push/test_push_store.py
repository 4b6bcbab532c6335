"""The durable stores: where they are chosen, that a killed writer leaves them whole, that a stale sender cannot
move the cursor, and that the PostgreSQL store and elector behave like the file ones."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from shmbus import Bus
from shmbus.adapters.bridge.election import RelayElection
from shmbus.adapters.push import FileElector, FileStore, StaleSender, VapidKeys, store_for
from shmbus.adapters.push.devservice import PushService
from shmbus.adapters.push.subscriptions import parse_registration

from .push_util import LOCAL

WRITER = """
import sys, time
from shmbus.adapters.push import FileStore, Registration
store = FileStore(sys.argv[1])
i = 0
print("go", flush=True)
while True:
    store.add(Registration(f"https://push.example/{i}", "k", "a", i, ("/c",), None, time.time()))
    i += 1
"""


def test_killed_writer_leaves_the_file_store_whole(procs: Any, tmp_path: Path) -> None:
    base = str(tmp_path / "push")
    seen = 0
    for round_ in range(6):
        child = procs.spawn_python(WRITER, base)
        assert child.stdout.readline().strip() == "go"
        time.sleep(0.05 + 0.03 * round_)  # somewhere inside a write: fsyncs make each one take a while
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=10)
        regs = FileStore(base).all()  # parses: never a torn file
        ids = sorted(r.user_id for r in regs)
        assert ids == list(range(len(ids)))  # a prefix of the writes: none lost in the middle
        assert len(ids) >= seen
        seen = len(ids)
    assert seen > 0


def test_stale_sender_cannot_move_the_cursor(tmp_path: Path) -> None:
    store = FileStore(str(tmp_path / "push"))
    old = store.take_over("a:1")
    new = store.take_over("b:2")
    new.cursor = 5
    store.save(new)
    old.cursor = 9
    with pytest.raises(StaleSender):
        store.save(old)
    assert store.load().cursor == 5 and store.load().leader == "b:2"


def test_store_for_picks_the_durable_place(bus_name: str, tmp_path: Path) -> None:
    shm = Bus(bus_name, keepalive_interval=0, ring_size=1 << 20, create=True)
    try:
        with pytest.raises(ValueError, match="no durable place"):
            store_for(shm)
    finally:
        shm.destroy()
    filed = Bus(bus_name + "f", keepalive_interval=0, ring_size=1 << 20, path=str(tmp_path / "bus"), create=True)
    try:
        store = store_for(filed)
        assert isinstance(store, FileStore) and store.base == str(tmp_path / "bus") + ".push-default"
    finally:
        filed.destroy()


def test_file_elector_one_holder_released_on_death(procs: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "sender.lock")
    child = procs.spawn_python(
        "import sys, time\nfrom shmbus.adapters.push import FileElector\n"
        "e = FileElector(sys.argv[1]); print(e.try_acquire(), flush=True); time.sleep(60)\n",
        path,
    )
    assert child.stdout.readline().strip() == "True"
    mine = FileElector(path)
    assert not mine.try_acquire()
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=10)
    assert mine.try_acquire() and mine.held()
    mine.release()
    assert not mine.held()


def test_file_elector_is_the_bridge_kits_election(tmp_path: Path) -> None:
    """One host-local election in the code base: the push sender's lock is the kit's, seen by its probe."""
    path = str(tmp_path / "sender.lock")
    sender = FileElector(path)
    assert sender.try_acquire() and sender.try_acquire(), "taking a lock this elector holds is a no-op"
    probe = RelayElection(path)
    try:
        assert probe.running() and not probe.try_take()
        sender.release()
        assert not sender.held() and not probe.running()
        assert probe.try_take() and not FileElector(path).try_acquire()
    finally:
        probe.close()


def test_postgres_store_and_elector(pg_dsn: str, push_service: PushService) -> None:
    from shmbus.adapters.push.pgstore import PostgresElector, PostgresStore

    dsn = pg_dsn
    store, other = PostgresStore(dsn), PostgresStore(dsn, "other-app")
    a, b = PostgresElector(dsn), PostgresElector(dsn)
    try:
        vapid = VapidKeys.generate("mailto:x@example.com")
        sub = push_service.subscribe(vapid.public_key)
        v0 = store.version()
        store.add(parse_registration({"subscription": sub, "topics": ["/c"]}, "7", "s", lambda _c: True, LOCAL, 1.0))
        assert store.version() != v0
        (reg,) = store.all()
        assert (reg.user_id, reg.topics, reg.site_id, reg.endpoint) == ("7", ("/c",), "s", sub["endpoint"])
        assert store.of_user(7) == [] and store.of_user("7") == [reg]  # "7" is not 7, as in targeting
        assert other.all() == []  # namespaces are separate
        assert not store.remove(sub["endpoint"], user_id=8) and store.remove(sub["endpoint"], user_id="7")
        old = store.take_over("a:1")
        new = store.take_over("b:2")
        new.cursor = 3
        store.save(new)
        with pytest.raises(StaleSender):
            store.save(old)
        assert a.try_acquire() and not b.try_acquire()
        a.release()
        assert b.try_acquire() and b.held()
    finally:
        for closer in (a.release, b.release, store.close, other.close):
            closer()
