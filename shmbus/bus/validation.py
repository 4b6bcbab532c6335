"""Checks on what callers pass the bus: targets, counts, seconds. Bad values raise before anything is stored."""

from __future__ import annotations

from typing import Any

from ..errors import InvalidArgument, InvalidMessageTarget

__all__ = ["MAX_WIRE_INT", "MIN_WIRE_INT", "check_count", "check_seconds", "check_targets"]

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
