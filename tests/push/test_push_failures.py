"""Push services fail: 404/410 remove the device, 429/5xx are retried honouring Retry-After, a hung service delays
only its own devices (bounded queue, counted drops) and never a publisher."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

import pytest

from shmbus import Bus
from shmbus.adapters.push import PushConnector, VapidKeys, public_address
from shmbus.adapters.push.devservice import PushService
from shmbus.adapters.push.subscriptions import parse_registration
from tests.harness.wait import wait_for

from .push_util import register, wait_leading


@pytest.mark.parametrize("status", [404, 410])
def test_gone_subscription_is_removed(
    status: int, bus: Bus, push_service: PushService, connector: Callable[..., PushConnector], vapid: VapidKeys
) -> None:
    c = connector()
    gone, alive = push_service.subscribe(vapid.public_key), push_service.subscribe(vapid.public_key)
    register(c, gone, 1, ["/n"])
    register(c, alive, 2, ["/n"])
    push_service.set_mode(gone, "gone", arg=status)
    c.start()
    wait_leading(c)
    bus.publish("/n", "first")
    wait_for(lambda: c.stats()["expired"] == 1, what="the expiry counted")
    assert [r.endpoint for r in c.store.all()] == [alive["endpoint"]]
    bus.publish("/n", "second")
    wait_for(lambda: len(push_service.received(alive)) == 2, what="both pushes to the live device")
    wait_for(lambda: c.stats()["cursor"] == bus.segment.global_id(), what="settled")
    assert [t for t, _s, _r in push_service.refusals] == [PushService.token_of(gone)]  # tried once, never again
    assert c.stats()["failed"] == 0 and len(c.undelivered) == 0


def test_429_waits_for_retry_after(
    bus: Bus, push_service: PushService, connector: Callable[..., PushConnector], vapid: VapidKeys
) -> None:
    c = connector()
    dev = push_service.subscribe(vapid.public_key)
    register(c, dev, 1, ["/n"])
    push_service.set_mode(dev, "throttle", count=1, arg=2)  # one 429 with Retry-After: 2
    c.start()
    wait_leading(c)
    bus.publish("/n", "later")
    (got,) = wait_for(lambda: push_service.received(dev), timeout=15, what="the retried push")

    def tried() -> list[tuple[float, int]]:
        return [(at, status) for token, at, status in push_service.attempts if token == PushService.token_of(dev)]

    tries = wait_for(lambda: len(tried()) == 2 and tried(), what="both attempts recorded")
    assert [s for _at, s in tries] == [429, 201]
    assert tries[1][0] - tries[0][0] >= 1.9  # Retry-After honoured (whole seconds on the wire)
    assert got.payload["data"] == "later"
    wait_for(lambda: c.stats()["retried"] == 1 and c.stats()["sent"] == 1, what="counted")


def test_5xx_retried_with_backoff_then_given_up(
    bus: Bus, push_service: PushService, connector: Callable[..., PushConnector], vapid: VapidKeys
) -> None:
    c = connector(max_attempts=3)
    flaky, broken = push_service.subscribe(vapid.public_key), push_service.subscribe(vapid.public_key)
    register(c, flaky, 1, ["/n"])
    register(c, broken, 2, ["/n"])
    push_service.set_mode(flaky, "error", count=1)
    push_service.set_mode(broken, "error", count=100)
    c.start()
    wait_leading(c)
    bus.publish("/n", "x")
    wait_for(lambda: push_service.received(flaky), timeout=15, what="the flaky device's push")
    wait_for(lambda: c.stats()["failed"] == 1, timeout=15, what="the broken device given up")
    broken_tries = [s for t, _a, s in push_service.attempts if t == PushService.token_of(broken)]
    assert broken_tries == [500, 500, 500]  # max_attempts sends, then reported
    ((_gid, reg, outcome, why),) = list(c.undelivered)
    assert (reg.endpoint, outcome) == (broken["endpoint"], "failed") and "gave up after 3" in why
    assert [r.endpoint for r in c.store.all()] == [flaky["endpoint"], broken["endpoint"]]  # a 5xx removes nothing


def test_hung_service_blocks_nothing_else(
    bus: Bus, push_service: PushService, connector: Callable[..., PushConnector], vapid: VapidKeys
) -> None:
    """One push service hangs: the other's devices get every message while the hung one still holds its requests
    (so nothing waited for it: not the publishers, not the other lane); its queue stays bounded, and what it could
    not take is dropped, counted and reported. The healthy service's queue is as small: a burst is paced, not lost."""
    healthy_service = PushService().start()
    try:
        c = connector(workers_per_service=2, max_queue=5, timeout=60, stall_after=0.5, max_attempts=1)
        hung = push_service.subscribe(vapid.public_key)
        fine = healthy_service.subscribe(vapid.public_key)
        register(c, hung, 1, ["/n"])
        register(c, fine, 2, ["/n"])
        push_service.set_mode(hung, "hang")
        c.start()
        wait_leading(c)
        n = 30
        for i in range(n):
            bus.publish("/n", i)
        wait_for(lambda: len(healthy_service.received(fine)) == n, timeout=20, what="every push to the healthy service")
        assert push_service.hanging == 2  # both of the hung service's workers are still waiting for it
        assert sorted(d.payload["data"] for d in healthy_service.received(fine)) == list(range(n))
        # 2 on the wire, 5 queued; once the lane answered nothing for stall_after, the other 23 were dropped
        wait_for(lambda: c.stats()["dropped"] == n - 2 - 5, what="the drops counted")
        wait_for(lambda: c.stats()["queue_depth"] == 2 + 5, what="the hung lane's bounded queue in the figures")
        push_service.set_mode(hung, "ok")
        push_service.release_hung()  # the two held requests are cut: failed (max_attempts=1); the 5 queued go out
        wait_for(lambda: c.stats()["cursor"] == bus.segment.global_id(), timeout=20, what="the cursor past all")
        st = c.stats()
        assert (st["sent"], st["failed"], st["dropped"]) == (n + 5, 2, n - 7)
        assert len(push_service.received(hung)) == 5
        outcomes = Counter(o for _g, _r, o, _w in c.undelivered)
        assert outcomes == {"dropped": n - 7, "failed": 2}
    finally:
        healthy_service.stop()


