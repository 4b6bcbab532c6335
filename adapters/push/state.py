"""What the elected sender persists and the one interface of its stores (:mod:`.stores` on disk, :mod:`.pgstore`
in PostgreSQL): both stores and the connector import it from here, so no store needs the other."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from .subscriptions import Registration

__all__ = ["COUNTERS", "HEARTBEAT", "SenderState", "StaleSender", "Store"]

#: Seconds between saves of an idle sender (its state's ``updated``: ``shmbus_push_sender_up``).
HEARTBEAT = 5.0

COUNTERS = ("sent", "failed", "retried", "expired", "dropped", "missed", "unroutable")


class StaleSender(Exception):
    """A cursor save by a sender whose term is over (another sender took over)."""


@dataclass
class SenderState:
    """What the elected sender persists: ``cursor`` (None before the first sender ran), counters since the store
    was made, the queue depth at the last save, who saves it and its ``term``."""

    cursor: int | None = None
    term: int = 0
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    queue_depth: int = 0
    leader: str = ""
    updated: float = 0.0

    @classmethod
    def from_json(cls, item: dict[str, Any]) -> SenderState:
        counters = dict.fromkeys(COUNTERS, 0)
        counters.update({k: int(v) for k, v in (item.get("counters") or {}).items() if k in counters})
        return cls(item.get("cursor"), int(item.get("term") or 0), counters, int(item.get("queue_depth") or 0),
                   str(item.get("leader") or ""), float(item.get("updated") or 0.0))  # fmt: skip


class Store(Protocol):
    """Durable subscriptions and sender state, shared by every process (and host) of one push namespace."""

    def add(self, reg: Registration) -> None:
        """Insert or replace the device ``reg.endpoint`` (a browser that signs in as another user moves to them)."""

    def remove(self, endpoint: str, user_id: Any = None) -> bool:
        """Remove a device (only if it is ``user_id``'s, when given); True when one was removed."""

    def of_user(self, user_id: Any) -> list[Registration]: ...

    def all(self) -> list[Registration]: ...

    def version(self) -> Any:
        """Changes whenever the subscriptions change (the sender reloads them then)."""

    def take_over(self, leader: str) -> SenderState:
        """Start a new term for ``leader`` and return the state (called by a newly elected sender)."""

    def save(self, state: SenderState) -> None:
        """Persist ``state`` (its cursor, counters, queue depth); :class:`StaleSender` when its term is over."""

    def load(self) -> SenderState: ...

    def close(self) -> None: ...
