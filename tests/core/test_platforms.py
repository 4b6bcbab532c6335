"""Issue 34, item 9: off Linux x86-64 with glibc, ``import shmbus`` and the HTTP client work, and ``Bus(...)`` raises
:class:`~shmbus.errors.UnsupportedPlatform` at construction, naming the supported platform and what to use instead.

macOS and ARM64 Linux are simulated in a fresh interpreter (no such machine in CI): ``platform.machine``, and a C
library without glibc's robust-mutex functions (macOS's has neither ``pthread_mutex_timedlock`` nor
``pthread_mutex_consistent``). Before the fix, the first made ``import shmbus`` raise AttributeError.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.harness import REPO_ROOT

PROBE = """
import ctypes, platform, sys, types
platform.machine = lambda: {machine!r}
if {no_glibc!r}:
    ctypes.CDLL = lambda *args, **kwargs: types.SimpleNamespace()  # a C library with none of glibc's extras
import shmbus
import shmbus.client  # the HTTP client attaches no bus: it works here
if {no_glibc!r}:
    sys.platform = "darwin"  # only now: the standard library's imports read it too (urllib's proxies on macOS)
try:
    shmbus.Bus("issue34platform", create=True)
except shmbus.UnsupportedPlatform as exc:
    print("REFUSED:", exc)
else:
    print("ACCEPTED")
"""


@pytest.mark.parametrize(
    ("machine", "no_glibc", "says"),
    [
        ("arm64", True, "this is darwin on arm64"),
        ("aarch64", False, "this is Linux on aarch64"),
    ],
    ids=["macos", "linux-arm64"],
)
def test_import_works_and_a_bus_is_refused_with_what_to_use_instead(machine: str, no_glibc: bool, says: str) -> None:
    code = PROBE.format(machine=machine, no_glibc=no_glibc)
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("REFUSED:"), out
    assert says in out and "Linux x86-64 with glibc" in out  # the supported platform, named
    assert "shmbus.client" in out and "--platform linux/amd64" in out  # what works here, what to develop in
    assert "docs/architecture.md" in out


def test_this_machine_is_supported_or_says_why() -> None:
    from shmbus import _native

    assert _native.supported() is (_native.platform_problem() is None)
