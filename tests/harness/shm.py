"""Finding shmbus shared-memory segments left in /dev/shm (for the leak check).

Segments are ``/dev/shm/shmbus.<bus>`` and ``/dev/shm/shmbus.<bus>.<suffix>`` (lock files
``shmbus.<bus>.lock``).  Test bus names start with ``t<pid>_`` of the pytest process (one per
xdist worker), so a worker only ever blames itself for a leftover.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["SHM_DIR", "SHM_PREFIX", "bus_prefix", "files_for_bus", "shm_files"]

SHM_DIR = Path("/dev/shm")
SHM_PREFIX = "shmbus."


def bus_prefix(pid: int | None = None) -> str:
    """The start of every bus name the ``bus_name`` fixture hands out in process ``pid``."""
    return f"t{os.getpid() if pid is None else pid}_"


def shm_files(name_prefix: str = "") -> set[str]:
    """Names in /dev/shm that start with ``shmbus.<name_prefix>``."""
    start = SHM_PREFIX + name_prefix
    try:
        return {entry.name for entry in os.scandir(SHM_DIR) if entry.name.startswith(start)}
    except FileNotFoundError:
        return set()


def files_for_bus(bus: str) -> set[str]:
    """The segment and lock files of one bus: ``shmbus.<bus>`` and ``shmbus.<bus>.*``."""
    exact = SHM_PREFIX + bus
    return {name for name in shm_files(bus) if name == exact or name.startswith(exact + ".")}
