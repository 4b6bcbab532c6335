"""The relay's states and their moves, its failures, its timers and its stall, driven one action at a time on the
in-memory backend and a fake clock (no server, no sleep); and the machine's table: an event its step does not
take raises."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from shmbus import Bus
from shmbus.adapters.bridge.events import DONE, PauseFor, WaitRing
from shmbus.adapters.bridge.lifecycle import MOVES, IllegalMove, RelayLifecycle
from shmbus.adapters.bridge.machine import IllegalEvent
from shmbus.adapters.bridge.memory import MemoryBackend, MemoryBridge
from shmbus.adapters.bridge.steps import Step
from shmbus.errors import IllegalTransition
from shmbus.figures import RelayState

from .conftest import FakeClock, Host, whats

Make = Callable[..., Host]


def test_a_session_opens_the_doorbell_first_then_checks_the_history_then_catches_up(
    make_host: Make, backend: MemoryBackend
) -> None:
    b = make_host("b", backend)
    b.start()
    assert b.status.relay.state == "standby" and not b.status.relay.holding
    done = b.idle()
    assert whats(done) == [
        "take_election",
        "flush_metrics",
        "open_doorbell",
        "name_history",
        "RecordHistory",  # a brand-new segment records the backend's history
        "Read",
        "ask_gone",  # what a brand-new segment was never owed
        "ask_gone",  # the short page's end: what is gone after it
        "ask_newest",
        "flush_metrics",
    ]
    assert b.status.relay.state == "relaying" and b.status.relay.holding and b.status.takeovers == 1
    assert b.health()["relay"] is True and b.health()["relay_state"] == "relaying"


def test_a_process_that_loses_the_election_stands_by_and_tries_again(
    make_host: Make, backend: MemoryBackend, bus_name: str, clock: FakeClock
) -> None:
    b = make_host("b", backend)
    b.start()
    b.idle()
    # another process of host b: the same segment, its own election descriptor
    twin = Bus(f"{bus_name}b", keepalive_interval=0, engine=MemoryBridge(backend, autostart=False, local_wait=0))
    other = Host(twin, clock)
    try:
        other.start()
        tries = other.run_until(lambda a: isinstance(a, PauseFor))
        other.advance()
        other.advance()  # the next try: still held
        assert whats(tries) == ["take_election"] and other.relay.machine.step is Step.STANDING
        assert other.status.relay.state == "standby" and not other.status.relay.holding
        b.down()  # b's relay stops and releases the lock
        other.idle()
        assert other.status.relay.state == "relaying" and other.status.takeovers == 1
    finally:
        other.down()
        twin.close()


def test_a_failing_backend_backs_off_doubling_says_unreachable_and_recovers(
    make_host: Make, backend: MemoryBackend, caplog: pytest.LogCaptureFixture
) -> None:
    b = make_host("b", backend, reconnect_max=0.3)
    b.start()
    b.idle()
    backend.down = True
    pauses = []
    with caplog.at_level(logging.WARNING, "shmbus.memory"):
        for _ in range(5):
            b.run_until(lambda a: isinstance(a, PauseFor))
            pauses.append(b.relay.pending)
            b.advance()
    assert pauses == [PauseFor(0.05), PauseFor(0.1), PauseFor(0.2), PauseFor(0.3), PauseFor(0.3)]
    assert b.status.relay.state == "reconnecting" and b.health()["state"] == "unreachable"
    assert not [r for r in caplog.records if r.exc_info]  # the backend's own errors: a line each, no traceback
    backend.down = False
    b.idle()
    assert b.status.relay.state == "relaying" and b.health()["state"] == "ok"
    backend.down = True
    b.run_until(lambda a: isinstance(a, PauseFor))
    assert b.relay.pending == PauseFor(0.05)  # once caught up, the backoff starts over


def test_an_unexpected_error_is_logged_with_its_traceback_and_the_relay_reconnects(
    make_host: Make, backend: MemoryBackend, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    b = make_host("b", backend)
    b.start()
    b.idle()

    def broken(after: int, limit: int) -> object:
        raise KeyError("a bug")

    monkeypatch.setattr(backend, "read_after", broken)
    backend.notify(b"5|")
    with caplog.at_level(logging.ERROR, "shmbus.memory"):
        b.run_until(lambda a: isinstance(a, PauseFor))
    assert [r.getMessage() for r in caplog.records if r.exc_info] == ["shmbus memory bridge: relay error"]
    assert b.status.relay.state == "reconnecting" and b.health()["state"] == "unknown"  # not a backend error


def test_the_relay_checks_the_history_each_second_and_reads_after_five_quiet_seconds(
    make_host: Make, backend: MemoryBackend
) -> None:
    b = make_host("b", backend)
    b.start()
    b.idle()
    named, reads, kept = backend.calls["history_id"], backend.calls["read_after"], backend.calls["keepalive"]
    for _ in range(4):  # 1 s of quiet doorbell waits
        b.ring()
    assert backend.calls["history_id"] == named + 1 and backend.calls["read_after"] == reads
    for _ in range(17):  # past 5 s
        b.ring()
    assert backend.calls["keepalive"] == kept + 1 and backend.calls["read_after"] == reads + 1


def test_the_relay_runs_the_backends_housekeeping_with_the_channels_it_stored(
    make_host: Make, backend: MemoryBackend
) -> None:
    a = make_host("a", backend, relay=False)
    b = make_host("b", backend)
    b.relay.machine.config.trim_interval = 1.0
    b.start()
    b.idle()
    a.bus.publish("/x", 1)
    a.bus.publish("/y", 2)
    for _ in range(5):
        b.ring()
    assert backend.maintained == [(2, {"/x": 1, "/y": 2})]


def test_a_relay_that_makes_no_step_reads_stalled_on_the_fake_clock(
    make_host: Make, backend: MemoryBackend, clock: FakeClock
) -> None:
    b = make_host("b", backend)
    b.start()
    b.idle()
    clock.advance(29.0)
    assert b.health()["relay_state"] == "relaying"
    clock.advance(2.0)  # the relay thread is stuck: no action is performed
    assert b.health()["relay_state"] == "stalled" and b.engine.relay_figures().state == "stalled"
    b.ring()
    assert b.health()["relay_state"] == "relaying"


def test_a_stopped_relay_closes_its_doorbell_and_releases_the_election(make_host: Make, backend: MemoryBackend) -> None:
    b = make_host("b", backend)
    b.start()
    b.idle()
    b.relay.close(join=False)
    done = b.run_until(lambda a: a is None)
    assert whats(done) == [
        "WaitRing",
        "close_doorbell",
        "open_doorbell",
        "release_election",
        "flush_metrics",
        "PauseFor",
        "take_election",
    ]
    assert not backend.bells and not b.status.relay.holding and not b.relay.election.held


def test_an_event_the_step_does_not_take_raises(make_host: Make, backend: MemoryBackend) -> None:
    b = make_host("b", backend)
    b.start()
    machine = b.relay.machine
    with pytest.raises(IllegalEvent):
        machine.handle(DONE)  # it waits for the election's answer
    b.idle()
    with pytest.raises(IllegalEvent):
        machine.handle(DONE)  # a doorbell wait answers Rang or Halted
    assert isinstance(b.relay.pending, WaitRing) and machine.step is Step.RINGING


def test_the_relay_states_move_only_as_the_table_says() -> None:
    relay = RelayLifecycle("memory", "memory://x", logging.getLogger("test.moves"))
    legal: list[RelayState] = ["connecting", "relaying", "reconnecting", "relaying", "standby", "off", "connecting"]
    for state in legal:
        relay.move(state)
    relay.move("standby")
    illegal: dict[RelayState, list[RelayState]] = {
        "standby": ["relaying", "reconnecting", "stalled"],
        "relaying": ["connecting", "stalled"],
        "reconnecting": ["connecting", "stalled"],
    }
    for start, bad in illegal.items():
        relay.state = start
        for state in bad:
            with pytest.raises(IllegalMove):
                relay.move(state)
            assert relay.state == start
    assert all(state not in MOVES[state] for state in MOVES) and not MOVES["stalled"]


def test_the_relays_illegal_steps_are_the_one_typed_error_of_every_state_machine() -> None:
    """The relay machine's table, its lifecycle's moves, a waiter's and a connection's all raise one error type."""
    assert issubclass(IllegalEvent, IllegalTransition) and issubclass(IllegalMove, IllegalTransition)
