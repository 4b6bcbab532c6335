"""looptap.ProcessTap and wsgi_support.BatchDispatcher: one state per process fed by one bus tap; a forked child
makes its own on first use and never delivers to its parent's."""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Callable

import pytest

from shmbus import Bus
from shmbus.adapters.looptap import ProcessTap
from shmbus.adapters.wsgi_support import BatchDispatcher, may_park


def _in_child(body: Callable[[], int]) -> int:
    """The exit status of ``body()`` run in a forked child (multiprocessing's fork start method)."""
    child = multiprocessing.get_context("fork").Process(target=lambda: sys.exit(body()))
    child.start()
    child.join(30)
    return -1 if child.exitcode is None else child.exitcode


def _wait_for(what: object, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if what():  # type: ignore[operator]
            return True
        time.sleep(0.01)
    return False


def test_one_state_per_process_gets_every_batch_and_a_child_makes_its_own(bus: Bus) -> None:
    got: dict[int, list[str]] = {}

    def deliver(state: dict[str, object], msgs: list) -> None:  # type: ignore[type-arg]
        got.setdefault(id(state), []).extend(m.channel for m in msgs)

    tap: ProcessTap[dict[str, object]] = ProcessTap(bus, lambda: {"pid": os.getpid()}, deliver)
    assert tap.current() is None  # nothing made, nothing tapped before the first use
    state = tap.get()
    assert tap.get() is state and tap.current() is state
    bus.publish("/parent", 1)
    assert _wait_for(lambda: got.get(id(state)) == ["/parent"])

    def child() -> int:
        if tap.current() is not None:
            return 1  # the parent's state leaked into the child
        mine = tap.get()
        if mine is state or mine["pid"] != os.getpid():
            return 2
        bus.publish("/child", 1)
        if not _wait_for(lambda: "/child" in got.get(id(mine), [])):
            return 3
        return 0 if "/child" not in got.get(id(state), []) else 4  # the parent's state got nothing here

    assert _in_child(child) == 0
    assert tap.close() is state and tap.current() is None
    bus.publish("/closed", 1)
    time.sleep(0.1)
    assert "/closed" not in got[id(state)]


def test_the_dispatcher_delivers_at_once_or_gathers_a_window_into_one_delivery() -> None:
    deliveries: list[list[list[str]]] = []
    done = threading.Event()

    def deliver(batches: list) -> None:  # type: ignore[type-arg]
        deliveries.append(batches)
        done.set()

    at_once = BatchDispatcher(deliver)
    at_once.on_batch(["a"])  # type: ignore[list-item]
    assert deliveries == [[["a"]]]  # on the caller's (the listener's) thread
    deliveries.clear()
    done.clear()
    gathering = BatchDispatcher(deliver, window=0.5)
    for batch in (["b"], ["c"], ["d"]):
        gathering.on_batch(batch)  # type: ignore[arg-type]
    assert deliveries == []  # the listener never waits for the delivery
    assert done.wait(5)
    assert deliveries == [[["b"], ["c"], ["d"]]]  # one delivery: one chunk per client


def test_parking_keeps_threads_for_ordinary_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    from shmbus.adapters import wsgi_support

    monkeypatch.delenv("SHMBUS_WSGI_THREADS", raising=False)
    assert may_park(10_000)  # unknown thread count: no limit here (max_active_clients applies)
    wsgi_support.configure_server(threads=16)
    try:
        assert may_park(13) and not may_park(14)  # 16 - max(1, 16 // 8) = 14 may wait at once
        wsgi_support.configure_server(threads=4)
        assert may_park(2) and not may_park(3)  # at least one thread always stays free
    finally:
        wsgi_support.configure_server(threads=None)
