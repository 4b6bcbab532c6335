"""Pushes reach a real RFC 8030 peer that checks VAPID and decrypts them as a browser would."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from shmbus import Bus
from shmbus.adapters.push import MAX_PLAINTEXT, PushConnector, PushOptions, VapidKeys, publish_push
from shmbus.adapters.push.devservice import PushService
from shmbus.errors import InvalidMessage, PayloadTooLarge
from tests.harness.wait import wait_for

from .push_util import register, wait_leading


def test_delivery_decrypts_with_headers(
    bus: Bus, push_service: PushService, connector: Callable[..., PushConnector], vapid: VapidKeys
) -> None:
    c = connector(channels="/chat").start()
    phone = push_service.subscribe(vapid.public_key)
    register(c, phone, 7, ["/chat"])
    wait_leading(c)
    gid_before = bus.segment.global_id()
    bus.publish("/chat/1", {"text": "hello"})
    bus.publish("/other", {"text": "not a push channel"})
    publish_push(bus, "/chat/2", {"text": "urgent"}, ttl=60, urgency="high", topic="room-2")
    got = wait_for(lambda: len(push_service.received(phone)) == 2 and push_service.received(phone), what="2 pushes")
    first, second = sorted(got, key=lambda d: d.payload["global_id"])  # concurrent pushes: no order promised
    assert first.payload == {
        "channel": "/chat/1",
        "message_id": 1,
        "global_id": gid_before + 1,
        "data": {"text": "hello"},
    }
    assert (first.ttl, first.urgency, first.topic) == (PushOptions().ttl, None, None)
    assert second.payload["data"] == {"text": "urgent"}  # the __push__ options are not pushed
    assert (second.ttl, second.urgency, second.topic) == (60, "high", "room-2")
    wait_for(lambda: c.stats()["sent"] == 2, what="sent counted")
    assert push_service.refusals == []


def test_oversize_is_a_fetch_notice_or_refused(
    bus: Bus, push_service: PushService, connector: Callable[..., PushConnector], vapid: VapidKeys
) -> None:
    c = connector(channels="/big").start()
    dev = push_service.subscribe(vapid.public_key)
    register(c, dev, "ann", ["/big"])
    wait_leading(c)
    big = {"text": "x" * (MAX_PLAINTEXT + 10)}
    with pytest.raises(PayloadTooLarge):
        publish_push(bus, "/big/1", big)
    assert bus.last_id("/big/1") == 0  # refused before anything was stored
    mid = bus.publish("/big/1", big)  # a plain publish of the same: pushed as a fetch notice
    (notice,) = wait_for(lambda: push_service.received(dev), what="the fetch notice")
    assert notice.payload == {
        "channel": "/big/1",
        "message_id": mid,
        "global_id": bus.segment.global_id(),
        "fetch": True,
    }
    with pytest.raises(InvalidMessage):
        publish_push(bus, "/big/1", {"a": 1}, urgency="asap")
    with pytest.raises(InvalidMessage):
        publish_push(bus, "/big/1", "text", ttl=5)  # options need a dict payload


def test_vapid_key_mismatch_is_reported_not_retried(
    bus: Bus, push_service: PushService, connector: Callable[..., PushConnector], vapid: VapidKeys
) -> None:
    """A subscription made for another applicationServerKey is refused by the service (403): reported, not
    retried, and the peer's refusal proves it really checks the VAPID key."""
    c = connector(channels="/").start()
    other = VapidKeys.generate("mailto:x@example.com")
    dev = push_service.subscribe(other.public_key)
    register(c, dev, 1, ["/n"])
    wait_leading(c)
    bus.publish("/n", 1)
    wait_for(lambda: c.stats()["failed"] == 1, what="failure counted")
    assert [r[1] for r in push_service.refusals] == [403]
    (_gid, reg, outcome, why) = c.undelivered[0]
    assert (reg.endpoint, outcome, why) == (dev["endpoint"], "failed", "HTTP 403")


def test_push_options_validated(bus: Bus) -> None:
    with pytest.raises(InvalidMessage):
        PushOptions(ttl=-1)
    with pytest.raises(InvalidMessage):
        PushOptions(topic="has space")
    assert PushOptions(ttl=0, urgency="low", topic="a_b-1").headers() == {
        "TTL": "0",
        "Urgency": "low",
        "Topic": "a_b-1",
    }
    assert json.dumps(PushOptions().headers())


def test_bad_input_never_stops_the_sender(
    bus: Bus, push_service: PushService, connector: Callable[..., PushConnector], vapid: VapidKeys
) -> None:
    """Malformed push options in a plain publish, a group lookup that raises: that message is reported and not
    pushed; the next one is."""

    def groups(user_id: object) -> list[int]:
        raise RuntimeError("directory down")

    c = connector(channels="/", group_ids_for=groups).start()
    dev = push_service.subscribe(vapid.public_key)
    register(c, dev, 1, ["/b"])
    wait_leading(c)
    bus.publish("/b", {"text": "bad", "__push__": {"ttl": "soon"}})
    bus.publish("/b", "for a group", group_ids=[3])
    bus.publish("/b", {"text": "good"})
    (got,) = wait_for(lambda: push_service.received(dev), what="the good push")
    assert got.payload["data"] == {"text": "good"}
    wait_for(lambda: c.stats()["cursor"] == bus.segment.global_id(), what="settled")
    st = c.stats()
    assert (st["sent"], st["failed"], st["unroutable"]) == (1, 1, 1)
    ((_gid, reg, outcome, why),) = c.undelivered
    assert (reg.endpoint, outcome) == (dev["endpoint"], "failed") and "bad push options" in why


