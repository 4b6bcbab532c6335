"""The buses on this host: their names in ``/dev/shm``, what ``shmbus list`` shows of each, and what
``shmbus destroy`` may remove.

One place answers "which buses exist" for ``shmbus list``, for the hint of an unknown name on the command line and
for :class:`~shmbus.errors.BusNotFound` (``Bus(name)`` without ``create=True``), so a typo is met with the names
it missed.
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import asdict, dataclass
from typing import Any

from .errors import LayoutMismatch, NotASegment, ShmbusError
from .segment import peek, segment_path

__all__ = ["CREATE_HINT", "BusInfo", "bus_names", "describe", "not_found_message", "removal_problem"]

#: what a BusNotFound from ``Bus(name)`` adds: the way to make the bus, where the app owns it
CREATE_HINT = "Bus(name) only attaches; the process that owns the bus makes it with Bus(name, create=True)"

_SHM_DIR = "/dev/shm"
_PREFIX = "shmbus."


def bus_names() -> list[str]:
    """Names of the buses in /dev/shm, sorted (not the temporary files of a bus being created)."""
    try:
        files = os.listdir(_SHM_DIR)
    except FileNotFoundError:
        return []
    names = []
    for f in files:
        if not f.startswith(_PREFIX) or ".init-" in f:
            continue
        names.append(f[len(_PREFIX) :])
    return sorted(names)


@dataclass
class BusInfo:
    """One line of ``shmbus list``: a bus's size in /dev/shm, its attached processes and its age."""

    bus: str
    path: str
    size_bytes: int
    processes: list[int]
    age_seconds: float | None
    problem: str | None = None  # why the segment could not be read (another owner, damaged, a foreign file)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def describe(name: str, *, exclude_pid: int | None = None) -> BusInfo:
    """What ``shmbus list`` shows of bus ``name``, read from its header without attaching (see
    :func:`shmbus.segment.peek`); a file it cannot read is described with the reason."""
    path = segment_path(name)
    try:
        head = peek(path)
    except (ShmbusError, OSError) as exc:
        try:
            size = os.lstat(path).st_size
        except OSError:
            size = 0
        return BusInfo(name, path, size, [], None, str(exc).replace("\n", "\\n") or type(exc).__name__)
    procs = [p for p in head.processes if p != exclude_pid]
    return BusInfo(name, path, head.size, procs, max(time.time() - head.created_at, 0.0))


def not_found_message(name: str, path: str | None = None) -> str:
    """Why ``name`` is not a bus, with the buses that do exist (a typo is then plain to see)."""
    known = bus_names()
    hint = f"; buses on this host: {', '.join(map(repr, known))}" if known else "; there is no bus on this host"
    return f"no bus named {name!r} ({path or segment_path(name)}){hint}"


def removal_problem(path: str, force: bool, *, exclude_pid: int | None = None) -> str | None:
    """Why ``shmbus destroy`` must not remove ``path``, or None: never a symbolic link; never a file that is not a
    segment unless ``force``; never a segment other processes are attached to unless ``force``."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return f"{path!r} is a symbolic link: not removed (destroy never follows or removes a link)"
    try:
        attached = [p for p in peek(path).processes if p != exclude_pid]
    except LayoutMismatch:
        return None  # a segment of another shmbus version: removing it is how to move on (its error says so)
    except (NotASegment, OSError) as exc:
        return None if force else f"{exc}: not removed (pass --force to remove it all the same)"
    if attached and not force:
        return (
            f"bus at {path!r} is in use by process(es) {' '.join(map(str, attached))}: they would go on with a "
            "segment nobody else can attach (a split bus). Stop them first, or pass --force"
        )
    return None
