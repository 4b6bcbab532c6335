"""The PostgreSQL bridge on a real server: the gem's table and lines, ids every host agrees on, relaying, batches,
gap fills from the table, the HTTP protocol across hosts, and DistributedCache across hosts."""

from __future__ import annotations

import io
import json
import os
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from wsgiref.util import setup_testing_defaults

import pytest

from shmbus import Bus, DistributedCache
from tests import harness
from tests.harness.wait import wait_for

psycopg = harness.require_module("psycopg")
from shmbus.adapters.postgres.bridge import PostgresBridge  # noqa: E402

pytestmark = pytest.mark.postgres


def wait_relaying(*buses: Bus, timeout: float = 20.0) -> None:
    for bus in buses:
        wait_for(lambda b=bus: b.default.health()["relay_state"] == "relaying", timeout, f"relay of {bus.name}")


def ids(bus: Bus, channel: str) -> list[int]:
    return [m.message_id for m in bus.backlog(channel)]


def test_the_table_statements_and_lines_are_the_gems(make_host: Callable[..., Bus], sql: Any, pg: Any) -> None:
    a = make_host("a")
    wait_relaying(a)
    listener = psycopg.connect(pg["dsn"], autocommit=True)
    listener.execute(f'LISTEN "{pg["channel"]}"')
    mid = a.publish("/t|x", {"n": 1}, user_ids=[5])
    mid2 = a.publish("/t", "plain", site_id="site9")
    cols = sql.execute(
        "SELECT column_name, data_type, is_nullable, column_default FROM information_schema.columns "
        "WHERE table_name = 'message_bus' AND table_schema = %s ORDER BY ordinal_position",
        (pg["schema"],),
    ).fetchall()
    assert [(c[0], c[1], c[2]) for c in cols] == [
        ("id", "bigint", "NO"),
        ("channel", "text", "NO"),
        ("value", "text", "NO"),
        ("added_at", "timestamp without time zone", "NO"),
    ]
    assert cols[0][3].startswith("nextval(") and cols[3][3] == "CURRENT_TIMESTAMP"
    indexes = {r[0] for r in sql.execute("SELECT indexname FROM pg_indexes WHERE schemaname = %s", (pg["schema"],))}
    assert {"table_channel_id_index", "table_added_at_index", "message_bus_pkey"} <= indexes
    check = sql.execute(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = 'message_bus'::regclass AND contype='c'"
    ).fetchone()[0]
    assert "octet_length(value) >= 2" in check
    rows = sql.execute("SELECT id, channel, value FROM message_bus ORDER BY id").fetchall()
    assert rows == [
        (mid, "/t|x", '{"data":{"n":1},"user_ids":[5],"group_ids":null,"client_ids":null}'),
        (mid2, "/t$|$site9", '{"data":"plain","user_ids":null,"group_ids":null,"client_ids":null}'),
    ]
    notes = [n.payload for n in listener.notifies(timeout=2, stop_after=2)]
    assert notes == [
        f'{mid}|{mid}|/t$$123$$x|{{"data":{{"n":1}},"user_ids":[5],"group_ids":null,"client_ids":null}}',
        # the gem escapes every '|' of the backend name, the site separator's too
        f'{mid2}|{mid2}|/t$$$123$$$site9|{{"data":"plain","user_ids":null,"group_ids":null,"client_ids":null}}',
    ]
    listener.close()


def test_two_hosts_see_the_same_messages_with_the_same_ids(make_host: Callable[..., Bus], sql: Any) -> None:
    a, b = make_host("a"), make_host("b")
    wait_relaying(a, b)
    sent = []
    for i in range(40):
        host = a if i % 3 else b
        ch = f"/c{i % 4}"
        sent.append((host.publish(ch, i), ch))
    top = max(s[0] for s in sent)
    wait_for(lambda: a.segment.global_id() == top and b.segment.global_id() == top, what="both hosts caught up")
    table = sql.execute("SELECT id, channel FROM message_bus ORDER BY id").fetchall()
    assert [(r[0], r[1]) for r in table] == sorted(sent)
    for ch in ("/c0", "/c1", "/c2", "/c3"):
        want = sorted(i for i, c in sent if c == ch)
        assert ids(a, ch) == ids(b, ch) == want  # sparse per channel: the table's ids
        assert a.last_id(ch) == b.last_id(ch) == want[-1]
        for k, after in enumerate(want):  # any position on either host: the rest, no false gap
            bl = b.backlog(ch, after)
            assert [m.message_id for m in bl] == want[k + 1 :] and not bl.gap
    got: list[Any] = []
    b.subscribe("/c1", got.append, last_id=-3)  # the gem's look-behind counts messages, not ids
    assert [m.message_id for m in got] == [i for i, c in sorted(sent) if c == "/c1"][-2:]


