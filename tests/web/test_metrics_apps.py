"""The metrics endpoint's ASGI app off the event loop, and the prometheus_client collector, in-process."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from shmbus import Bus
from shmbus.adapters.metrics import MetricsApp
from shmbus.engines import RelayFigures


@pytest.fixture
def bus(bus_name: str) -> Iterator[Bus]:
    b = Bus(bus_name, ring_size=1 << 20, keepalive_interval=0, lock_timeout=2.0, create=True)
    b.publish("/room", {"text": "hello"})
    yield b
    b.destroy()


def test_asgi_metrics_answer_without_blocking_the_event_loop(bus: Bus) -> None:
    """A scrape waits for the segment's lock (stats): in a thread, so the loop goes on meanwhile. Here the loop
    itself is what lets the lock go: rendered in the loop, the scrape would wait until the lock times out."""
    seg = bus.segment
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        seg._lock()
        try:
            held.set()
            release.wait(30)
        finally:
            seg._unlock()

    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def scrape() -> None:
        scope = {"type": "http", "method": "GET", "path": "/metrics", "query_string": b"", "headers": []}
        task = asyncio.create_task(MetricsApp(bus=bus)(scope, receive, send))
        await asyncio.sleep(0)  # the scrape starts and waits for the lock
        await asyncio.sleep(0)
        release.set()  # only the event loop running on lets the holder go
        await asyncio.wait_for(task, 30)

    t = threading.Thread(target=holder)
    t.start()
    try:
        assert held.wait(30)
        asyncio.run(scrape())
    finally:
        release.set()
        t.join(30)
    assert sent[0]["status"] == 200
    assert b"shmbus_published_messages_total" in sent[1]["body"]


def test_bus_collector_exposes_what_render_does(bus: Bus) -> None:
    """``REGISTRY.register(BusCollector(bus))``: the same families, kinds, labels and values as the endpoint's
    text, read back with prometheus_client's own parser; a bridge's relay_lost is exported."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from shmbus.adapters.metrics import BusCollector, render

    class Source:
        def metrics_gauges(self) -> dict[str, int]:
            return {"parked": 4, "streams": 1}

    source = Source()
    bus.metrics.add_source(source)
    bus.metrics.deliveries += 3
    figures = RelayFigures(relaying=False, state="", backend_newest=0, lost=2)  # the engine contract's report
    bus.engines.default.relay_figures = lambda: figures  # type: ignore[method-assign]  # as a bridge's relay counts them
    registry = CollectorRegistry()
    registry.register(BusCollector(bus))

    def parsed(text: str) -> dict[tuple[str, str], list[tuple[str, tuple[tuple[str, str], ...], float]]]:
        return {
            (fam.name, fam.type): sorted((s.name, tuple(sorted(s.labels.items())), s.value) for s in fam.samples)
            for fam in text_string_to_metric_families(text)
        }

    collected = parsed(generate_latest(registry).decode())
    rendered = parsed(render(bus))
    for fam in ("shmbus_ring_history_seconds",):  # a clock: read twice, never equal
        collected.pop((fam, "gauge")), rendered.pop((fam, "gauge"))
    assert collected == rendered
    me = (("bus", bus.name), ("pid", str(os.getpid())))
    assert collected[("shmbus_published_messages", "counter")] == [
        ("shmbus_published_messages_total", (("bus", bus.name),), 1.0)
    ]
    assert ("shmbus_parked_polls", me, 4.0) in collected[("shmbus_parked_polls", "gauge")]
    assert ("shmbus_process_delivered_messages_total", me, 3.0) in collected[
        ("shmbus_process_delivered_messages", "counter")
    ]
    assert collected[("shmbus_relay_lost_messages", "counter")] == [
        ("shmbus_relay_lost_messages_total", (("bus", bus.name),), 2.0)
    ]
