"""Pub/sub engines, after the iodine pub/sub draft.

An engine is where ``publish`` sends a message. The bus always *reads* from its shared-memory segment; the engine
decides how a message gets there:

* :class:`SharedMemoryEngine` (the default) appends it to the segment directly: every process on the host sees it.
* The Redis bridge (``shmbus.adapters.redis.RedisBridge``) sends it to Redis, which assigns the ids, and
  a relay copies Redis traffic into every host's segment.
* ``publish(..., engine=False)`` bypasses engines and delivers to this process's subscribers only.
* :class:`PubSubEngine` is the draft's own engine interface, method for method (``subscribe(to, is_pattern)``,
  ``unsubscribe(from_, is_pattern)``, ``publish(channel, message)`` with a ``str`` message): an engine written
  from the draft works as it is. The bus calls its ``publish`` after its own bookkeeping (validation,
  encoding); such an engine delivers on this host by calling ``bus.publish(channel, message, engine=False)``.

Engines attached with ``bus.attach(engine)`` are told, once per process, which channels and patterns have
subscribers (``subscribe``/``unsubscribe``), so an engine that relays selectively can follow them. Those two hooks
must never raise; the bus logs and swallows anything they do raise.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from .envelope import BacklogGap, Envelope
from .errors import EngineError, InvalidMessage
from .figures import RelayFigures

if TYPE_CHECKING:
    from .bus.results import Backlog
    from .host import BusHost

__all__ = [
    "BacklogGap",
    "Engine",
    "EngineLike",
    "Envelope",
    "PubSubEngine",
    "RelayFigures",
    "SharedMemoryEngine",
    "as_engine",
]


class Engine:
    """Base class of engines: every method the bus calls, with a default that does nothing.

    The contract: :meth:`publish` is the only method an engine must implement. It stores the message through
    :meth:`BusHost.store <shmbus.host.BusHost.store>` (this host's segment, optionally with ids its backend assigned)
    and/or hands it to a backend from which every host's segment gets it. The bus always reads from its
    segment; :meth:`backlog` may fill what the segment no longer holds. Hooks are called by the bus, never by
    applications; :meth:`subscribe`/:meth:`unsubscribe` must not raise (the bus logs and swallows it if they do).
    """

    def attached(self, bus: BusHost) -> None:
        """The engine was attached to (or made the default of) ``bus``."""

    def detached(self, bus: BusHost) -> None:
        """The engine was detached from ``bus``."""

    def subscribe(self, to: str, is_pattern: bool = False) -> bool:
        """This process now has subscribers for ``to``; called once per channel or pattern. Must not raise."""
        return True

    def unsubscribe(self, from_: str, is_pattern: bool = False) -> bool:
        """This process has no more subscribers for ``from_``. Must not raise."""
        return True

    def publish(self, bus: BusHost, envelope: Envelope) -> int | None:
        """Carry out a publish; return the channel's new message id (or None if it was queued)."""
        raise NotImplementedError(f"{type(self).__name__} must implement publish()")

    def backlog(self, bus: BusHost, gap: BacklogGap) -> Backlog | None:
        """Fill a gap: ``gap.partial`` (read from the segment) misses messages after ``gap.after_id`` that the
        segment no longer holds. Return a fuller :class:`~shmbus.bus.Backlog`, or None to keep ``partial`` (the
        default)."""
        return None

    def health(self) -> dict[str, Any] | None:
        """What an operator should know about the engine (shown by ``Bus.health()`` and ``shmbus stats``)."""
        return None

    def relay_figures(self) -> RelayFigures | None:
        """A bridge's relay figures for the host metrics; None: the engine relays nothing (the default)."""
        return None

    def after_fork(self, bus: BusHost) -> None:
        """Called in a forked child: drop sockets and threads inherited from the parent."""

    def close(self) -> None:
        """Release resources; the bus is closing."""


class SharedMemoryEngine(Engine):
    """The default engine: store in the bus's own segment (ids assigned under the segment's lock)."""

    def publish(self, bus: BusHost, envelope: Envelope) -> int | None:
        return bus.store(envelope)

    def __repr__(self) -> str:
        return "SharedMemoryEngine()"


class PubSubEngine:
    """An engine as the iodine pub/sub draft specifies it (subclass it and implement :meth:`publish`).

    Give it wherever the bus takes an engine (``Bus(engine=...)``, ``bus.default = ...``, ``bus.attach(...)``,
    ``bus.publish(..., engine=...)``). The bus calls :meth:`publish` after its own bookkeeping, with the message
    as a ``str``: the published value itself when it is a string, else its JSON text (the draft allows that
    conversion). The bus stores nothing itself: to reach this process's subscribers and connections the engine
    calls ``bus.publish(channel, message, engine=False)`` (directly, or when its backend echoes the message).
    It carries no targeting, so publishing with ``user_ids``/``group_ids``/``client_ids`` through it raises.
    """

    def subscribe(self, to: str, is_pattern: bool = False) -> bool:
        """This process now subscribes to ``to``; called once per channel or pattern. Must not raise."""
        return True

    def unsubscribe(self, from_: str, is_pattern: bool = False) -> bool:
        """This process no longer subscribes to ``from_``. Must not raise."""
        return True

    def publish(self, channel: str, message: str) -> bool:
        """Publish ``message`` on ``channel``; True if the publication was scheduled, False if it cannot be."""
        raise NotImplementedError(f"{type(self).__name__} must implement publish(channel, message)")


#: What the bus accepts as an engine.
EngineLike = Engine | PubSubEngine


class _DraftEngine(Engine):
    """Adapts a :class:`PubSubEngine` to the bus's :class:`Engine` calls (one adapter per draft engine)."""

    def __init__(self, draft: PubSubEngine) -> None:
        self.draft = draft

    def subscribe(self, to: str, is_pattern: bool = False) -> bool:
        return bool(self.draft.subscribe(to, is_pattern))

    def unsubscribe(self, from_: str, is_pattern: bool = False) -> bool:
        return bool(self.draft.unsubscribe(from_, is_pattern))

    def publish(self, bus: BusHost, envelope: Envelope) -> int | None:
        if envelope.site_id:
            raise InvalidMessage(
                f"{type(self.draft).__name__} is a pub/sub draft engine: it carries a channel and a string, so it "
                f"cannot keep the site {envelope.site_id!r} (publish on {envelope.channel!r} refused)"
            )
        if envelope.meta:
            raise InvalidMessage(
                f"{type(self.draft).__name__} is a pub/sub draft engine: it carries a channel and a string, so it "
                f"cannot keep user_ids/group_ids/client_ids targeting (publish on {envelope.channel!r} refused)"
            )
        data = bus.codec.decode(envelope.payload)
        message = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"), ensure_ascii=False)
        if not self.draft.publish(envelope.channel, message):
            raise EngineError(f"{type(self.draft).__name__}.publish refused the message on {envelope.channel!r}")
        return True  # scheduled; the engine assigns no message id

    def __repr__(self) -> str:
        return f"_DraftEngine({self.draft!r})"


def as_engine(engine: object) -> Engine:
    """The :class:`Engine` the bus drives for ``engine`` (a draft engine gets one adapter, kept on it)."""
    if isinstance(engine, Engine):
        return engine
    if isinstance(engine, PubSubEngine):
        adapter: _DraftEngine | None = engine.__dict__.get("_shmbus_engine")
        if adapter is None:
            adapter = engine.__dict__["_shmbus_engine"] = _DraftEngine(engine)
        return adapter
    raise TypeError(f"engine must be an Engine or a PubSubEngine, got {type(engine).__name__}")