def test_a_gem_publisher_is_seen_with_its_ids(make_host: Callable[..., Bus], sql: Any, pg: Any) -> None:
    """Rows written with the gem's own statements (insert_message, then publish = pg_notify of its line)."""
    a = make_host("a")
    wait_relaying(a)
    got: list[Any] = []
    a.subscribe("/ruby", got.append)
    value = '{"data":{"from":"ruby"},"user_ids":null,"group_ids":[3],"client_ids":null}'
    rid = sql.execute(
        "INSERT INTO message_bus (channel, value) VALUES (%s, %s) RETURNING id", ("/ruby", value)
    ).fetchone()[0]
    sql.execute("SELECT pg_notify(%s, %s)", (pg["channel"], f"{rid}|{rid}|/ruby|{value}"))
    wait_for(lambda: got, what="the gem's message")
    m = got[0]
    assert (m.global_id, m.message_id, m.data, m.group_ids) == (rid, rid, {"from": "ruby"}, [3])
    # a row whose notice was lost is caught up with the next notice (the table is the history)
    quiet = sql.execute(
        "INSERT INTO message_bus (channel, value) VALUES ('/ruby', %s) RETURNING id", (value,)
    ).fetchone()[0]
    loud = a.publish("/ruby", "after")
    wait_for(lambda: len(got) == 3, what="catch-up of the unnotified row")
    assert [x.message_id for x in got] == [rid, quiet, loud]


