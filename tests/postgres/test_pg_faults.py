"""The PostgreSQL bridge under faults: the relay SIGKILLed under load (real processes), the server restarted under
load (a private cluster), a read-only server, and the table reset or truncated."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from shmbus import Bus, PublishOutcomeUnknown
from tests import harness
from tests.harness.services import PostgresServer, find_postgres_bindir
from tests.harness.wait import wait_for

psycopg = harness.require_module("psycopg")
from shmbus.adapters.postgres import PostgresReadOnly, PostgresUnavailable  # noqa: E402

from .pg_util import dsn_for  # noqa: E402

pytestmark = pytest.mark.postgres

CHILD = """
import os, sys, time
from shmbus import Bus
from shmbus.adapters.postgres import PostgresBridge  # noqa: E402
bus = Bus(sys.argv[1], keepalive_interval=0, create=True,
          engine=PostgresBridge(sys.argv[2], notify_channel=sys.argv[3]))  # the default election_interval
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


def wait_relaying(*buses: Bus, timeout: float = 20.0) -> None:
    for bus in buses:
        wait_for(lambda b=bus: b.default.health()["relay_state"] == "relaying", timeout, f"relay of {bus.name}")


class _Lines:
    """``(tag, pid)`` lines printed by children, read on threads (``at``: when each arrived, monotonic)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []
        self.at: list[float] = []
        self.cond = threading.Condition()

    def follow(self, proc: Any) -> None:
        def read() -> None:
            for line in proc.stdout:
                parts = line.split()
                if len(parts) == 2 and parts[1].isdigit():
                    with self.cond:
                        self.seen.append((parts[0], int(parts[1])))
                        self.at.append(time.monotonic())
                        self.cond.notify_all()

        threading.Thread(target=read, daemon=True).start()

    def wait(self, tag: str, count: int = 1, timeout: float = 30.0) -> list[int]:
        with self.cond:
            ok = self.cond.wait_for(lambda: len([p for t, p in self.seen if t == tag]) >= count, timeout)
            assert ok, f"fewer than {count} {tag} lines within {timeout}s: {self.seen}"
            return [p for t, p in self.seen if t == tag][:count]


@pytest.mark.slow
def test_sigkill_of_the_relay_under_load_loses_and_doubles_nothing(
    make_host: Callable[..., Bus], procs: Any, bus_name: str, pg: Any
) -> None:
    a = make_host("a")
    wait_relaying(a)
    lines = _Lines()
    children = [procs.spawn_python(CHILD, f"{bus_name}b", pg["dsn"], pg["channel"]) for _ in range(3)]
    for c in children:
        lines.follow(c)
    assert set(lines.wait("READY", 3)) == {c.pid for c in children}
    first_relay = lines.wait("RELAY")[0]
    n = 1500
    sent: list[int] = []
    killed_at: list[float] = []

    def publish() -> None:
        for i in range(1, n + 1):
            sent.append(a.publish(f"/k{i % 3}", i))  # type: ignore[arg-type]
            if i == n // 3:
                killed_at.append(time.monotonic())
                os.kill(first_relay, signal.SIGKILL)
            time.sleep(0.0005)

    t = threading.Thread(target=publish)
    t.start()
    second = lines.wait("RELAY", 2)[1]
    t.join(120)
    assert not t.is_alive() and second != first_relay
    relaying_again = lines.at[[i for i, (tag, _) in enumerate(lines.seen) if tag == "RELAY"][1]]
    took_over = relaying_again - killed_at[0]  # from the kill to another process relaying (caught up)
    reader = Bus(f"{bus_name}b", keepalive_interval=0, create=True)
    try:
        wait_for(lambda: reader.segment.global_id() == sent[-1], timeout=60, what="host b caught up")
        recs = reader.segment.global_backlog(0)
        assert [r.global_id for r in recs] == sent  # every message once, in order, with the table's ids
        assert [int(r.payload) for r in recs] == list(range(1, n + 1))
    finally:
        for c in children:
            if c.pid != first_relay:
                c.kill()
            c.wait(10)
        reader.destroy()
    print(f"relay takeover: another process relaying {took_over:.2f} s after the kill")
    assert took_over < 1.0, f"the takeover took {took_over:.2f} s (the issue: within a second)"


@pytest.mark.slow
def test_server_restart_under_load_errors_clearly_and_recovers(make_host: Callable[..., Bus], bus_name: str) -> None:
    bindir = find_postgres_bindir()
    if bindir is None:
        harness.skip_or_fail("no initdb/postgres binaries for a private PostgreSQL to restart")
    server = PostgresServer(bindir).start()
    try:
        dsn = dsn_for(server.url, "public")
        a, b = make_host("a", dsn=dsn, connect_timeout=1), make_host("b", dsn=dsn, connect_timeout=1)
        wait_relaying(a, b)
        ok: list[int] = []
        errors: list[BaseException] = []
        stop = threading.Event()

        def publish() -> None:
            i = 0
            while not stop.is_set():
                i += 1
                try:
                    ok.append(a.publish("/load", i))  # type: ignore[arg-type]
                except (PostgresUnavailable, PublishOutcomeUnknown) as exc:  # stopped mid-CALL: outcome unknown
                    errors.append(exc)
                    time.sleep(0.02)
                time.sleep(0.001)

        t = threading.Thread(target=publish)
        t.start()
        wait_for(lambda: len(ok) > 100, what="publishing under way")
        server.stop()
        wait_for(lambda: errors, what="a clear error while the server is down")
        assert a.default.health()["state"] == "unreachable"
        server.restart()
        n = len(ok)
        wait_for(lambda: len(ok) > n + 100, timeout=30, what="publishes succeed again")
        stop.set()
        t.join(30)
        assert "unreachable" in str(errors[0]) or "reply was not read" in str(errors[0])
        assert a.default.health()["state"] == "ok"
        wait_for(lambda: b.segment.global_id() >= ok[-1], timeout=30, what="host b caught up after the restart")
        held = {r.global_id for r in b.segment.global_backlog(0)}
        assert set(ok) <= held  # every publish that returned an id reached the other host
        wait_for(lambda: b.default.health()["relay_state"] == "relaying", what=f"b relaying {b.default.health()}")
    finally:
        server.close()


def test_a_read_only_server_is_a_typed_error_and_in_health(make_host: Callable[..., Bus], pg: Any) -> None:
    a = make_host("a")
    wait_relaying(a)
    a.publish("/ro", "before")
    ro_dsn = psycopg.conninfo.make_conninfo(
        pg["dsn"], options=f"-c search_path={pg['schema']} -c default_transaction_read_only=on"
    )
    ro = make_host("ro", dsn=ro_dsn, relay=False)
    with pytest.raises(PostgresReadOnly, match="read-only"):
        ro.publish("/ro", "refused")
    engine = ro.default.health()
    assert engine["state"] == "readonly" and "read-only" in engine["error"]
    assert "readonly" in str(ro.health())  # bus.health() carries the engine's report


def test_a_table_reset_gives_the_bus_a_new_epoch(make_host: Callable[..., Bus], sql: Any) -> None:
    a, b = make_host("a"), make_host("b")
    wait_relaying(a, b)
    for i in range(5):
        a.publish("/e", i)
    wait_for(lambda: b.last_id("/e") == 5, what="b caught up")
    epoch = b.epoch
    sql.execute("TRUNCATE message_bus RESTART IDENTITY")  # what the gem's reset! amounts to: ids restart at 1
    mid = a.publish("/e", "after the reset")
    assert mid == 1
    wait_for(lambda: b.epoch != epoch, what="a new epoch on host b")
    wait_for(lambda: [m.data for m in b.backlog("/e")] == ["after the reset"], what="the new history on host b")
    assert b.default.health()["resets"] >= 1


def test_a_read_only_server_is_in_health_before_any_publish_and_still_relayed(
    make_host: Callable[..., Bus], pg: Any
) -> None:
    """A relay on a read-only server (here a primary with default_transaction_read_only: a real standby also
    refuses LISTEN, which a primary cannot show) reports ``readonly`` at once, skips the trims the server would
    refuse, and relays what writable hosts publish."""
    a = make_host("a")
    wait_relaying(a)
    ro_dsn = psycopg.conninfo.make_conninfo(
        pg["dsn"], options=f"-c search_path={pg['schema']} -c default_transaction_read_only=on"
    )
    ro = make_host("ro", dsn=ro_dsn)
    wait_relaying(ro)
    engine = ro.default.health()
    assert engine["state"] == "readonly" and "read-only" in engine["error"] and engine["in_recovery"] is False
    mid = a.publish("/ro", "from the primary")
    wait_for(lambda: ro.last_id("/ro") == mid, what="the message relayed on the read-only host")
    time.sleep(1.2)  # a trim pass (trim_interval 1 s) must not knock the relay over
    assert ro.default.health()["relay_state"] == "relaying"


@pytest.mark.parametrize("drop", ["DROP TABLE message_bus", "DROP PROCEDURE shmbus_send"])
def test_publishes_and_relays_recover_from_dropped_objects(make_host: Callable[..., Bus], sql: Any, drop: str) -> None:
    a, b = make_host("a"), make_host("b")
    wait_relaying(a, b)
    before = a.publish("/d", "before")
    wait_for(lambda: b.last_id("/d") == before, what="b has the first message")
    sql.execute(drop)
    mid = a.publish("/d", "after")  # the objects are recreated and the publish runs again
    if drop.startswith("DROP TABLE"):
        assert mid == 1  # a new table: ids restart, every host resets
    wait_for(lambda: [m.data for m in b.backlog("/d")][-1:] == ["after"], what="the new message on host b")
    again = a.publish("/d", "again")
    wait_for(lambda: b.last_id("/d") == again, what="host b keeps relaying")
    assert a.default.health()["state"] == "ok"


def test_a_message_the_segment_refused_once_is_stored_on_the_next_catch_up(make_host: Callable[..., Bus]) -> None:
    a, b = make_host("a"), make_host("b")
    wait_relaying(a, b)
    real = b.store
    failed: list[int] = []

    def flaky(envelope: Any, **kw: Any) -> int:
        if not failed:
            failed.append(kw["global_id"])
            raise RuntimeError("segment trouble")
        return real(envelope, **kw)

    b.store = flaky  # type: ignore[method-assign]
    mid = a.publish("/s", "kept")
    wait_for(lambda: b.segment.global_id() == mid, what="the message in host b's segment after the relay restarted")
    assert failed == [mid] and [r.global_id for r in b.segment.global_backlog(0)] == [mid]


@pytest.mark.slow
def test_a_plain_truncate_under_load_resets_the_bus(make_host: Callable[..., Bus], sql: Any) -> None:
    """TRUNCATE without RESTART IDENTITY: ids go on, and under load the relay is never quiet; it still notices."""
    a, b = make_host("a"), make_host("b")
    wait_relaying(a, b)
    stop = threading.Event()
    sent: list[int] = []

    def publish() -> None:
        while not stop.is_set():
            sent.append(a.publish("/load", len(sent)))  # type: ignore[arg-type]
            time.sleep(0.005)

    t = threading.Thread(target=publish)
    t.start()
    try:
        wait_for(lambda: len(sent) > 50 and b.segment.global_id() >= sent[50], what="load relayed")
        epoch = b.epoch
        sql.execute("TRUNCATE message_bus")
        wait_for(lambda: b.epoch != epoch, what="a new epoch on host b while publishing goes on")
        assert t.is_alive() and b.default.health()["resets"] >= 1
    finally:
        stop.set()
        t.join(30)
    wait_for(lambda: b.segment.global_id() == sent[-1], what="host b caught up after the reset")


def test_a_standby_is_reported_read_only_by_the_relay_without_a_publish(
    make_host: Callable[..., Bus], pg: Any, sql: Any
) -> None:
    """A standby, as far as a primary can play one: transactions read-only, and ``pg_is_in_recovery()`` true (a
    function of the test's schema, searched before pg_catalog). A real standby also refuses LISTEN, which a primary
    cannot show; the relay checks recovery before LISTEN, so it never gets that far."""
    a = make_host("a")
    wait_relaying(a)  # the table exists
    sql.execute("CREATE FUNCTION pg_is_in_recovery() RETURNS boolean LANGUAGE sql AS 'SELECT true'")
    standby_dsn = psycopg.conninfo.make_conninfo(
        pg["dsn"], options=f"-c search_path={pg['schema']},pg_catalog -c default_transaction_read_only=on"
    )
    sb = make_host("sb", dsn=standby_dsn)
    wait_for(lambda: sb.default.health()["in_recovery"] is True, what="the relay's recovery check")
    engine = sb.default.health()
    assert engine["state"] == "readonly" and "recovery" in engine["error"]
    assert engine["relay_state"] != "relaying"
    with pytest.raises(PostgresReadOnly):
        sb.publish("/sb", "refused")
