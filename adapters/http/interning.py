"""Bounded interning: one shared object per distinct value, so that thousands of parked requests naming the same
channels, groups and index keys hold one copy between them (memory per parked poll)."""

from __future__ import annotations

from collections.abc import Hashable
from typing import TypeVar

__all__ = ["intern_bounded"]

T = TypeVar("T", bound=Hashable)


def intern_bounded(table: dict[T, T], value: T, limit: int) -> T:
    """The object in ``table`` equal to ``value`` (``value`` itself the first time); the table is emptied when it
    reaches ``limit`` entries, so hostile input cannot grow it (a value seen again is simply stored again)."""
    shared = table.get(value)
    if shared is None:
        if len(table) >= limit:
            table.clear()
        shared = table[value] = value
    return shared
