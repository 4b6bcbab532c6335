"""What the ``shmbus`` command line's arguments mean, shared by its commands (and the HTTP client's ``listen``):
the bus a command names, opening it (existing buses only), and argparse types that refuse bad values up front."""

from __future__ import annotations

import argparse
import math
import os
import sys

from .buses import not_found_message
from .segment import Segment

__all__ = ["bus_name", "count", "human_size", "ids", "no_such_bus", "open_existing", "others", "seconds"]


def bus_name(args: argparse.Namespace) -> str:
    return args.bus or os.environ.get("SHMBUS_NAME", "default")


def open_existing(args: argparse.Namespace) -> Segment:
    try:
        return Segment.open(bus_name(args), create=False, path=args.path)
    except FileNotFoundError:
        sys.exit(no_such_bus(args))


def no_such_bus(args: argparse.Namespace) -> str:
    return "shmbus: " + not_found_message(bus_name(args), args.path)


def others(pids: list[int]) -> list[int]:
    """The attached processes other than this command itself."""
    me = os.getpid()
    return [p for p in pids if p != me]


def seconds(value: str) -> float:
    """argparse type: a positive, finite number of seconds (``--watch -1`` or ``nan`` is refused up front)."""
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise argparse.ArgumentTypeError(f"{value!r}: must be a positive number of seconds")
    return seconds


def count(value: str) -> int:
    """argparse type: a count of 0 or more (0: no limit)."""
    try:
        count = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if count < 0:
        raise argparse.ArgumentTypeError(f"{value!r}: must be 0 (no limit) or more")
    return count


def ids(value: str) -> int | str:
    return int(value) if value.lstrip("-").isdigit() else value


def human_size(n: int) -> str:
    """``n`` bytes for a person: ``12.5 MiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n:.1f} TiB"
