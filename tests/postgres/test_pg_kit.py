"""The PostgreSQL bridge on the bridge kit's rules (issue 22): loss past a trim is counted and visible, notices are
doorbells (stale, repeated or forged ones neither reset, duplicate nor inject), the segment knows it is bridged,
sizes are checked before the INSERT, a frozen server is a typed error within the timeout, and the relay's figures
tell the truth. Anything that freezes the server or adds a role runs on a private cluster."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from shmbus import Bus, PayloadTooLarge, PublishOutcomeUnknown
from shmbus.metrics import read_snapshot
from tests import harness
from tests.harness.prom import sample
from tests.harness.services import PostgresServer
from tests.harness.wait import wait_for

psycopg = harness.require_module("psycopg")
from shmbus.adapters.postgres import PostgresUnavailable  # noqa: E402

from .pg_util import dsn_for  # noqa: E402

pytestmark = pytest.mark.postgres

GEM_VALUE = '{"data":%s,"user_ids":null,"group_ids":null,"client_ids":null}'


def wait_relaying(*buses: Bus, timeout: float = 20.0) -> None:
    for bus in buses:
        wait_for(lambda b=bus: b.default.health()["relay_state"] == "relaying", timeout, f"relay of {bus.name}")


def test_a_host_down_past_the_trim_counts_the_loss_and_shows_a_gap(
    make_host: Callable[..., Bus], sql: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Host b's only process exits, host a publishes far past the global trim, b starts again: every id the table
    no longer holds is counted in relay_lost (none silently skipped) and logged in one line, and a client of b that
    was up to date before gets gap=True and exactly the rows the table kept."""
    import logging

    limits = {"max_global_backlog_size": 200}
    a = make_host("a", trim_interval=0.05, bus_options=limits)
    b = make_host("b", bus_options=limits)
    wait_relaying(a, b)
    before = [a.publish(f"/c{i % 3}", i) for i in range(30)]
    wait_for(lambda: b.segment.global_id() == before[-1], what="b up to date")
    seen = b.last_id("/c0")
    b.close()  # a rolling deploy: host b's only process exits, its segment stays
    sent = a.default.publish_many(a, [(f"/c{i % 3}", i) for i in range(1500)])
    wait_for(lambda: sql.execute("SELECT min(id) FROM message_bus").fetchone()[0] > sent[-1] - 200 - 5, what="the trim")
    kept = [r[0] for r in sql.execute("SELECT id FROM message_bus WHERE id > %s ORDER BY id", (before[-1],))]
    with caplog.at_level(logging.WARNING, "shmbus.postgres"):
        b2 = make_host("b", bus_options=limits)  # host b starts again on its old segment
        wait_relaying(b2)
        wait_for(lambda: b2.segment.global_id() == sent[-1], what="b caught up")
    gone = [r.getMessage() for r in caplog.records if "gone from the backend" in r.getMessage()]
    assert len(gone) == 1 and gone[0].startswith(f"shmbus postgres bridge: {len(sent) - len(kept)} message(s)"), gone
    held = [r.global_id for r in b2.segment.global_backlog(before[-1])]
    assert held == kept  # every row the table still had, once, in order
    assert b2.default.health()["relay_lost"] == len(sent) - len(kept)  # and every other acknowledged id counted
    back = b2.backlog("/c0", seen)
    assert back.gap, "a client of host b that missed trimmed messages must be told"
    c0 = [
        r[0] for r in sql.execute("SELECT id FROM message_bus WHERE channel = '/c0' AND id > %s ORDER BY id", (seen,))
    ]
    assert [m.message_id for m in back] == c0


def test_a_channel_trim_past_a_down_host_is_counted_too(make_host: Callable[..., Bus], sql: Any) -> None:
    """Only the channel trim bites (one busy channel, a large global limit): the 80 rows it deleted before host b
    read them count as lost and b's client of that channel gets gap=True (by count alone the segment would hold
    exactly max_backlog_size newer messages and say nothing)."""
    limits = {"max_backlog_size": 20, "max_global_backlog_size": 100_000}
    a = make_host("a", trim_interval=0.05, bus_options=limits)
    b = make_host("b", bus_options=limits)
    wait_relaying(a, b)
    seen = a.publish("/busy", "first")
    wait_for(lambda: b.last_id("/busy") == seen, what="b up to date")
    b.close()
    sent = [a.publish("/busy", i) for i in range(100)]
    wait_for(lambda: sql.execute("SELECT count(*) FROM message_bus").fetchone()[0] == 20, what="the channel trim")
    b2 = make_host("b", bus_options=limits)
    wait_relaying(b2)
    wait_for(lambda: b2.last_id("/busy") == sent[-1], what="b caught up")
    assert b2.default.health()["relay_lost"] == 80
    back = b2.backlog("/busy", seen)
    assert back.gap and [m.message_id for m in back] == sent[-20:]