def test_a_cursor_ahead_of_this_segment_is_waited_for(
    bus: Bus, push_service: PushService, connector: Callable[..., PushConnector], vapid: VapidKeys
) -> None:
    """A sender taking over on a host whose relay is behind the saved cursor waits for the segment to reach it
    instead of restarting at its own head (which would push those messages a second time)."""
    c = connector(channels="/")
    dev = push_service.subscribe(vapid.public_key)
    register(c, dev, 1, ["/a"])
    head = bus.segment.global_id()
    state = c.store.take_over("other-host:1")
    state.cursor = head + 2  # another host's sender pushed two messages this segment has not got yet
    c.store.save(state)
    c.start()
    wait_for(lambda: c.stats()["term"] == state.term + 1, what="the new sender's term (it waits, not leading yet)")
    assert not c.leading
    for i in range(4):
        bus.publish("/a", i)  # the "relay" catches up: ids head+1..head+4
    wait_leading(c)
    wait_for(lambda: c.stats()["cursor"] == bus.segment.global_id(), what="settled")
    assert sorted(d.payload["data"] for d in push_service.received(dev)) == [2, 3]


def test_bus_reset_while_sending(
    bus: Bus, push_service: PushService, connector: Callable[..., PushConnector], vapid: VapidKeys
) -> None:
    c = connector(channels="/").start()
    dev = push_service.subscribe(vapid.public_key)
    register(c, dev, 1, ["/r"])
    wait_leading(c)
    for i in range(3):
        bus.publish("/r", f"old{i}")
    wait_for(lambda: len(push_service.received(dev)) == 3, what="before the reset")
    bus.reset()
    bus.publish("/r", "new0")  # global id 1 again, in a new epoch
    wait_for(lambda: len(push_service.received(dev)) == 4, what="after the reset")
    assert push_service.received(dev)[-1].payload["data"] == "new0"


def test_callable_channels_and_a_clean_restart(
    bus: Bus, push_service: PushService, connector: Callable[..., PushConnector], vapid: VapidKeys
) -> None:
    """``channels`` as a callable (no prefix could say "every room's /alerts"), and a clean stop and restart on
    the same store: what was published while no sender ran is pushed on restart, and nothing is pushed twice."""

    def alerts(channel: str) -> bool:
        return channel.startswith("/room/") and channel.endswith("/alerts")

    first = connector(channels=alerts).start()
    dev = push_service.subscribe(vapid.public_key)
    register(first, dev, 1, ["/room/1/alerts", "/room/2/alerts"])
    wait_leading(first)
    for channel, data in [("/room/1/alerts", "a1"), ("/room/1/chat", "not pushed"), ("/room/2/alerts", "a2")]:
        bus.publish(channel, data)
    wait_for(lambda: first.stats()["cursor"] == bus.segment.global_id(), what="the first sender settled")
    first.close(grace=2)
    assert not first.leading
    bus.publish("/room/1/alerts", "b1")  # no sender runs now
    bus.publish("/room/2/alerts", "b2")
    second = connector(channels=alerts).start()
    wait_leading(second)
    bus.publish("/room/1/alerts", "c1")
    wait_for(lambda: second.stats()["cursor"] == bus.segment.global_id(), what="the second sender settled")
    got = [d.payload["data"] for d in push_service.received(dev)]
    assert sorted(got) == ["a1", "a2", "b1", "b2", "c1"]  # each once: none repeated, none skipped
    assert second.stats()["term"] == 2 and second.stats()["sent"] == 5


def test_the_4096_byte_boundary(
    bus: Bus, push_service: PushService, connector: Callable[..., PushConnector], vapid: VapidKeys
) -> None:
    """A payload of exactly MAX_PLAINTEXT bytes is pushed whole, and the peer (which refuses a body over 4096
    bytes with 413) accepts its encryption; one byte more is a fetch notice."""
    c = connector(channels="/edge").start()
    dev = push_service.subscribe(vapid.public_key)
    register(c, dev, 1, ["/edge"])
    wait_leading(c)
    head = {"channel": "/edge", "message_id": bus.last_id("/edge") + 1, "global_id": bus.segment.global_id() + 1}
    text = "z" * (MAX_PLAINTEXT - len(json.dumps({**head, "data": ""}, separators=(",", ":"))))
    bus.publish("/edge", text)
    bus.publish("/edge", text + "z")
    got = wait_for(lambda: len(push_service.received(dev)) == 2 and push_service.received(dev), what="both pushes")
    whole, notice = sorted(got, key=lambda d: d.payload["global_id"])
    assert len(json.dumps(whole.payload, separators=(",", ":"))) == MAX_PLAINTEXT
    assert whole.payload["data"] == text and "fetch" not in whole.payload
    assert notice.payload["fetch"] is True and push_service.refusals == []