class GemPeer:
    """tests/postgres/gem_peer.rb: a Ruby process publishing and subscribing through the gem's postgres backend."""

    def __init__(self, gem_dir: Path, conninfo: str, db: str) -> None:
        env = dict(os.environ, MESSAGE_BUS_GEM_DIR=str(gem_dir), MB_CONNINFO=conninfo, MB_DB=db)
        self.proc = subprocess.Popen(
            ["ruby", str(Path(__file__).with_name("gem_peer.rb"))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        assert self.read() == {"ready": True}

    def read(self) -> Any:
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        assert line, f"the Ruby peer exited with {self.proc.wait(5)}"
        return json.loads(line)

    def ask(self, *command: Any) -> Any:
        self.proc.stdin.write(json.dumps(command) + "\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        return self.read()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write(json.dumps(["quit"]) + "\n")  # type: ignore[union-attr]
            self.proc.stdin.close()  # type: ignore[union-attr]
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def test_the_ruby_gem_itself(make_host: Callable[..., Bus], pg: Any, bus_name: str) -> None:
    """The gem's postgres backend in a Ruby process and shmbus on one table: each sees the other's messages,
    live and in backlogs, with the same ids, targets and sites."""
    gem_dir = harness.message_bus_gem(
        "test_the_table_statements_and_lines_are_the_gems and test_a_gem_publisher_is_seen_with_its_ids"
    )
    db = bus_name.lower()  # the gem's notify channel is "_message_bus_<db>"
    a = make_host("a", notify_channel=f"_message_bus_{db}")
    wait_relaying(a)
    peer = GemPeer(gem_dir, pg["dsn"], db)
    try:
        live: list[Any] = []
        a.subscribe("/interop", live.append)
        targets: list[dict[str, Any]] = [{}, {"user_ids": [7]}, {}]
        ruby_ids = [peer.ask("publish", "/interop", {"n": i}, targets[i])["id"] for i in range(3)]
        python_ids = [a.publish("/interop", {"n": 10 + i}, group_ids=[3] if i == 0 else None) for i in range(3)]
        ruby_ids.append(peer.ask("publish", "/interop", {"n": 3}, {})["id"])
        wait_for(lambda: len(live) == 7, what="the Python host hears all seven")
        ours = [(m.message_id, m.data) for m in live]
        assert [i for i, _ in ours] == sorted(ruby_ids[:3] + python_ids + ruby_ids[3:])
        assert [d["n"] for _, d in ours] == [0, 1, 2, 10, 11, 12, 3]
        assert live[1].user_ids == [7] and live[3].group_ids == [3]
        heard = peer.ask("received", "/interop", 7, 20)["received"]
        assert [(g, m, d) for g, m, d, _, _ in heard] == [(i, i, d) for i, d in ours]  # same ids, global = channel
        assert heard[1][3] == [7]
        backlog = peer.ask("backlog", "/interop", 0)
        assert [(i, d) for i, d, _ in backlog["backlog"]] == ours
        assert [(m.message_id, m.data) for m in a.backlog("/interop")] == ours
        assert backlog["last_id"] == a.last_id("/interop") == ruby_ids[-1]
        # sites: the gem's "$|$" encoding, both ways
        site_id = peer.ask("publish", "/interop", "from ruby", {"site_id": "s1"})["id"]
        mine = a.publish("/interop", "from python", site_id="s1")
        assert [(m.message_id, m.data) for m in a.backlog("/interop", site_id="s1")] == [
            (site_id, "from ruby"),
            (mine, "from python"),
        ]
        assert peer.ask("received", "/interop", 9, 20)["received"][7:] == [
            [site_id, site_id, "from ruby", None, "s1"],
            [mine, mine, "from python", None, "s1"],
        ]
    finally:
        peer.close()


def test_publish_many_is_one_statement_in_order(make_host: Callable[..., Bus], sql: Any) -> None:
    a, b = make_host("a"), make_host("b")
    wait_relaying(a, b)
    bridge: PostgresBridge = a.default  # type: ignore[assignment]
    items = [(f"/m{i % 3}", i, {"user_ids": [i]} if i % 5 == 0 else {}) for i in range(2500)]
    out = bridge.publish_many(a, items)
    assert out == sorted(out) and len(set(out)) == 2500
    wait_for(lambda: b.segment.global_id() == out[-1], what="b caught up")
    recs = b.segment.global_backlog(0)
    assert [r.global_id for r in recs] == out
    assert [int(r.payload) for r in recs] == list(range(2500))
    targeted = [m for m in b.backlog("/m0") if m.user_ids]
    assert targeted and all(m.user_ids == [int(m.data)] for m in targeted)  # targeting travels in a batch


def test_a_message_too_long_for_notify_travels_through_the_table(make_host: Callable[..., Bus]) -> None:
    a, b = make_host("a"), make_host("b", relay=True)
    wait_relaying(a, b)
    big = "x" * 20000
    mid = a.publish("/big", big)
    wait_for(lambda: b.last_id("/big") == mid, what="the long message on host b")
    assert b.backlog("/big")[0].data == big


def test_a_late_host_fills_older_messages_from_the_table(make_host: Callable[..., Bus]) -> None:
    a = make_host("a")
    wait_relaying(a)
    early = [a.publish("/old", i) for i in range(10)]
    late = make_host("late", bus_options={"max_backlog_size": 1000})
    wait_relaying(late)
    wait_for(lambda: late.last_id("/old") == early[-1], what="catch-up")
    bl = late.backlog("/old", early[3])
    assert [m.message_id for m in bl] == early[4:] and not bl.gap


def test_reads_cost_no_query_when_the_segment_has_the_data(make_host: Callable[..., Bus], sql: Any) -> None:
    a = make_host("a")
    wait_relaying(a)
    for i in range(20):
        a.publish("/r", i)
    bridge: PostgresBridge = a.default  # type: ignore[assignment]
    queries = {"n": 0}
    real = bridge.postgres.conn

    reader = threading.current_thread()

    def counting() -> Any:
        if threading.current_thread() is reader:  # the relay's own reads and trims are not the reads under test
            queries["n"] += 1
        return real()

    bridge.postgres.conn = counting  # type: ignore[method-assign]
    for after in range(0, 20):
        a.backlog("/r", a.backlog("/r")[after].message_id if after else 0)
    a.last_id("/r")
    assert queries["n"] == 0  # every read above came from shared memory


def _poll(bus: Bus, channel: str, last: int) -> list[dict[str, Any]]:
    from shmbus.adapters import wsgi

    app = wsgi.MessageBusMiddleware(bus=bus)
    body = f"{channel}={last}".encode()
    env: dict[str, Any] = {}
    setup_testing_defaults(env)
    env.update(
        REQUEST_METHOD="POST",
        PATH_INFO="/message-bus/client1/poll",
        QUERY_STRING="dlp=t",
        CONTENT_TYPE="application/x-www-form-urlencoded",
        CONTENT_LENGTH=str(len(body)),
    )
    env["wsgi.input"] = io.BytesIO(body)
    status: list[str] = []
    out = b"".join(app(env, lambda s, h, e=None: status.append(s)))
    assert status == ["200 OK"], (status, out)
    return json.loads(out)  # type: ignore[no-any-return]


def test_a_client_hopping_hosts_over_http_misses_nothing_and_sees_nothing_twice(make_host: Callable[..., Bus]) -> None:
    a, b = make_host("a"), make_host("b")
    wait_relaying(a, b)
    last, seen, sent = 0, [], []
    for rnd in range(6):
        for k in range(4):
            (b if k % 2 else a).publish("/noise", k)  # other channels' ids make /h's ids sparse
            sent.append(((b if k % 2 else a).publish("/h", f"{rnd}.{k}"), f"{rnd}.{k}"))
        poll = a if rnd % 2 else b
        wait_for(lambda p=poll: p.last_id("/h") == sent[-1][0], what="relay")
        for m in _poll(poll, "/h", last):
            if m["channel"] == "/h":
                seen.append((m["message_id"], m["data"]))
                last = m["message_id"]
            else:
                assert m["channel"] != "/__status", m  # no false gap or reset reported
    assert seen == sent
    status = _poll(a, "/h", -1)  # "from now, tell me the id": the gem's status with the real last id
    assert status == [{"global_id": -1, "message_id": -1, "channel": "/__status", "data": {"/h": sent[-1][0]}}]
    behind = _poll(b, "/h", -3)  # the last two
    assert [m["data"] for m in behind] == [sent[-2][1], sent[-1][1]]


def test_distributed_cache_across_hosts(make_host: Callable[..., Bus]) -> None:
    a, b = make_host("a"), make_host("b")
    wait_relaying(a, b)
    ca, cb = DistributedCache("settings", bus=a), DistributedCache("settings", bus=b)
    ca["theme"] = "dark"
    wait_for(lambda: cb.get("theme") == "dark", what="the cache entry on host b")
    del cb["theme"]
    wait_for(lambda: ca.get("theme") is None, what="the delete on host a")


def test_health_close_and_codec_check(make_host: Callable[..., Bus], pg: Any, bus_name: str) -> None:
    a = make_host("a")
    wait_relaying(a)
    a.publish("/h", 1)
    h = a.health()["engine_health"] if "engine_health" in a.health() else a.default.health()
    assert h["state"] == "ok" and h["relay"] is True and h["in_recovery"] is False and "password" not in h["dsn"]
    with pytest.raises(ValueError, match="json codec"):
        Bus(f"{bus_name}m", codec="msgpack", keepalive_interval=0, engine=PostgresBridge(pg["dsn"]), create=True)
    Bus(f"{bus_name}m", keepalive_interval=0, create=True).destroy()


def test_the_relay_trims_as_the_gem_does(make_host: Callable[..., Bus], sql: Any) -> None:
    """After a trim pass the table holds what the gem's per-publish trims leave: each channel's newest
    max_backlog_size rows, and nothing at or below the newest id minus max_global_backlog_size."""
    a = make_host("a", trim_interval=0.05, bus_options={"max_backlog_size": 5, "max_global_backlog_size": 30})
    wait_relaying(a)
    singles = [a.publish("/single", i) for i in range(12)]
    bridge: PostgresBridge = a.default  # type: ignore[assignment]
    batched = bridge.publish_many(a, [("/batch", i) for i in range(12)] + [("/single", 99)])

    def table(ch: str) -> list[int]:
        return [r[0] for r in sql.execute("SELECT id FROM message_bus WHERE channel = %s ORDER BY id", (ch,))]

    wait_for(lambda: len(table("/single")) == 5 and len(table("/batch")) == 5, what="the channel trims")
    assert table("/single") == (singles + batched[-1:])[-5:]
    assert table("/batch") == batched[:12][-5:]
    spread = [a.publish(f"/g{i}", i) for i in range(40)]  # 40 channels of one row: only the global trim bites
    wait_for(lambda: sql.execute("SELECT min(id) FROM message_bus").fetchone()[0] > spread[-1] - 30, what="global")
    assert sql.execute("SELECT count(*) FROM message_bus WHERE channel LIKE '/g%'").fetchone()[0] == 30


def test_metrics_show_publishes_the_relay_and_its_lag(make_host: Callable[..., Bus]) -> None:
    from shmbus.metrics import read_snapshot

    a, b = make_host("a"), make_host("b")
    wait_relaying(a, b)
    for i in range(7):
        a.publish("/m", i)
    with a.default.batch():
        for i in range(5):
            a.publish("/m", i)
    top = a.last_id("/m")
    wait_for(lambda: b.segment.global_id() == top, what="host b caught up")
    wait_for(lambda: read_snapshot(b).total("relayed") == 12, what="host b's relay counted 12 stores")
    snap_a, snap_b = read_snapshot(a), read_snapshot(b)
    assert snap_a.total("publishes") == 12 and snap_b.total("publishes") == 0
    assert snap_b.relay is not None and snap_b.relay.relay_state == "relaying" and snap_b.relay_lag == 0
    assert snap_b.sparse_ids


def test_relay_lag_shows_the_backlog_while_the_relay_is_behind(
    make_host: Callable[..., Bus], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lag is the table's newest id minus what the segment holds: a relay catching up on 12 rows shows 12
    (not the 1 it had in hand), and 0 once it has stored them."""
    import threading

    from shmbus.adapters.bridge import Relay, Row
    from shmbus.metrics import read_snapshot

    a = make_host("a")
    wait_relaying(a)
    for i in range(12):
        a.publish("/m", i)
    top = a.last_id("/m")
    late = f"{a.name[:-1]}b"
    held, release = threading.Event(), threading.Event()
    store = Relay._store

    def held_store(self: Relay, row: Row) -> None:
        if self.bus.name == late and not release.is_set():
            held.set()
            release.wait(30)  # the late host's relay stops at its first store, the table holding 12 rows
        store(self, row)

    monkeypatch.setattr(Relay, "_store", held_store)
    b = make_host("b")
    try:
        assert held.wait(30), "the late host's relay never started its catch-up"
        snap = read_snapshot(b)
        assert snap.relay is not None and snap.global_id == 0
        assert snap.relay.relay_highest == top and snap.relay_lag == top >= 12
    finally:
        release.set()
    wait_relaying(b)
    wait_for(lambda: b.segment.global_id() == top, what="host b caught up")
    snap = read_snapshot(b)
    assert snap.relay is not None and snap.relay.relay_highest == top and snap.relay_lag == 0


GEM_VALUE = '{"data":"%s","user_ids":null,"group_ids":null,"client_ids":null}'


def test_a_row_committed_out_of_id_order_is_relayed_in_id_order(
    make_host: Callable[..., Bus], sql: Any, pg: Any
) -> None:
    """Ids are drawn at INSERT and rows appear at COMMIT: a gem publisher whose commit is slow (its own
    connection, a transaction still open) holds an id below one that shmbus commits after it. Every host must
    wait for it, not skip it: both rows, in id order, nothing counted lost."""
    a, b = make_host("a"), make_host("b")
    wait_relaying(a, b)
    first = a.publish("/o", "first")  # the relays' position is a real id, so a missing id after it is a hole
    wait_for(lambda: b.segment.global_id() == first, what="b has the first message")
    slow = psycopg.connect(pg["dsn"])  # a transaction of its own, as the gem's connection under a slow fsync
    try:
        early = slow.execute(
            "INSERT INTO message_bus (channel, value) VALUES ('/o', %s) RETURNING id", (GEM_VALUE % "early",)
        ).fetchone()[0]
        late = a.publish("/o", "late")
        assert late > early
        time.sleep(0.5)  # far longer than the old 0.1 s settle: the relays see the hole meanwhile
        slow.commit()
        sql.execute("SELECT pg_notify(%s, %s)", (pg["channel"], f"{early}|{early}|/o|{GEM_VALUE % 'early'}"))
    finally:
        slow.close()
    for host in (a, b):
        wait_for(lambda h=host: ids(h, "/o") == [first, early, late], what=f"all three on {host.name}")
        assert [m.data for m in host.backlog("/o")] == ["first", "early", "late"]
        assert host.default.health()["relay_lost"] == 0


def test_many_final_holes_cost_no_wait_each(make_host: Callable[..., Bus], sql: Any) -> None:
    """200 rolled-back inserts, each below a committed row: a catch-up across them finishes within a second and
    counts nothing lost (a rolled-back id is no message)."""
    a = make_host("a")
    wait_relaying(a)
    first = a.publish("/f", "first")
    wait_for(lambda: a.default.health()["relay_highest_global_id"] == first, what="the relay at the first id")
    kept = []
    for i in range(200):
        with pytest.raises(RuntimeError), sql.transaction():
            sql.execute("INSERT INTO message_bus (channel, value) VALUES ('/f', %s)", (GEM_VALUE % "gone",))
            raise RuntimeError("roll back")
        row = sql.execute(  # committed without a notice: only a catch-up finds it
            "INSERT INTO message_bus (channel, value) VALUES ('/f', %s) RETURNING id", (GEM_VALUE % i,)
        ).fetchone()
        kept.append(row[0])
    began = time.monotonic()
    last = a.publish("/f", "last")  # its notice starts the catch-up across the 200 holes
    wait_for(lambda: a.segment.global_id() == last, what="the catch-up")
    took = time.monotonic() - began
    # not a speed claim: a wait per hole, even 50 ms each, would take 10 s; the catch-up takes well under 1 s
    assert took < 10.0, f"catch-up across 200 final holes took {took:.2f} s"
    assert ids(a, "/f")[-201:] == [*kept, last]
    assert a.default.health()["relay_lost"] == 0


def test_a_hole_held_past_hole_timeout_counts_as_lost_and_later_ids_move_on(
    make_host: Callable[..., Bus], sql: Any, pg: Any
) -> None:
    a = make_host("a", hole_timeout=0.3)
    wait_relaying(a)
    first = a.publish("/t", "first")
    wait_for(lambda: a.default.health()["relay_highest_global_id"] == first, what="the relay at the first id")
    stuck = psycopg.connect(pg["dsn"])
    try:
        stuck.execute("INSERT INTO message_bus (channel, value) VALUES ('/t', %s)", (GEM_VALUE % "stuck",))
        late = a.publish("/t", "late")
        wait_for(lambda: ids(a, "/t") == [first, late], what="the later id past the timed-out hole")
        assert a.default.health()["relay_lost"] == 1
        after = a.publish("/t", "after")
        wait_for(lambda: ids(a, "/t") == [first, late, after], what="the next message")
    finally:
        stuck.rollback()
        stuck.close()


def test_the_spark_source_offsets_wait_for_rows_still_in_flight(
    make_host: Callable[..., Bus], sql: Any, pg: Any
) -> None:
    """The Spark source's newest offset (``last_ids``) must not pass a row that commits after a higher id: a batch
    read up to it would miss the row, and the next batch starts after it."""
    import threading

    from shmbus.adapters.spark.readers import Location, PostgresReader

    a = make_host("a")
    wait_relaying(a)
    first = a.publish("/sp", "first")
    reader = PostgresReader(Location(postgres_dsn=pg["dsn"], postgres_channel=pg["channel"]))
    slow = psycopg.connect(pg["dsn"])
    got: list[Any] = []
    try:
        early = slow.execute(
            "INSERT INTO message_bus (channel, value) VALUES ('/sp', %s) RETURNING id", (GEM_VALUE % "early",)
        ).fetchone()[0]
        late = a.publish("/sp", "late")

        def batch() -> None:  # what a micro-batch does: the newest offset, then the rows up to it
            upto = reader.last_ids(["/sp"])["/sp"]
            got.append(reader.read("/sp", first, upto).message_ids)

        t = threading.Thread(target=batch)
        t.start()
        time.sleep(0.3)
        slow.commit()
        t.join(10)
    finally:
        slow.close()
        reader.close()
    assert got == [[early, late]]
