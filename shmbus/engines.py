"""Pub/sub engines, after the iodine pub/sub draft.

An engine is where ``publish`` sends a message. The bus always *reads* from its shared-memory segment; the engine
decides how a message gets there:

* :class:`SharedMemoryEngine` (the default) appends it to the segment directly: every process on the host sees it.
* The Redis bridge (``shmbus.adapters.redis.RedisBridge``) sends it to Redis, which assigns the ids, and
  a relay copies Redis traffic into every host's segment.
* ``publish(..., engine=False)`` bypasses engines and delivers to this process's subscribers only.

Engines attached with ``bus.attach(engine)`` are told, once per process, which channels and patterns have
subscribers (``subscribe``/``unsubscribe``), so an engine that relays selectively can follow them. Those two hooks
must never raise; the bus logs and swallows anything they do raise.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from .bus import Bus

__all__ = ["Engine", "Envelope", "SharedMemoryEngine"]


class Envelope(NamedTuple):
    """A message on its way to an engine: validated, encoded, targeting packed."""

    channel: str
    site_id: str | None
    payload: bytes  # codec output
    meta: bytes  # packed targeting (empty = everyone)
    max_backlog_size: int
    max_backlog_age: float


class Engine:
    """Base class for engines; override what you need. Hooks are called by the bus, never by applications."""

    def attached(self, bus: Bus) -> None:
        """The engine was attached to (or made the default of) ``bus``."""

    def detached(self, bus: Bus) -> None:
        """The engine was detached from ``bus``."""

    def subscribe(self, to: str, is_pattern: bool = False) -> bool:
        """This process now has subscribers for ``to``; called once per channel or pattern. Must not raise."""
        return True

    def unsubscribe(self, from_: str, is_pattern: bool = False) -> bool:
        """This process has no more subscribers for ``from_``. Must not raise."""
        return True

    def publish(self, bus: Bus, envelope: Envelope) -> int | None:
        """Carry out a publish; return the channel's new message id (or None if it was queued)."""
        raise NotImplementedError

    def after_fork(self, bus: Bus) -> None:
        """Called in a forked child: drop sockets and threads inherited from the parent."""

    def close(self) -> None:
        """Release resources; the bus is closing."""


class SharedMemoryEngine(Engine):
    """The default engine: append to the bus's own segment (ids assigned under the segment's lock)."""

    def publish(self, bus: Bus, envelope: Envelope) -> int | None:
        return bus._append(envelope)

    def __repr__(self) -> str:
        return "SharedMemoryEngine()"
