"""A host's own messages are its publisher's: when the backend trims a channel before this host's relay read it (a
burst larger than the channel's backlog), only the publisher still holds those messages, so the relay waits for it
to land them instead of counting them lost, and a publisher that finds another host's message missing in between
lands its own as soon as the relay stored it. Driven on the in-memory backend, the relay one action at a time."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from shmbus.adapters.bridge.events import WaitLanded, WaitRing
from shmbus.adapters.bridge.memory import MemoryBackend

from .conftest import FakeClock, Host, datas, relaying

Make = Callable[..., Host]


def unsealed(clock: FakeClock) -> MemoryBackend:
    """A backend whose notices carry no seal: the relay reads every message from the backend's history, so a
    message trimmed there is gone for it (the shortcut of sealed lines aside)."""
    return MemoryBackend(sealed=False, wait=lambda cond, timeout: clock.advance(timeout))


def hold_landings(host: Host) -> tuple[list[tuple[Any, ...]], Callable[..., None]]:
    """Acknowledged but not landed yet: the publisher's landing calls are kept (the original returned to make)."""
    held: list[tuple[Any, ...]] = []
    landing = host.engine.landing
    assert landing is not None
    land = landing.land
    landing.land = lambda *args: held.append(args)  # type: ignore[method-assign]
    return held, land


def ring_then_land(host: Host, wait: WaitLanded, land: Callable[[], None]) -> None:
    """The doorbell rang: the relay must stop at ``wait`` (the publisher has not landed yet); then the publisher
    lands its messages and the relay goes on until it waits on its doorbell again."""
    host.advance()
    host.run_until(lambda action: isinstance(action, (WaitLanded, WaitRing)))
    assert host.relay.pending == wait
    land()
    host.idle()


def test_a_trimmed_message_its_publisher_is_landing_is_waited_for_not_lost(make_host: Make, clock: FakeClock) -> None:
    backend = unsealed(clock)
    b = relaying(make_host, backend, local_wait=5)
    held, land = hold_landings(b)
    with b.engine.batch():
        for i in range(3):
            b.bus.publish("/c", i)
    backend.expire(1)
    backend.expire(2)  # the channel kept only the newest: trimmed before the relay read them
    ring_then_land(b, WaitLanded(1, 5), lambda: land(*held[0]))  # the publisher lands its burst
    assert datas(b) == [0, 1, 2]
    assert b.status.relay_lost == 0 and b.status.relayed == 0


def test_ids_gone_from_the_backends_whole_history_are_waited_for_too(make_host: Make, clock: FakeClock) -> None:
    backend = unsealed(clock)
    b = relaying(make_host, backend, local_wait=5)
    held, land = hold_landings(b)
    with b.engine.batch():
        for i in range(4):
            b.bus.publish("/c", i)
    backend.trim(2)  # the global backlog kept only the newest: ids 1 and 2 are gone, not just their messages
    ring_then_land(b, WaitLanded(1, 5), lambda: land(*held[0]))
    assert datas(b) == [0, 1, 2, 3] and b.status.relay_lost == 0


def test_the_newest_ids_gone_are_waited_for_too(make_host: Make, clock: FakeClock) -> None:
    backend = unsealed(clock)
    b = relaying(make_host, backend, local_wait=5)
    held, land = hold_landings(b)
    with b.engine.batch():
        for i in range(2):
            b.bus.publish("/c", i)
    backend.trim(2)  # every id the burst got is gone: the read finds nothing, the backend says they existed
    ring_then_land(b, WaitLanded(1, 5), lambda: land(*held[0]))
    assert datas(b) == [0, 1] and b.status.relay_lost == 0


def test_a_trimmed_message_nobody_lands_is_lost_after_one_wait_per_catch_up(make_host: Make, clock: FakeClock) -> None:
    backend = unsealed(clock)
    a = make_host("a", backend, relay=False)
    b = relaying(make_host, backend, local_wait=5)
    with a.engine.batch():
        for i in range(4):
            a.bus.publish("/c", i)  # another host's: no publisher here will land them
    backend.expire(1)
    backend.expire(3)
    started = clock.now
    done = b.ring()
    assert [x for x in done if isinstance(x, WaitLanded)] == [WaitLanded(1, 5)]  # not again for id 3
    assert clock.now - started >= 5  # the fake clock: the wait ran its whole course
    assert datas(b) == [1, 3] and b.status.relay_lost == 2


def test_without_landing_wait_a_trimmed_message_is_lost_at_once(make_host: Make, clock: FakeClock) -> None:
    backend = unsealed(clock)
    a = make_host("a", backend, relay=False)
    b = relaying(make_host, backend, local_wait=0)  # publishes never wait for the relay: nor does it for them
    a.bus.publish("/c", 0)
    a.bus.publish("/c", 1)
    backend.expire(1)
    done = b.ring()
    assert not [x for x in done if isinstance(x, WaitLanded)]
    assert datas(b) == [1] and b.status.relay_lost == 1


def test_a_publisher_behind_another_hosts_message_lands_its_own_once_the_relay_stored_it(
    make_host: Make, clock: FakeClock
) -> None:
    backend = unsealed(clock)
    a = make_host("a", backend, relay=False)
    b = relaying(make_host, backend, local_wait=20)
    b.relay.pause = lambda seconds: (time.sleep(seconds), clock.advance(seconds))  # real waits: a thread lands
    a.bus.publish("/c", "other")  # id 1: b's relay has not stored it yet
    held, land = hold_landings(b)
    b.bus.publish("/c", "own")  # id 2, acknowledged; the segment lacks id 1, so it cannot land yet
    backend.expire(2)  # and the backend trimmed it: only its publisher holds it
    publisher = threading.Thread(target=land, args=held[0], daemon=True)
    publisher.start()
    b.ring()  # the relay stores id 1, then waits for id 2's publisher, which lands it
    publisher.join(30)
    assert not publisher.is_alive()
    assert datas(b) == ["other", "own"]
    assert b.status.relay_lost == 0 and b.status.relayed == 1
