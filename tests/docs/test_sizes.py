"""The sizes the README gives for a bus in /dev/shm are measured, not remembered (it once said 32 MiB: the ring
alone; a bus is 34.5 MiB, the demo's 66.5 MiB)."""

from __future__ import annotations

import os
import re

from shmbus import Bus
from tests.harness import REPO_ROOT

README = (REPO_ROOT / "README.md").read_text()


def _bytes_of_a_bus(name: str, **options: int) -> int:
    bus = Bus(name, keepalive_interval=0, create=True, **options)
    try:
        return os.path.getsize(bus.segment.path)
    finally:
        bus.destroy()


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def test_the_readme_gives_the_measured_size_of_a_default_bus(bus_name: str) -> None:
    size = _bytes_of_a_bus(bus_name)
    assert f"the bus ({_mib(size)} of /dev/shm) stays" in README
    overhead = size - (32 << 20) - 8192 * 320
    assert f"`ring_size` + 320 bytes per\n`max_channels` + {overhead / 1024:.1f} KiB" in README
    assert f"{_mib(size)} with the defaults" in README


def test_the_readme_gives_the_measured_size_of_the_demos_bus(bus_name: str) -> None:
    app = (REPO_ROOT / "examples" / "demo" / "app.py").read_text()
    ring = re.search(r"Bus\(os\.environ\.get\(\"SHMBUS_DEMO_BUS\", \"demo\"\), ring_size=(\d+) << 20", app)
    assert ring, "the demo's Bus(...) line changed: update this test"
    size = _bytes_of_a_bus(bus_name, ring_size=int(ring.group(1)) << 20)
    assert f"its bus takes {_mib(size)} of `/dev/shm`" in README
