"""The NATS JetStream bridge on a real server: ids are the stream's sequences and every host agrees, batches,
catch-up within the stream's retention and the loss past it, a stream deleted or purged, oversized messages
refused before sending, forged deliveries, and the engine built from its URL."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from shmbus import Bus, DistributedCache
from shmbus.adapters.nats import NatsBridge, NatsBridgeError
from shmbus.adapters.nats import jetstream as js
from shmbus.adapters.nats.layout import channel_subject, split_data
from shmbus.adapters.nats.protocol import pub_op
from shmbus.engine_urls import engine_from_url
from shmbus.message import Message
from tests.harness.wait import wait_for

from .conftest import js_conn, private_server

pytestmark = pytest.mark.nats


def wait_relaying(*buses: Bus, timeout: float = 20.0) -> None:
    for bus in buses:
        wait_for(lambda b=bus: b.default.health()["relay_state"] == "relaying", timeout, f"relay of {bus.name}")


def gids(bus: Bus) -> list[int]:
    return [m.global_id for m in bus.global_backlog(0)]


def stream_state(url: str, stream: str) -> dict[str, Any]:
    conn = js_conn(url)
    try:
        info = js.stream_info(conn, stream)
        return info["state"] if info else {}
    finally:
        conn.close()


def test_two_hosts_agree_on_ids_that_are_the_stream_sequences(
    make_host: Callable[..., Bus], nats_url: str, bus_name: str
) -> None:
    a, b = make_host("a"), make_host("b")
    wait_relaying(a, b)
    on_b: list[Message] = []
    b.subscribe(None, on_b.append)
    mids = [
        (a if i % 3 else b).publish(f"/c{i % 4}", {"i": i}, user_ids=[i] if i % 5 == 0 else None) for i in range(30)
    ]
    assert mids == list(range(1, 31))  # a message's id is its global id (sparse ids)
    wait_for(lambda: len(on_b) == 30, what="30 messages on host b")
    wait_for(lambda: a.segment.global_id() == 30, what="host a complete")
    assert [m.global_id for m in on_b] == list(range(1, 31))
    assert gids(a) == gids(b) == list(range(1, 31))
    assert [m.data for m in b.backlog("/c1")] == [{"i": i} for i in range(30) if i % 4 == 1]
    assert on_b[5].user_ids == [5]
    assert stream_state(nats_url, bus_name)["last_seq"] == 30
    conn = js_conn(nats_url)
    found = js.get_message(conn, bus_name, 7)
    conn.close()
    assert found is not None and found[0] == channel_subject(f"shmbus.{bus_name}", "/c2").decode()  # its own subject
    assert split_data(found[1]) == (
        "/c2",
        b'{"data":{"i":6},"user_ids":null,"group_ids":null,"client_ids":null}',
    )


def test_a_batch_gets_consecutive_ids_and_reaches_the_other_host(make_host: Callable[..., Bus]) -> None:
    a, b = make_host("a"), make_host("b")
    wait_relaying(a, b)
    a.publish("/x", 0)
    ids = a.default.publish_many(a, [(f"/b{i % 7}", {"n": i}) for i in range(2500)])  # type: ignore[union-attr]
    assert ids == list(range(2, 2502))
    wait_for(lambda: b.segment.global_id() == 2501, 60, "the batch on host b")
    assert b.default.health()["relay_lost"] == 0  # type: ignore[union-attr]
    assert [m.data for m in b.backlog("/b3")] == [{"n": i} for i in range(2500) if i % 7 == 3]


def test_a_new_host_catches_up_from_the_stream(make_host: Callable[..., Bus]) -> None:
    a = make_host("a")
    wait_relaying(a)
    for i in range(50):
        a.publish("/late", i)
    b = make_host("b")
    wait_for(lambda: b.segment.global_id() == 50, what="host b caught up")
    assert [m.data for m in b.backlog("/late")] == list(range(50))
    assert b.default.health()["relay_lost"] == 0  # type: ignore[union-attr]


def test_a_host_away_past_the_retention_reports_what_it_can_no_longer_read(
    make_host: Callable[..., Bus], nats_url: str, bus_name: str
) -> None:
    a = make_host("a", max_msgs=20)
    b = make_host("b", max_msgs=20)
    wait_relaying(a, b)
    a.publish("/r", "first")
    wait_for(lambda: b.segment.global_id() == 1, what="host b has the first message")
    b.close()  # host b goes away; its segment stays
    for i in range(60):
        a.publish("/r", i)
    assert stream_state(nats_url, bus_name)["first_seq"] == 42  # the stream kept the newest 20
    b2 = make_host("b", max_msgs=20)  # host b again, on the same segment
    wait_for(lambda: b2.segment.global_id() == 61, what="host b caught up again")
    assert b2.default.health()["relay_lost"] == 40  # type: ignore[union-attr]  # ids 2..41: gone before it read them
    backlog = b2.backlog("/r")
    assert backlog.gap and [m.data for m in backlog] == list(range(40, 60))  # from the first it could read


def test_a_purge_counts_the_purged_ids_as_lost(make_host: Callable[..., Bus], nats_url: str, bus_name: str) -> None:
    a, b = make_host("a"), make_host("b")
    wait_relaying(a, b)
    a.publish("/p", 0)
    wait_for(lambda: b.segment.global_id() == 1, what="host b has message 1")
    b.close()
    for i in range(10):
        a.publish("/p", i + 1)
    conn = js_conn(nats_url)
    js.api(conn, f"STREAM.PURGE.{bus_name}")
    conn.close()
    assert a.publish("/p", "after") == 12  # a purge keeps the sequence going
    b2 = make_host("b")
    wait_for(lambda: b2.segment.global_id() == 12, what="host b past the purge")
    assert b2.default.health()["relay_lost"] == 10  # type: ignore[union-attr]
    assert b2.default.health()["resets"] == 0  # type: ignore[union-attr]  # the same history


def test_a_stream_deleted_and_recreated_resets_every_host(
    make_host: Callable[..., Bus], nats_url: str, bus_name: str
) -> None:
    a, b = make_host("a"), make_host("b")
    wait_relaying(a, b)
    for i in range(5):
        a.publish("/d", i)
    wait_for(lambda: b.segment.global_id() == 5, what="host b has the first history")
    conn = js_conn(nats_url)
    js.api(conn, f"STREAM.DELETE.{bus_name}")
    conn.close()
    assert a.publish("/d", "new") == 1  # the publish makes the stream again (2 s after): ids start over
    wait_for(lambda: b.default.health()["resets"] >= 1, 30, "host b reset")  # type: ignore[union-attr]
    wait_for(lambda: [m.data for m in b.backlog("/d")] == ["new"], 30, "host b holds the new history only")
    wait_for(lambda: [m.data for m in a.backlog("/d")] == ["new"], 30, "host a holds the new history only")


def test_a_message_over_the_servers_max_payload_is_refused_before_sending(
    make_host: Callable[..., Bus], bus_name: str
) -> None:
    server = private_server(max_payload=4096)
    try:
        a = make_host("a", url=server.url)
        wait_relaying(a)
        a.publish("/big", "small")
        with pytest.raises(NatsBridgeError, match="max_payload"):
            a.default.publish_many(a, [("/big", "x"), ("/big", "y" * 5000)])  # type: ignore[union-attr]
        assert stream_state(server.url, bus_name)["last_seq"] == 1  # nothing of the batch was sent
        assert a.publish("/big", "after") == 2
    finally:
        for bus in (a,):
            bus.destroy()
        server.close()


def test_forged_deliveries_on_the_doorbell_store_nothing(
    make_host: Callable[..., Bus], nats_url: str, bus_name: str
) -> None:
    a, b = make_host("a"), make_host("b")
    wait_relaying(a, b)
    a.publish("/f", "real")
    wait_for(lambda: b.segment.global_id() == 1, what="host b has the real message")
    conn = js_conn(nats_url)
    listing = js.api(conn, f"CONSUMER.LIST.{bus_name}")
    bells = [c["config"]["deliver_subject"] for c in listing["consumers"] if c["config"].get("deliver_subject")]
    assert len(bells) == 2  # one doorbell per host's relay
    for bell in bells:
        for k in range(50):
            forged = f'2|2|/f|{{"data":"forged {k}","user_ids":null,"group_ids":null,"client_ids":null}}'.encode()
            # the server refuses a reply subject under $JS.ACK from a client: a forger can only send others
            reply = b"$JS.ACKS.%s.x.1.%d.1.1.0" % (bus_name.encode(), 2 + k) if k % 2 else b""
            conn.send(pub_op(bell.encode(), reply, forged))
    conn.ping()
    conn.close()
    assert a.publish("/f", "second") == 2
    wait_for(lambda: b.segment.global_id() == 2, what="host b has the second real message")
    assert [m.data for m in b.backlog("/f")] == [m.data for m in a.backlog("/f")] == ["real", "second"]


def test_the_engine_is_built_from_its_url(nats_url: str, bus_name: str) -> None:
    engine = engine_from_url(nats_url, options={"stream": bus_name})
    assert isinstance(engine, NatsBridge) and engine.stream == bus_name and not engine.may_relay
    rec = engine.backend.record()
    assert (rec.kind, rec.url, rec.secret, rec.options) == ("nats", nats_url, False, {"stream": bus_name})
    custom = NatsBridge(nats_url, stream=bus_name, subject="app.bus").backend.record()
    assert custom.options == {"stream": bus_name, "subject": "app.bus"}
    rebuilt = engine_from_url(nats_url, options=custom.options)
    assert isinstance(rebuilt, NatsBridge) and rebuilt.subject == "app.bus"
    secret = NatsBridge("nats://u:pw@127.0.0.1:1", stream=bus_name).backend.record()
    assert secret.secret and "pw" not in secret.url and json.dumps(secret.options) == json.dumps({"stream": bus_name})


def test_a_message_on_the_subject_that_is_not_a_bridge_line_is_skipped_and_counted(
    make_host: Callable[..., Bus], nats_url: str, bus_name: str
) -> None:
    """Whoever may publish to the stream's subject writes into the bus; what is not a line is counted, never
    delivered, and never stops the relay."""
    a, b = make_host("a"), make_host("b")
    wait_relaying(a, b)
    conn = js_conn(nats_url)
    for junk in (b"garbage", b"/ok|not json", b"\xff\xfe|{}"):
        assert b'"seq"' in conn.request(f"shmbus.{bus_name}.junk".encode(), junk).payload
    conn.close()
    assert a.publish("/after", "real") == 4
    wait_for(lambda: b.segment.global_id() == 4, what="host b past the junk")
    assert [m.data for m in b.backlog("/after")] == ["real"]
    assert b.default.health()["unrelayable"] == 3  # type: ignore[union-attr]


def test_the_stream_keeps_each_channels_newest_max_backlog_size(
    make_host: Callable[..., Bus], nats_url: str, bus_name: str
) -> None:
    """One subject per channel: the stream trims a busy channel to its newest ``max_msgs_per_channel`` and keeps a
    quiet one's; a host that comes back reads the quiet message and reports the busy channel's trimmed ones."""
    a = make_host("a", max_msgs_per_channel=5, max_msgs=1000)
    b = make_host("b", max_msgs_per_channel=5, max_msgs=1000)
    wait_relaying(a, b)
    a.publish("/busy", -1)
    wait_for(lambda: b.segment.global_id() == 1, what="host b has the first message")
    b.close()
    a.publish("/quiet", "kept")
    for i in range(20):
        a.publish("/busy", i)
    assert stream_state(nats_url, bus_name)["messages"] == 6  # 5 of /busy, 1 of /quiet
    b2 = make_host("b", max_msgs_per_channel=5, max_msgs=1000)
    wait_for(lambda: b2.segment.global_id() == 22, what="host b caught up")
    assert [m.data for m in b2.backlog("/quiet")] == ["kept"]
    busy = b2.backlog("/busy")
    assert busy.gap and [m.data for m in busy] == list(range(15, 20))
    assert b2.default.health()["relay_lost"] == 15  # type: ignore[union-attr]


def test_distributed_cache_across_hosts(make_host: Callable[..., Bus]) -> None:
    a, b = make_host("a"), make_host("b")
    wait_relaying(a, b)
    ca, cb = DistributedCache("settings", bus=a), DistributedCache("settings", bus=b)
    ca["theme"] = "dark"
    wait_for(lambda: cb.get("theme") == "dark", what="the cache entry on host b")
    del cb["theme"]
    wait_for(lambda: ca.get("theme") is None, what="the delete on host a")
    late = make_host("c")  # a host started later catches up from the stream
    cc = DistributedCache("settings", bus=late)
    ca["lang"] = "fr"
    wait_for(lambda: cc.get("lang") == "fr" and cc.get("theme") is None, what="the late host's cache")
    for cache in (ca, cb, cc):
        cache.close()


def test_the_relays_consumers_deleted_by_an_operator_are_made_again(
    make_host: Callable[..., Bus], nats_url: str, bus_name: str
) -> None:
    """Every consumer of the stream deleted (the relays' reads and doorbells): the relays notice (a read finds its
    consumer gone, the keepalive its doorbell) and go on without losing anything."""
    a, b = make_host("a"), make_host("b")
    wait_relaying(a, b)
    a.publish("/k", 0)
    wait_for(lambda: b.segment.global_id() == 1, what="host b has the first message")
    conn = js_conn(nats_url)
    names = [c["name"] for c in js.api(conn, f"CONSUMER.LIST.{bus_name}")["consumers"]]
    assert names
    for name in names:
        js.api(conn, f"CONSUMER.DELETE.{bus_name}.{name}")
    conn.close()
    for i in range(1, 4):
        a.publish("/k", i)
    wait_for(lambda: [m.data for m in b.backlog("/k")] == [0, 1, 2, 3], 30, "host b after the consumers went")
    assert b.default.health()["relay_lost"] == 0  # type: ignore[union-attr]