def test_a_backlog_from_0_shows_the_gap_when_the_channels_start_was_trimmed(
    make_host: Callable[..., Bus], sql: Any
) -> None:
    """Ids are global, so a channel's oldest id never says it is the first: ``backlog(ch, 0)`` of a channel whose
    oldest rows a trim deleted answers gap=True from the oldest row kept (as the plain bus and the Redis bridge do),
    on a host that read them before the trim and on one that starts after it; a channel no trim touched answers
    gap=False from 1, though its first id is far above 1."""
    limits = {"max_backlog_size": 5, "max_global_backlog_size": 100_000}
    a = make_host("a", trim_interval=0.05, bus_options=limits)
    wait_relaying(a)
    a.publish("/other", "moves the ids on")
    whole = [a.publish("/whole", i) for i in range(3)]
    busy = [a.publish("/busy", i) for i in range(12)]
    wait_for(
        lambda: sql.execute("SELECT count(*) FROM message_bus WHERE channel = '/busy'").fetchone()[0] == 5,
        what="the channel trim",
    )
    late = make_host("late", bus_options=limits)  # its segment never held /busy's trimmed rows
    wait_relaying(late)
    wait_for(lambda: late.last_id("/busy") == busy[-1], what="the late host caught up")
    for host in (a, late):
        back = host.backlog("/busy", 0)
        assert back.gap and back.first_available == busy[-5], host.name
        assert [m.message_id for m in back] == busy[-5:]
        assert host.backlog("/busy", busy[-6]).gap is False  # a client that read up to the trim missed nothing
        untouched = host.backlog("/whole", 0)
        assert whole[0] > 1 and not untouched.gap and untouched.first_available == 1, host.name
        assert [m.message_id for m in untouched] == whole


def test_stale_and_repeated_notices_during_local_publishing_never_reset(
    make_host: Callable[..., Bus], sql: Any, pg: Any
) -> None:
    """300 notices naming old ids (stale, repeated, trimmed: their lines are real) while host a publishes at full
    speed: no reset on either host, every message exactly once on the other host and for a live subscriber."""
    a, b = make_host("a"), make_host("b")
    wait_relaying(a, b)
    early = [a.publish("/old", i) for i in range(20)]
    got: list[int] = []
    b.subscribe("/load", lambda m: got.append(m.message_id))
    sent: list[int] = []
    stop = threading.Event()

    def publish() -> None:
        while not stop.is_set():
            sent.append(a.publish("/load", len(sent)))  # type: ignore[arg-type]

    threads = [threading.Thread(target=publish) for _ in range(2)]  # local publishers land their own messages
    for t in threads:
        t.start()
    try:
        wait_for(lambda: len(sent) > 50, what="publishing under way")
        for i in range(300):
            old = early[i % len(early)] if i % 3 else max(sent[-1] - 5, 1)  # stale lines, and recent repeats
            line = f"{old}|{old}|/old|{GEM_VALUE % i}"
            sql.execute("SELECT pg_notify(%s, %s)", (pg["channel"], line))
            time.sleep(0.001)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    sent.sort()
    wait_for(lambda: got and got[-1] == sent[-1], what="b's subscriber got the last message")
    assert a.default.health()["resets"] == 0 and b.default.health()["resets"] == 0
    assert got == sent  # exactly once, in order
    ids = [r.global_id for r in b.segment.global_backlog(0)]
    assert ids == sorted(set(ids)) and set(sent) <= set(ids)


