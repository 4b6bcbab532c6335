"""Targeting: every device gets exactly the messages message_bus would show its user, and nothing else.

The same matrix as the SSE and WebSocket leak tests (user, group, client and site targeting), plus guble's user
topics; each device's received set is compared with the expected set exactly (no leak, no loss)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

from shmbus import Bus
from shmbus.adapters.push import PushConnector, VapidKeys
from shmbus.adapters.push.devservice import PushService
from tests.harness.wait import wait_for

from .push_util import register, wait_leading

TOPICS = ["/t", "/tp", "/global/end"]
MESSAGES = [
    ("/t", "u1", {"user_ids": [1]}),
    ("/tp/x", "g7", {"group_ids": [7]}),
    ("/t", "tab-c", {"client_ids": ["tab-c"]}),
    ("/tp/y", "u2", {"user_ids": [2]}),
    ("/t", "s1", {"site_id": "s1"}),
    ("/tp", "u1-s1", {"user_ids": [1], "site_id": "s1"}),
    ("/user/1/inbox", "dm1", {}),
    ("/user/2/inbox", "dm2", {}),
    ("/user/2/inbox", "dm2-but-u1", {"user_ids": [1]}),  # the user space wins over the targeting
    ("/user/12/inbox", "dm12", {}),  # a prefix of user 1's id is not user 1
    ("/t", "u1-str", {"user_ids": ["1"]}),  # "1" is not 1, as in the middleware
    ("/t", "all", {}),
    ("/global/end", "end", {}),
]


def _publish_elsewhere(bus_name: str) -> None:
    """From another process, as an app worker would."""
    code = (
        "import sys, json; from shmbus import Bus\n"
        f"b = Bus({bus_name!r}, create=False)\n"
        f"for ch, data, kw in {MESSAGES!r}: b.publish(ch, data, **kw)\n"
        "b.close()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_targeting_never_leaks(
    bus: Bus, bus_name: str, push_service: PushService, connector: Callable[..., PushConnector], vapid: VapidKeys
) -> None:
    c = connector(channels="/", group_ids_for=lambda uid: [7] if uid == 2 else [])
    devices = {
        "a": (1, None, [*TOPICS, "/user/1"]),
        "b": (2, None, [*TOPICS, "/user/2"]),
        "c": (3, None, TOPICS),  # no user space of its own
        "d": (1, "s1", [*TOPICS, "/user/1"]),  # user 1's second device, on site s1
        "e": (4, None, ["/"]),  # everything it may see (no other user's space)
        "f": (12, None, ["/user"]),  # every user space: only its own arrives
    }
    subs = {}
    for name, (uid, site, topics) in devices.items():
        subs[name] = push_service.subscribe(vapid.public_key)
        register(c, subs[name], uid, topics, site)
    c.start()
    wait_leading(c)
    _publish_elsewhere(bus_name)
    expected = {
        "a": {"u1", "dm1", "all", "end"},
        "b": {"g7", "u2", "dm2", "all", "end"},
        "c": {"all", "end"},
        "d": {"s1", "u1-s1", "end"},  # site s1: only its site's messages and /global/
        "e": {"all", "end"},
        "f": {"dm12"},
    }
    total = sum(len(v) for v in expected.values())
    wait_for(
        lambda: len(push_service.deliveries) >= total and c.stats()["cursor"] == bus.segment.global_id(),
        what="every push and a settled cursor",
    )
    got = {name: [d.payload["data"] for d in push_service.received(sub)] for name, sub in subs.items()}
    assert {name: set(v) for name, v in got.items()} == expected
    assert all(len(v) == len(set(v)) for v in got.values()), got  # each device got each message once
    assert len(push_service.deliveries) == total and push_service.refusals == []


def test_group_targeting_without_a_lookup_reaches_nobody(
    bus: Bus, push_service: PushService, connector: Callable[..., PushConnector], vapid: VapidKeys
) -> None:
    c = connector(channels="/")
    sub = push_service.subscribe(vapid.public_key)
    register(c, sub, 2, ["/g"])
    c.start()
    wait_leading(c)
    bus.publish("/g", "groups only", group_ids=[7])
    bus.publish("/g", "mine", user_ids=[2], group_ids=[7])
    wait_for(lambda: c.stats()["cursor"] == bus.segment.global_id() and c.stats()["sent"] == 1, what="settled")
    assert [d.payload["data"] for d in push_service.received(sub)] == ["mine"]
    assert c.stats()["unroutable"] == 1
