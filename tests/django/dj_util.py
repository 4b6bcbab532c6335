"""Helpers for the Django tests (a module, not the conftest: conftest modules of other folders share the name)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

#: tests/django: holds the ``djtest`` project; child processes get it on PYTHONPATH.
DJTEST_DIR = Path(__file__).resolve().parent


def run_django(env: dict[str, str], *args: str) -> str:
    """``python -m django ARGS`` in a child process with ``env``; its stdout (fails with its stderr)."""
    from tests.harness.procs import _child_env

    proc = subprocess.run(
        [sys.executable, "-m", "django", *args],
        env=_child_env(env, DJTEST_DIR),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"django {args} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout
