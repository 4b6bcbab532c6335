"""scripts/apt_wait.sh: the install scripts' apt-get waits, bounded and said, while another apt/dpkg holds a lock
(it failed in seconds: a fresh machine's unattended-upgrades, or a second install, broke ``scripts/test``)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.harness import TESTS_DIR

SCRIPTS = TESTS_DIR.parent / "scripts"
LISTS_LOCKED = "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 4321 (apt-get)"

# A stand-in apt-get: refuses with ``$MESSAGE`` (exit 100) while the count of earlier calls is below ``$REFUSE``,
# then succeeds; every call's arguments are appended to calls.txt.
FAKE_APT_GET = """#!/bin/sh
dir=$(dirname "$0")
echo "$*" >> "$dir/calls.txt"
n=$(wc -l < "$dir/calls.txt")
if [ "$n" -le "$REFUSE" ]; then echo "$MESSAGE" >&2; exit 100; fi
exit 0
"""


def _apt_get(
    tmp_path: Path, refuse: int, message: str, wait: int
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    fake = tmp_path / "apt-get"
    fake.write_text(FAKE_APT_GET)
    fake.chmod(0o755)
    script = f'set -euo pipefail\nlog() {{ echo "log: $*" >&2; }}\nsource {SCRIPTS / "apt_wait.sh"}\napt_get update -qq'
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "REFUSE": str(refuse), "MESSAGE": message,
           "SHMBUS_APT_LOCK_WAIT": str(wait), "APT_LOCK_POLL": "0.05"}  # fmt: skip
    run = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=120)
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    return run, calls


def test_a_held_lock_is_waited_for_and_said(tmp_path: Path) -> None:
    run, calls = _apt_get(tmp_path, refuse=3, message=LISTS_LOCKED, wait=300)
    assert run.returncode == 0, run.stderr
    assert calls == ["update -qq"] * 4
    said = [line for line in run.stderr.splitlines() if line.startswith("log: ")]
    assert len(said) == 1 and "waiting for it (at most 300s)" in said[0] and "held by process 4321" in said[0]


def test_the_wait_is_bounded(tmp_path: Path) -> None:
    """A lock held for good: apt-get's own failure comes back once the wait is spent (1 s here), with the
    reason shown."""
    run, calls = _apt_get(tmp_path, refuse=10**9, message=LISTS_LOCKED, wait=1)
    assert run.returncode == 100
    assert "still held after 1s: giving up" in run.stderr and LISTS_LOCKED in run.stderr
    assert len(calls) >= 1


def test_other_failures_are_not_retried(tmp_path: Path) -> None:
    run, calls = _apt_get(tmp_path, refuse=1, message="E: Unable to locate package nosuch", wait=300)
    assert run.returncode == 100 and calls == ["update -qq"]
    assert "Unable to locate package nosuch" in run.stderr and "waiting" not in run.stderr


def test_every_install_script_goes_through_it() -> None:
    """No script runs apt-get itself (the lock would fail it at once again)."""
    for name in ("test", "perf-deps", "demo"):
        text = (SCRIPTS / name).read_text()
        bare = [line for line in text.splitlines() if re.search(r"(^|[\s\"])apt-get (update|install)", line)
                and not line.lstrip().startswith("#") and "log " not in line]  # fmt: skip
        assert bare == [] and "apt_wait.sh" in text, (name, bare)