def hosts_and_mallory(private_pg: PostgresServer, make_host: Callable[..., Bus]) -> tuple[Bus, Bus, int]:
    """Hosts a and b on the private cluster (notify channel ``_message_bus_0``), b holding a's first message on
    /chat (its id returned), and a role ``mallory`` with CONNECT only."""
    dsn, channel = dsn_for(private_pg.url, "public"), "_message_bus_0"
    a, b = make_host("a", dsn=dsn, notify_channel=channel), make_host("b", dsn=dsn, notify_channel=channel)
    wait_relaying(a, b)
    first = a.publish("/chat", "hello")
    wait_for(lambda: b.last_id("/chat") == first, what="b has the first message")
    with psycopg.connect(private_pg.url, autocommit=True) as admin:
        admin.execute("CREATE ROLE mallory LOGIN")
    return a, b, first


def test_a_forged_notice_from_a_connect_only_role_injects_and_resets_nothing(
    private_pg: PostgresServer, make_host: Callable[..., Bus], bus_name: str
) -> None:
    """Any role with CONNECT may pg_notify. The gem stores what a notice says; the relay only reads the table
    (which that role cannot write), so a forged line is never delivered and the real message that later gets its
    id is delivered without a reset."""
    channel = "_message_bus_0"
    a, b, first = hosts_and_mallory(private_pg, make_host)
    mallory_url = private_pg.url.replace("postgres@", "mallory@")
    with psycopg.connect(mallory_url, autocommit=True) as m:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            m.execute("INSERT INTO message_bus (channel, value) VALUES ('/chat', '{}')")
        m.rollback()
        for forged in (first + 1, first, 10**9):
            line = f"{forged}|{forged}|/chat|{GEM_VALUE % json.dumps('<script>alert(1)</script>')}"
            m.execute("SELECT pg_notify(%s, %s)", (channel, line))
    time.sleep(1.0)  # the relays have rung and read (nothing)
    real = a.publish("/chat", "the real one")
    assert real == first + 1  # the id the forged line claimed
    for host in (a, b):
        wait_for(lambda h=host: h.last_id("/chat") == real, what=f"{host.name} has the real message")
        assert [m.data for m in host.backlog("/chat")] == ["hello", "the real one"]
        assert host.default.health()["resets"] == 0


def test_a_connect_only_role_can_neither_read_the_seal_key_nor_seal(
    private_pg: PostgresServer, make_host: Callable[..., Bus]
) -> None:
    """A relay stores a notified line without reading the table only when its seal verifies (made with the key in
    ``shmbus_seal_key``, for the table's history). A CONNECT-only role cannot read the key; its seals (a guessed
    key, another history, a real seal it overheard re-sent with its own line) are not stored. A seal made with the
    key is, though the table holds no such row: whoever may read the key is a writer of the bus."""
    from shmbus.adapters.bridge.seals import mac

    channel, seals = "_message_bus_0", "_message_bus_0_shmbus_seals"
    a, b, first = hosts_and_mallory(private_pg, make_host)
    with psycopg.connect(private_pg.url, autocommit=True) as admin:
        row = admin.execute("SELECT key FROM shmbus_seal_key").fetchone()
    key, history = row[0].encode(), b.segment.history_id()
    real_line = f"{first}|{first}|/chat|{GEM_VALUE % json.dumps('hello')}".encode()
    line = f"{first + 1}|{first + 1}|/chat|{GEM_VALUE % json.dumps('<script>alert(1)</script>')}".encode()
    mallory_url = private_pg.url.replace("postgres@", "mallory@")
    with psycopg.connect(mallory_url, autocommit=True) as m:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            m.execute("SELECT key FROM shmbus_seal_key")
        for tag in (
            mac("sha256", b"0" * len(key), history, [line]),  # a guessed key
            mac("sha256", key, history + 1, [line]),  # another history
            mac("sha256", key, history, [real_line]),  # the real seal of the first line
        ):
            seal = f"{first + 1}|{first + 1}|{tag.decode()}"
            m.execute("SELECT pg_notify(%s, %s), pg_notify(%s, %s)", (channel, line.decode(), seals, seal))
    time.sleep(1.0)  # the relays have rung and read (nothing)
    for host in (a, b):
        assert [m.data for m in host.backlog("/chat")] == ["hello"]
    sealed = f"{first + 1}|{first + 1}|/chat|{GEM_VALUE % json.dumps('sealed')}".encode()
    with psycopg.connect(private_pg.url, autocommit=True) as admin:
        seal = f"{first + 1}|{first + 1}|{mac('sha256', key, history, [sealed]).decode()}"
        admin.execute("SELECT pg_notify(%s, %s), pg_notify(%s, %s)", (channel, sealed.decode(), seals, seal))
        assert admin.execute("SELECT count(*) FROM message_bus WHERE id = %s", (first + 1,)).fetchone() == (0,)
    wait_for(lambda: b.last_id("/chat") == first + 1, what="b stored the sealed line")
    assert [m.data for m in b.backlog("/chat")] == ["hello", "sealed"]


