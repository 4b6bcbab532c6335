"""The bus's retention limits, one object shared by the parts that publish and read (a change is seen by all)."""

from __future__ import annotations

from typing import Generic, TypeVar, cast

__all__ = ["Forwarded", "RetentionLimits"]

T = TypeVar("T")


class RetentionLimits:
    """``max_backlog_size`` (per channel), ``max_global_backlog_size``, ``max_backlog_age`` (seconds) and
    ``clear_every``, as :class:`~shmbus.bus.Bus` validated them."""

    __slots__ = ("clear_every", "max_backlog_age", "max_backlog_size", "max_global_backlog_size")

    def __init__(
        self, max_backlog_size: int, max_global_backlog_size: int, max_backlog_age: float, clear_every: int
    ) -> None:
        self.max_backlog_size = max_backlog_size
        self.max_global_backlog_size = max_global_backlog_size
        self.max_backlog_age = max_backlog_age
        self.clear_every = clear_every


class Forwarded(Generic[T]):
    """A public attribute of the bus kept in one of its parts (``Forwarded[int]("_limits")``: ``bus.x`` reads and
    writes ``bus._limits.x``), so the parts that use it see a change at once."""

    def __init__(self, part: str) -> None:
        self._part = part
        self._name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    def __get__(self, obj: object, owner: type | None = None) -> T:
        if obj is None:
            return cast(T, self)
        return cast(T, getattr(getattr(obj, self._part), self._name))

    def __set__(self, obj: object, value: T) -> None:
        setattr(getattr(obj, self._part), self._name, value)
