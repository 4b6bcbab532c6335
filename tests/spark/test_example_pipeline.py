"""The example pipeline (examples/spark_pipeline) end to end: events in, running counts per page out."""

from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from shmbus import Bus

pytestmark = pytest.mark.spark

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "spark_pipeline"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"spark_example_{name}", EXAMPLE / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_click_counts_reach_the_dashboard_channel(spark: Any, bus_name: str, tmp_path: Path) -> None:
    gen, pipeline = _load("generate_events"), _load("pipeline")
    bus: Bus = gen.open_bus(bus_name)
    try:
        gen.publish_events(bus, 300, seed=1)
        expected = Counter(m.data["page"] for m in bus.backlog(gen.EVENTS_CHANNEL, 0))

        def run() -> None:
            q = pipeline.build_query(spark, bus_name, str(tmp_path / "ckpt"), available_now=True)
            try:
                q.awaitTermination(120)
            finally:
                q.stop()

        run()
        latest = {m.data["page"]: m.data for m in bus.backlog(pipeline.DASHBOARD_CHANNEL, 0)}
        assert {p: d["clicks"] for p, d in latest.items()} == dict(expected)
        assert all(0 < d["users"] <= 50 for d in latest.values())

        gen.publish_events(bus, 100, seed=2)  # a rerun from the checkpoint adds only the new events
        expected.update(m.data["page"] for m in bus.backlog(gen.EVENTS_CHANNEL, 300))
        run()
        latest = {m.data["page"]: m.data for m in bus.backlog(pipeline.DASHBOARD_CHANNEL, 0)}
        assert {p: d["clicks"] for p, d in latest.items()} == dict(expected)
    finally:
        bus.destroy()
