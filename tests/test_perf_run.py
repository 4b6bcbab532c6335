"""``perf/run`` fails a benchmark whose processes logged an error, as a test run would, and prints its figures."""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent

NOISY = textwrap.dedent("""
    import logging, subprocess, sys, threading
    print("figure: 123 msgs/s")
    # a worker process started by the benchmark logs an error (as a listener thread would)
    subprocess.run([sys.executable, "-c",
                    "import logging; logging.getLogger('shmbus').error('listener error on bus %r', 'b')"],
                   check=True)
    def boom():
        raise RuntimeError("a thread died")
    t = threading.Thread(target=boom, name="worker-thread"); t.start(); t.join()
""")


def _perf_run(script: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPO / "perf" / "run"), str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )


def test_a_benchmark_whose_processes_log_errors_fails_the_run(tmp_path: Path) -> None:
    script = tmp_path / "bench_noisy.py"
    script.write_text(NOISY)
    done = _perf_run(script)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "figure: 123 msgs/s" in done.stdout  # the figures still print
    assert "logged 2 error(s)" in done.stderr
    assert "ERROR shmbus: listener error on bus 'b'" in done.stderr
    assert "uncaught RuntimeError in thread worker-thread: a thread died" in done.stderr
    assert "1 errored: bench_noisy" in done.stdout


def test_a_quiet_benchmark_passes(tmp_path: Path) -> None:
    script = tmp_path / "bench_quiet.py"
    script.write_text("import logging\nlogging.getLogger('x').warning('only a warning')\nprint('figure: 1')\n")
    done = _perf_run(script)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no errors" in done.stdout


def _common() -> ModuleType:
    spec = importlib.util.spec_from_file_location("perf_common_under_test", REPO / "perf" / "_common.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_a_ratio_against_a_quoted_figure_never_prints_like_a_measured_one() -> None:
    """A figure quoted from elsewhere (the gem's p99 from its docs) is no same-run baseline: its ratio is printed
    marked with its source, listed after the measured ones, and kept apart in the JSON; ``ratio`` refuses it."""
    rep: Any = _common().Report("bench_x", "t", argparse.Namespace(quick=True, json=False))
    rep.published("gem p99 (best)", 45.0, "ms", "message_bus gem, p99 45-72 ms")
    rep.add("uvicorn p99", [30.0], "ms", higher_is_better=False)
    rep.add("shmbus p99", [15.0], "ms", higher_is_better=False, baselines=["gem p99 (best)", "uvicorn p99"])
    line = next(x for x in rep.render().splitlines() if x.startswith("shmbus p99"))
    assert line.endswith("2.0x uvicorn p99; 3.0x gem p99 (best) (quoted: message_bus gem, p99 45-72 ms)"), line
    row = next(r for r in rep.to_json()["results"] if r["name"] == "shmbus p99")
    assert row["ratios"] == {"uvicorn p99": 2.0}
    assert row["quoted_ratios"] == {
        "gem p99 (best)": {"ratio": 3.0, "baseline": "quoted", "source": "message_bus gem, p99 45-72 ms"}
    }
    assert rep.quoted_ratio("shmbus p99", "gem p99 (best)") == 3.0
    with pytest.raises(ValueError, match="quoted figure"):
        rep.ratio("shmbus p99", "gem p99 (best)")
    with pytest.raises(ValueError, match="not a quoted figure"):
        rep.quoted_ratio("shmbus p99", "uvicorn p99")
