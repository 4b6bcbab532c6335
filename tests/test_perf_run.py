"""``perf/run`` fails a benchmark whose processes logged an error, as a test run would, and prints its figures."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

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