def test_the_publish_procedures_seal_as_the_kit_verifies(make_host: Callable[..., Bus], pg: Any, sql: Any) -> None:
    """Both procedures send one seal per run on the seal channel (one message: a run of one; a batch of
    consecutive ids: one run), equal to the kit's ``seals.mac`` of the run's lines with the key in
    ``shmbus_seal_key`` and the table's history (else every notice would silently cost a read)."""
    from shmbus.adapters.bridge.seals import mac, seal_of

    a = make_host("a")
    wait_relaying(a)
    (key,) = sql.execute("SELECT key FROM shmbus_seal_key").fetchone()
    history = a.segment.history_id()
    seals_channel = pg["channel"] + "_shmbus_seals"
    with psycopg.connect(pg["dsn"], autocommit=True) as listener:
        listener.execute(f'LISTEN "{pg["channel"]}"')
        listener.execute(f'LISTEN "{seals_channel}"')
        first = a.publish("/s", "one")
        a.default.publish_many(a, [("/s", i) for i in range(3)])
        got = list(listener.notifies(timeout=5, stop_after=6))
    lines = {int(n.payload.split("|")[0]): n.payload.encode() for n in got if n.channel == pg["channel"]}
    seals = [seal_of(n.payload.encode()) for n in got if n.channel == seals_channel]
    assert sorted(lines) == list(range(first, first + 4))  # no other writer: the batch's ids are consecutive
    k = key.encode()
    assert seals == [
        (first, first, mac("sha256", k, history, [lines[first]])),
        (first + 1, first + 3, mac("sha256", k, history, [lines[g] for g in range(first + 1, first + 4)])),
    ]


def test_a_frozen_server_is_a_typed_error_within_the_timeout(
    private_pg: PostgresServer, make_host: Callable[..., Bus]
) -> None:
    """SIGSTOP the whole private cluster: a publish raises PublishOutcomeUnknown after command_timeout (not after
    the freeze: the CALL was sent, its reply never came), health() says unreachable, the relay notices; after
    SIGCONT both recover."""
    dsn = dsn_for(private_pg.url, "public")
    a = make_host("a", dsn=dsn, command_timeout=1.0)
    wait_relaying(a)
    a.publish("/f", "before")
    private_pg.signal(signal.SIGSTOP)
    try:
        with pytest.raises(PublishOutcomeUnknown, match="did not answer") as info:
            a.publish("/f", "frozen")
        assert (info.value.channel, info.value.backend, info.value.sent) == ("/f", "postgres", True)
        assert a.default.health()["state"] == "unreachable"
        wait_for(lambda: a.default.health()["relay_state"] != "relaying", timeout=15, what="the relay notices")
        assert a.default.health()["state"] == "unreachable"
    finally:
        private_pg.signal(signal.SIGCONT)
    wait_for(lambda: _publishes(a), timeout=20, what="publishing works again")
    assert a.default.health()["state"] == "ok"
    wait_relaying(a)


def _publishes(bus: Bus) -> bool:
    try:
        bus.publish("/f", "after")
        return True
    except (PostgresUnavailable, PublishOutcomeUnknown):
        return False


def test_an_oversized_message_raises_before_the_insert(make_host: Callable[..., Bus], sql: Any) -> None:
    a = make_host("a")
    wait_relaying(a)
    with pytest.raises(PayloadTooLarge):
        a.publish("/big", "x" * (9 << 20))
    with pytest.raises(PayloadTooLarge):
        a.default.publish_many(a, [("/big", "small"), ("/big", "x" * (9 << 20))])
    assert sql.execute("SELECT count(*) FROM message_bus").fetchone()[0] == 0  # acknowledged nothing, stored nothing


