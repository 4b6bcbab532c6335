"""``SHMBUS_PROBE`` (``shmbus.adapters.probe``): per-stage histograms, their files, the merged report, and the
stages a loop's fan-out notes. No clock is asserted: the durations are chosen, or only counted."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any, cast

import pytest

from shmbus import Bus
from shmbus.adapters import fanout as fanout_mod
from shmbus.adapters import probe as probe_mod
from shmbus.adapters.http import Options
from shmbus.adapters.probe import Histogram, Probe, load, report
from shmbus.message import Message

from .mock_transport import FakeLoop


def test_a_histogram_keeps_counts_in_log_buckets_and_percentiles_from_them() -> None:
    h = Histogram()
    for ms in [1.0] * 98 + [50.0, 200.0]:
        h.add(ms / 1e3)
    assert h.n == 100 and h.max == pytest.approx(0.2) and h.total == pytest.approx(0.348)
    assert 0.001 <= h.percentile(50) <= 0.0012, "a bucket spans ~19% above its value"
    assert 0.05 <= h.percentile(99) <= 0.06
    assert h.percentile(100) == pytest.approx(0.2), "the top percentile is capped at the max"
    assert Histogram().percentile(50) != Histogram().percentile(50), "an empty histogram has no percentile (nan)"


def test_processes_write_their_histograms_and_the_report_merges_them_minus_a_snapshot(tmp_path: Path) -> None:
    prefix = str(tmp_path / "stage")
    a, b = Probe(prefix), Probe(prefix)
    a.note("small", 0.002)
    a.dump()
    os.replace(f"{prefix}.{os.getpid()}.json", f"{prefix}.1.json")  # another process's file
    b.note("small", 0.004)
    b.note("lag", 0.0001)
    b.dump()
    merged = load(prefix)
    assert merged["small"].n == 2 and merged["lag"].n == 1
    text = report(prefix)
    assert text.splitlines()[0].split()[:3] == ["small", "n", "2"] and "lag" in text
    b.note("small", 0.1)
    b.dump()
    since = report(prefix, merged).splitlines()
    assert len(since) == 1 and since[0].split()[:3] == ["small", "n", "1"], "the snapshot was not subtracted"


def test_a_probe_counts_time_since_a_publish_and_ignores_messages_without_one(tmp_path: Path) -> None:
    p = Probe(str(tmp_path / "x"))
    p.since_publish("small", time.time() - 0.5)
    p.since_publish("small", 0.0)
    assert p.stages["small"].n == 1 and p.stages["small"].total >= 0.5


def test_the_fan_out_notes_its_stages_when_the_probe_is_on(
    shared_bus: Bus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Off (the default) nothing is kept; on, a drain notes gather and dispatch, a small fan-out its publish ->
    woken time, a large one its slices and its end, and the loop's lag timer is armed."""
    assert probe_mod.PROBE is None or os.environ.get("SHMBUS_PROBE"), "the probe is on without SHMBUS_PROBE"
    p = Probe(str(tmp_path / "stage"))
    monkeypatch.setattr(fanout_mod, "PROBE", p)
    loop = FakeLoop()
    eng = fanout_mod.LoopFanout(shared_bus, Options(batch_window=0.002), cast(asyncio.AbstractEventLoop, loop))
    assert [t.callback.__name__ for t in loop.pending()] == ["tick"], "no lag timer on the loop"
    woken: list[Any] = []
    eng.proto.wake = woken.append  # type: ignore[method-assign,assignment]
    msg = Message(1, 1, "/x", b'"x"', shared_bus.codec, timestamp=time.time())
    for clients in (["a", "b"], list(range(100))):
        eng.proto.deliver_batches = lambda batches, deferred=None, clients=clients: clients  # type: ignore[method-assign,misc]
        eng.add([msg])
        eng.drain()
        while eng.runs:
            loop.turn()
    counts = {name: h.n for name, h in p.stages.items()}
    assert counts["listener"] == 2 and counts["dispatch"] == 2
    assert counts["gather"] == 1 and counts["gather_large"] == 1
    assert counts["small"] == 1 and counts["large"] == 1 and counts["slice"] >= 1
    assert len(woken) == 102
