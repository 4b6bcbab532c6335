"""Checks on what callers pass the bus: targets, counts, seconds. Bad values raise before anything is stored."""

from __future__ import annotations

from typing import Any

from ..errors import InvalidArgument, InvalidMessageTarget
from ..segment import MIN_RING

__all__ = ["MAX_WIRE_INT", "MIN_WIRE_INT", "check_count", "check_options", "check_seconds", "check_targets"]

#: Integer ids (targets, message ids) travel as signed 64-bit integers (msgpack in the segment, the gem's JSON).
MIN_WIRE_INT = -(1 << 63)
MAX_WIRE_INT = (1 << 63) - 1


def check_targets(name: str, ids: Any) -> list[Any] | None:
    if ids is None:
        return None
    if isinstance(ids, (str, bytes)) or not isinstance(ids, (list, tuple, set, frozenset)):
        raise InvalidMessageTarget(f"{name} must be a list of ids, got {type(ids).__name__}")
    out = list(ids)
    if not out:
        raise InvalidMessageTarget(f"{name}=[] would target nobody; pass None to target everyone")
    for v in out:
        if isinstance(v, bool) or not isinstance(v, (int, str)):
            raise InvalidMessageTarget(f"{name} entries must be int or str, got {v!r}")
        if isinstance(v, int) and not MIN_WIRE_INT <= v <= MAX_WIRE_INT:
            raise InvalidMessageTarget(f"{name} entry {v} does not fit the wire's signed 64-bit integers")
    return out


def check_count(name: str, value: Any, minimum: int = 1, error: type[InvalidArgument] = InvalidArgument) -> int:
    """An ``int`` (not a bool) in ``[minimum, 2**63)``: backlog sizes, ``clear_every``, ids."""
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_WIRE_INT:
        raise error(f"{name} must be an int from {minimum} to 2**63-1, got {value!r}")
    return value


def check_seconds(name: str, value: Any, error: type[InvalidArgument] = InvalidArgument) -> float:
    """A finite number of seconds above 0: backlog ages."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise error(f"{name} must be a finite number of seconds above 0, got {value!r}")
    return float(value)


def check_options(
    max_backlog_size: int,
    max_global_backlog_size: int,
    max_backlog_age: float,
    clear_every: int,
    ring_size: int,
    max_channels: int,
    lock_timeout: float,
    mode: int,
) -> tuple[float, float]:
    """The :class:`~shmbus.bus.Bus` constructor's checks (bad values raise there, not at first use); returns
    ``max_backlog_age`` and ``lock_timeout`` as floats."""
    check_count("max_backlog_size", max_backlog_size)
    check_count("max_global_backlog_size", max_global_backlog_size)
    max_backlog_age = check_seconds("max_backlog_age", max_backlog_age)
    check_count("clear_every", clear_every)
    if check_count("ring_size", ring_size, MIN_RING) % 4096:
        raise InvalidArgument(f"ring_size must be a multiple of 4096 bytes, got {ring_size}")
    check_count("max_channels", max_channels, 16)
    lock_timeout = check_seconds("lock_timeout", lock_timeout)
    if isinstance(mode, bool) or not isinstance(mode, int) or mode & ~0o666 or (mode & 0o600) != 0o600:
        raise InvalidArgument(f"mode must be permission bits within 0o666 including 0o600, got {mode!r}")
    return max_backlog_age, lock_timeout
