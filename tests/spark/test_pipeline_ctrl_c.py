"""Ctrl-C on the example pipeline stops it quietly: "stopping", the running batch commits, and no py4j traceback.

It printed about 40 lines of tracebacks first: pyspark's SIGINT handler calls into the JVM (cancelAllJobs) from
inside the signal while the main thread waits on the same py4j connection in ``awaitTermination``. The pipeline
now only notes the Ctrl-C and stops between JVM calls (see examples/spark_pipeline/pipeline.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from shmbus import Bus
from tests.harness import skip_or_fail
from tests.harness.spark import spark_problem

pytestmark = pytest.mark.spark

PIPELINE = Path(__file__).resolve().parents[2] / "examples" / "spark_pipeline" / "pipeline.py"


def test_ctrl_c_stops_the_pipeline_quietly(bus_name: str, procs: Any, tmp_path: Path) -> None:
    problem = spark_problem()
    if problem:
        skip_or_fail(problem)
    bus = Bus(bus_name, ring_size=1 << 20, keepalive_interval=0, create=True)
    try:
        bus.publish("/events/clicks", {"page": "/a", "user": "u1", "ts": time.time()})
        out = tmp_path / "out.txt"
        with out.open("wb") as sink:
            proc = procs.spawn(
                [sys.executable, str(PIPELINE), "--bus", bus_name, "--checkpoint", str(tmp_path / "ck")],
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
            deadline = time.monotonic() + 300  # a loaded 2-core machine takes a while to start the JVM
            while not bus.backlog("/dashboard/clicks", 0) and time.monotonic() < deadline:  # one batch done
                assert proc.poll() is None, out.read_text()
                time.sleep(0.5)
            assert bus.backlog("/dashboard/clicks", 0), out.read_text()
            os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole process group
            proc.wait(timeout=120)
        text = out.read_text()
        assert proc.returncode == 0, text
        after = text[text.index("Ctrl-C to stop") :].splitlines()[1:]
        assert after[:1] == ["stopping (the running batch commits first)"], text
        assert "Traceback" not in text and "ERROR" not in text and len(after) <= 2, text
    finally:
        bus.destroy()
