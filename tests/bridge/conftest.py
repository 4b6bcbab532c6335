"""The bridge kit's relay on its own: hosts bridged through the in-memory backend, each relay driven one action at a
time by the test on a fake clock (no server, no thread, no sleep)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from shmbus import Bus
from shmbus.adapters.bridge.events import Action, Simple, WaitRing
from shmbus.adapters.bridge.memory import MemoryBackend, MemoryBridge
from shmbus.adapters.bridge.relay import Relay
from shmbus.adapters.bridge.status import BridgeStatus


class FakeClock:
    """The relay's clock and every wait of the test: waiting only moves the time."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Host:
    """One host: a bus with its own segment, bridged through the test's backend. Its relay is never started as a
    thread: :meth:`advance` performs one action of its machine, the helpers run it until a given action."""

    def __init__(self, bus: Bus, clock: FakeClock) -> None:
        self.bus = bus
        engine = bus.default
        assert isinstance(engine, MemoryBridge) and engine.relay is not None
        self.engine = engine
        self.relay: Relay = engine.relay
        self.relay.pause = clock.advance
        self.status: BridgeStatus = engine.status
        self.status.relay.clock = clock
        self.performed: list[Action] = []  #: every action performed, in order

    def start(self) -> None:
        """The relay thread's start, without the thread."""
        self.relay.stop = threading.Event()
        self.relay.pending = self.relay.machine.start()

    def down(self) -> None:
        """The host's relay stops, as its bridge's ``close`` stops it (its state then says "off")."""
        self.relay.close(join=False)
        self.run_until(lambda action: action is None)
        self.status.relay.close()

    def advance(self) -> Action | None:
        action = self.relay.pending
        assert action is not None, "the relay has stopped"
        self.performed.append(action)
        return self.relay.advance()

    def run_until(self, done: Callable[[Action | None], bool], limit: int = 5000) -> list[Action]:
        """Perform actions until the pending one is ``done``; the actions performed."""
        start = len(self.performed)
        for _ in range(limit):
            if done(self.relay.pending):
                return self.performed[start:]
            self.advance()
        raise AssertionError(f"not done after {limit} actions; the last: {self.performed[-12:]}")

    def idle(self) -> list[Action]:
        """Run until the relay waits on its doorbell: elected, caught up, following."""
        return self.run_until(lambda a: isinstance(a, WaitRing))

    def ring(self) -> list[Action]:
        """One doorbell wait (what was notified, or 0.25 s of the fake clock) and all it causes."""
        assert isinstance(self.relay.pending, WaitRing), self.relay.pending
        self.advance()
        return [WaitRing(0.25), *self.idle()]

    def health(self) -> dict[str, Any]:
        return self.engine.health()


def relaying(make_host: Callable[..., Host], backend: MemoryBackend, suffix: str = "b", **options: object) -> Host:
    """A host whose relay won the election and caught up (it waits on its doorbell)."""
    host = make_host(suffix, backend, **options)
    host.start()
    host.idle()
    assert host.status.relay.state == "relaying"
    return host


def datas(host: Host) -> list[object]:
    """What the host's segment holds, in global id order (every record: no channel's backlog rule applies)."""
    return [json.loads(record.payload) for record in host.bus.segment.global_backlog(0)]


def whats(actions: list[Action]) -> list[str]:
    """The simple actions' names and the others' class names, in order (to compare a sequence)."""
    return [a.what if isinstance(a, Simple) else type(a).__name__ for a in actions]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def backend(clock: FakeClock) -> MemoryBackend:
    """A backend with Redis's ids whose doorbell waits move the fake clock."""
    return MemoryBackend(wait=lambda cond, timeout: clock.advance(timeout))


@pytest.fixture
def sparse_backend(clock: FakeClock) -> MemoryBackend:
    """A backend with PostgreSQL's ids (sparse, trims recorded, writers in flight)."""
    return MemoryBackend(sparse_ids=True, wait=lambda cond, timeout: clock.advance(timeout))


@pytest.fixture
def make_host(bus_name: str, clock: FakeClock) -> Iterator[Callable[..., Host]]:
    """``make_host(suffix, backend, **options)``: a host whose relay the test drives; ``publisher(...)``-style hosts
    pass ``relay=False``. Publishes never wait for a relay (``local_wait=0``). Destroyed after the test."""
    buses: list[Bus] = []

    def make(suffix: str, backend: MemoryBackend, *, bus_options: dict[str, Any] | None = None, **options: Any) -> Host:
        options.setdefault("local_wait", 0)
        options.setdefault("autostart", False)
        bus = Bus(
            f"{bus_name}{suffix}",
            keepalive_interval=0,
            engine=MemoryBridge(backend, **options),
            create=True,
            **(bus_options or {}),
        )
        buses.append(bus)
        return Host(bus, clock)

    yield make
    for bus in buses:
        bus.destroy()