def test_an_idle_service_is_not_a_stalled_one(
    bus: Bus, push_service: PushService, connector: Callable[..., PushConnector], vapid: VapidKeys
) -> None:
    """A lane that sat idle for longer than stall_after, then gets a burst bigger than its queue, paces it: idleness
    is not a stall (its clock starts when work does), so nothing is dropped."""
    c = connector(workers_per_service=1, max_queue=2, stall_after=0.3)
    dev = push_service.subscribe(vapid.public_key)
    register(c, dev, 1, ["/i"])
    push_service.set_mode(dev, "slow", arg=0.05)  # the queue fills while the one worker waits for each answer
    c.start()
    wait_leading(c)
    bus.publish("/i", "first")
    wait_for(lambda: push_service.received(dev), what="the first push")
    time.sleep(0.6)  # the scenario: the lane idles for twice stall_after
    for i in range(8):
        bus.publish("/i", i)
    wait_for(lambda: c.stats()["cursor"] == bus.segment.global_id(), timeout=20, what="settled")
    assert c.stats()["dropped"] == 0 and len(push_service.received(dev)) == 9


def test_sender_connects_only_to_public_addresses(
    bus: Bus, push_service: PushService, connector: Callable[..., PushConnector], vapid: VapidKeys
) -> None:
    """SSRF: an endpoint is a URL a user chose. With the default address policy the sender resolves each host and
    connects to none that is loopback (or private): an IP literal and a name pointing there are both refused
    without a request, reported as failed, and not retried."""
    c = connector(allow_address=public_address, max_attempts=3)
    literal = push_service.subscribe(vapid.public_key)
    named = push_service.subscribe(vapid.public_key)
    named["endpoint"] = named["endpoint"].replace("127.0.0.1", "localhost")  # a name that resolves to loopback
    register(c, literal, 1, ["/s"])
    body = {"subscription": named, "topics": ["/s"]}
    c.store.add(parse_registration(body, 2, None, c.pushes, lambda _url: True, time.time()))
    c.start()
    wait_leading(c)
    bus.publish("/s", "internal?")
    wait_for(lambda: c.stats()["cursor"] == bus.segment.global_id(), what="settled")
    st = c.stats()
    assert (st["sent"], st["failed"], st["retried"]) == (0, 2, 0)
    assert push_service.attempts == []  # no request ever reached the internal service
    reasons = sorted((r.endpoint, why) for _g, r, _o, why in c.undelivered)
    assert [e for e, _w in reasons] == sorted([literal["endpoint"], named["endpoint"]])
    assert all("no allowed address" in why for _e, why in reasons), reasons


def test_an_endless_answer_is_cut(
    bus: Bus, push_service: PushService, connector: Callable[..., PushConnector], vapid: VapidKeys
) -> None:
    """An endpoint is a URL a user chose, and its server may answer without end: the sender reads a bounded part
    of the answer (a push service's is a few bytes), hangs up, and the push counts by its status."""
    c = connector()
    dev = push_service.subscribe(vapid.public_key)
    register(c, dev, 1, ["/e"])
    push_service.set_mode(dev, "endless")
    c.start()
    wait_leading(c)
    bus.publish("/e", "x")
    wait_for(lambda: c.stats()["sent"] == 1 and c.stats()["cursor"] == bus.segment.global_id(), what="settled")
    assert [d.payload["data"] for d in push_service.received(dev)] == ["x"]