CRON = """
import sys
from shmbus import Bus, BusBridged
bus = Bus(sys.argv[1], keepalive_interval=0)  # a cron job attaches: the app made the bus
try:
    print("ID", bus.publish("/cron", sys.argv[2]), flush=True)
except BusBridged as exc:
    print("REFUSED", exc, flush=True)
print("ENGINE", type(bus.default).__name__, flush=True)
bus.close()
"""


def _cron(name: str, data: str, env: dict[str, str] | None = None) -> str:
    full = {k: v for k, v in os.environ.items() if k != "SHMBUS_ENGINE_URL"}
    full.update(env or {})
    res = subprocess.run([sys.executable, "-c", CRON, name, data], capture_output=True, text=True, timeout=60, env=full)
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_a_process_attaching_without_the_engine_publishes_through_it(
    make_host: Callable[..., Bus], sql: Any, pg: Any
) -> None:
    """A cron job's ``Bus(name).publish(...)`` on a bridged host gets the recorded engine (the URL needs no
    password): the id is the table's, every host sees it, the segment takes no local id. ``shmbus publish`` too."""
    a, b = make_host("a"), make_host("b")
    wait_relaying(a, b)
    a.publish("/cron", "worker")
    out = _cron(a.name, "from cron")
    assert "ENGINE PostgresBridge" in out, out
    mid = int(out.split("ID ")[1].split()[0])
    assert sql.execute("SELECT value FROM message_bus WHERE id = %s", (mid,)).fetchone()[0] == GEM_VALUE % '"from cron"'
    for host in (a, b):
        wait_for(lambda h=host: h.last_id("/cron") == mid, what=f"{host.name} has the cron job's message")
    res = subprocess.run(
        [sys.executable, "-m", "shmbus", "publish", "--bus", a.name, "/cron", "from the cli", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    cli_id = json.loads(res.stdout)["message_id"]
    assert sql.execute("SELECT channel FROM message_bus WHERE id = %s", (cli_id,)).fetchone()[0] == "/cron"
    wait_for(lambda: b.last_id("/cron") == cli_id, what="b has the CLI's message")


def test_without_a_usable_engine_a_publish_is_refused_and_says_what_to_set(
    make_host: Callable[..., Bus], pg: Any, sql: Any
) -> None:
    """The workers' DSN carries a password (not recorded): the cron job is refused with BusBridged naming
    SHMBUS_ENGINE_URL and takes no id; with SHMBUS_ENGINE_URL set it publishes through the bridge."""
    secret_dsn = psycopg.conninfo.make_conninfo(pg["dsn"], password="s3cret")  # trust auth: accepted, unused
    a = make_host("a", dsn=secret_dsn)
    wait_relaying(a)
    rec = a.segment.bridge()
    assert rec is not None and rec.secret and "s3cret" not in rec.url and rec.kind == "postgres"
    a.publish("/cron", "worker")
    before = a.segment.global_id()
    out = _cron(a.name, "refused")
    assert "REFUSED" in out and "SHMBUS_ENGINE_URL" in out and "postgres" in out, out
    assert a.segment.global_id() == before  # no local id was taken
    env = {"SHMBUS_ENGINE_URL": secret_dsn}
    out = _cron(a.name, "configured", env)
    assert "ID " in out, out
    mid = int(out.split("ID ")[1].split()[0])
    wait_for(lambda: a.last_id("/cron") == mid, what="a has the configured cron job's message")
    assert sql.execute("SELECT count(*) FROM message_bus").fetchone()[0] == 2


RELAY_ONLY = """
import sys, time
from shmbus import Bus
from shmbus.adapters.postgres import PostgresBridge  # noqa: E402
bus = Bus(sys.argv[1], keepalive_interval=0, create=True, engine=PostgresBridge(sys.argv[2], notify_channel=sys.argv[3],
          election_interval=0.05))
print("READY", flush=True)
time.sleep(120)
"""


def test_a_relay_without_subscriptions_and_after_a_reset_is_shown(
    make_host: Callable[..., Bus], procs: Any, bus_name: str, pg: Any, sql: Any
) -> None:
    """A process that relays but never subscribes (no listener thread) still reports: the host's figures name it
    as the relay, relaying (shmbus_relay_up, the admin page, ``shmbus top``), and again after a reset."""
    from shmbus.adapters.metrics import render

    child = procs.spawn_python(RELAY_ONLY, f"{bus_name}r", pg["dsn"], pg["channel"])
    assert child.stdout.readline().strip() == "READY"
    a = make_host("a")
    wait_relaying(a)
    looker = Bus(f"{bus_name}r", keepalive_interval=0, create=True)
    try:
        wait_for(
            lambda: (
                (s := read_snapshot(looker, exclude_self=True)).relay is not None
                and s.relay.pid == child.pid
                and s.relay.relay_state == "relaying"
            ),
            what="the child shown relaying",
        )
        assert 'shmbus_relay_up{bus="' in render(looker) and "shmbus_relay_up{" in render(looker)
        assert sample(render(looker), "shmbus_relay_up") == 1
        first = a.publish("/before", "the first history")
        wait_for(lambda: looker.last_id("/before") == first, what="host r relayed the first history")
        epoch = looker.epoch
        sql.execute("TRUNCATE message_bus RESTART IDENTITY")
        a.publish("/after", "reset")
        wait_for(lambda: looker.epoch != epoch, what="the relay reset the bus")
        wait_for(lambda: looker.last_id("/after") == 1, what="the new history relayed")
        snap = read_snapshot(looker, exclude_self=True)
        assert snap.relay is not None and snap.relay.pid == child.pid and snap.relay.relay_state == "relaying"
        assert sample(render(looker), "shmbus_relay_up") == 1
    finally:
        child.kill()
        child.wait(10)
        looker.destroy()


def test_the_doorbell_reads_notices_itself_and_keeps_those_psycopg_read(
    make_host: Callable[..., Bus], pg: Any, sql: Any
) -> None:
    """The doorbell waits on its socket and takes notices from libpq; a notice psycopg reads while the doorbell's
    connection runs a statement (the keepalive) reaches it through its notify handler (psycopg's own backlog is
    never read: it would be lost there until the idle catch-up). A connection the server ends raises, and the
    relay reconnects."""
    import psycopg

    a = make_host("a", relay=False)
    bell = a.default.backend.open_doorbell()
    try:
        assert bell.ring(0.05).top == 0
        sql.execute("SELECT pg_notify(%s, %s)", (pg["channel"], "7|7|/x|{}"))
        time.sleep(0.3)  # in the doorbell's socket, unread
        bell.keepalive()  # psycopg reads it during SELECT 1
        ring = bell.ring(0.05)
        assert (ring.top, ring.lines) == (7, [b"7|7|/x|{}"])
        sql.execute("SELECT pg_notify(%s, %s)", (pg["channel"], "8|8|/x|{}"))
        ring = bell.ring(5)
        assert (ring.top, ring.lines) == (8, [b"8|8|/x|{}"])
        sql.execute("SELECT pg_terminate_backend(%s)", (bell.conn.info.backend_pid,))
        with pytest.raises(psycopg.OperationalError):
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                bell.ring(0.5)
    finally:
        bell.close()


def test_a_single_publish_survives_its_prepared_statement_being_forgotten(make_host: Callable[..., Bus]) -> None:
    """A single publish runs a prepared CALL on libpq directly (``adapters/postgres/direct``). A server that forgot
    it (``DEALLOCATE ALL``, ``DISCARD ALL`` by a pooler) costs one more prepare, not a failed publish; and psycopg
    goes on using the same connection between direct calls."""
    a = make_host("a", relay=False)
    assert a.publish("/p", 1) == 1
    conn = a.default.backend.conn()  # this thread's: the one the publish used
    assert conn.shmbus_prepared
    conn.execute("DEALLOCATE ALL")
    assert a.publish("/p", 2) == 2
    assert conn.execute("SELECT count(*) FROM message_bus").fetchone() == (2,)
    conn.execute("DISCARD ALL")
    assert a.publish("/p", 3) == 3
    assert [m.data for m in a.backlog("/p")] == [1, 2, 3]


def test_a_publish_interrupted_mid_reply_closes_its_connection(make_host: Callable[..., Bus], monkeypatch: Any) -> None:
    """A signal while the direct call waits for its reply (KeyboardInterrupt, a worker's timeout) must not leave
    that reply for the connection's next statement to read as its own: the connection is closed, and the next
    publish makes another."""
    from psycopg import pq

    a = make_host("a", relay=False)
    assert a.publish("/i", 1) == 1
    conn = a.default.backend.conn()
    real_poller = conn.poller

    def interrupted() -> Any:
        if conn.pgconn.transaction_status == pq.TransactionStatus.ACTIVE:  # the CALL is sent, its reply unread
            raise KeyboardInterrupt
        return real_poller()  # the idle check before sending

    # the first thing after the CALL is sent (not the wait for its reply, which a reply already there skips)
    monkeypatch.setattr(conn, "poller", interrupted)
    with pytest.raises(KeyboardInterrupt):
        a.publish("/i", 2)  # the CALL was sent: it may still commit, as a publish cut off by a signal may
    assert conn.closed
    monkeypatch.undo()
    new_id = a.publish("/i", 3)
    assert new_id is not None and new_id > 1 and a.default.backend.conn() is not conn


def test_a_new_host_owes_nothing_trimmed_before_it_began(
    make_host: Callable[..., Bus], sql: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 31, 7: a new host counted the rows trimmed before it existed as its own relay_lost and logged it. It
    is owed what was published after it began relaying: 0 lost, no warning."""
    import logging

    limits = {"max_global_backlog_size": 200}
    a = make_host("a", trim_interval=0.05, bus_options=limits)
    wait_relaying(a)
    sent = a.default.publish_many(a, [(f"/c{i % 3}", i) for i in range(1500)])
    wait_for(lambda: sql.execute("SELECT min(id) FROM message_bus").fetchone()[0] > sent[-1] - 200 - 5, what="the trim")
    with caplog.at_level(logging.WARNING, "shmbus.postgres"):
        b = make_host("b", bus_options=limits)
        wait_relaying(b)
        wait_for(lambda: b.segment.global_id() == sent[-1], what="b caught up")
        assert b.default.health()["relay_lost"] == 0
        assert not [r for r in caplog.records if "gone from the backend" in r.getMessage()]


def test_a_message_landed_across_a_truncate_is_named_in_the_resets_report(
    make_host: Callable[..., Bus], sql: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 31, 7: under load a TRUNCATE delivered one message twice on a host. The cause: the procedures do not say
    which table they wrote into, so a message published just after the TRUNCATE (its id continuing the old ones)
    directly follows the segment's newest and its publisher lands it in the old epoch; the relay then resets and
    stores it again from the new table. Here the relay is held while that happens; the reset's report names it."""
    import logging

    from shmbus.adapters.postgres.doorbell import PostgresDoorbell

    a, b = make_host("a"), make_host("b")
    wait_relaying(a, b)
    got: list[tuple[int, Any]] = []
    a.subscribe("/t", lambda m: got.append((a.epoch, m.data)))
    a.publish("/t", "before")  # landed by its publisher
    read = b.publish("/t", "read")  # read by a's relay after "before": a message of the history it confirms
    wait_for(lambda: a.segment.global_id() == read, what="a's relay read b's message")
    held, release = threading.Event(), threading.Event()
    hold = threading.Event()
    ring = PostgresDoorbell.ring

    def held_ring(self: PostgresDoorbell, timeout: float) -> Any:
        if hold.is_set() and not release.is_set():
            held.set()
            release.wait(30)
        return ring(self, timeout)

    monkeypatch.setattr(PostgresDoorbell, "ring", held_ring)
    hold.set()
    assert held.wait(10), "the relay never waited on its doorbell"
    with caplog.at_level(logging.WARNING, "shmbus.postgres"):
        sql.execute("TRUNCATE message_bus")
        after = a.publish("/t", "after")  # lands in the old epoch: it follows the segment's newest
        release.set()
        wait_for(lambda: a.default.health()["resets"] == 1, what="the relay reset for the new table")
        wait_for(lambda: [d for _, d in got].count("after") == 2, what="the message stored again in the new epoch")
    resets = [m for m in (r.getMessage() for r in caplog.records) if "resetting the bus" in m and repr(a.name) in m]
    assert len(resets) == 1 and f"-{after} came after it was last confirmed" in resets[0], resets
