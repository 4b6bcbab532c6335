"""The in-memory backend as a test double: it keeps the Backend contract the relay relies on, and buses bridged
through it behave as hosts bridged through a server (with the relay's real thread)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shmbus import Bus
from shmbus.adapters.bridge.events import ASK_GONE, Read
from shmbus.adapters.bridge.memory import MemoryBackend, MemoryBridge
from tests.harness.wait import wait_for

from .conftest import Host

Make = Callable[..., Host]


def test_an_id_drawn_after_a_read_is_not_gone_for_it(make_host: Make, backend: MemoryBackend) -> None:
    """``gone_upto`` answers for the last read (Redis reads the newest id in the same script as the page): a message
    published between the read and the question is on its way, not lost."""
    a = make_host("a", backend, relay=False)
    b = make_host("b", backend)
    b.start()
    b.idle()
    backend.notify(b"9|")  # a doorbell above the position: b reads
    b.run_until(lambda action: isinstance(action, Read))
    b.advance()  # the read: nothing new
    assert b.relay.pending == ASK_GONE
    a.bus.publish("/c", "meanwhile")
    b.idle()
    assert b.status.relay_lost == 0
    b.ring()
    assert [m.data for m in b.bus.global_backlog(0)] == ["meanwhile"]


def test_buses_bridged_in_memory_deliver_to_each_other_with_their_relay_threads(bus_name: str) -> None:
    backend = MemoryBackend()
    buses = [
        Bus(f"{bus_name}{h}", keepalive_interval=0, create=True, engine=MemoryBridge(backend, election_interval=0.05))
        for h in "ab"
    ]
    try:
        a, b = buses
        got: list[Any] = []
        b.subscribe("/c", lambda m: got.append(m.data))
        wait_for(lambda: all(bus.health()["engine_health"]["relay_state"] == "relaying" for bus in buses))
        for i in range(20):
            a.publish("/c", i)
        b.publish("/c", "from b")
        wait_for(lambda: len(got) == 21, what="b got every message")
        assert got == [*range(20), "from b"]
        assert [m.data for m in a.backlog("/c", 0)] == [*range(20), "from b"]
        assert a.default.health()["relay_lost"] == b.default.health()["relay_lost"] == 0  # type: ignore[union-attr]
    finally:
        for bus in buses:
            bus.destroy()
