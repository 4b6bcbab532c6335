"""What an engine may touch of the bus it serves: :class:`BusHost`, a :class:`typing.Protocol`.

Engines (:mod:`shmbus.engines`, the Redis and PostgreSQL bridges) are handed the bus in every hook; they see it
through this interface only (its segment, codec, limits and the ``store`` way in), so engines never import
:class:`~shmbus.bus.Bus` and the bus's modules and the engines' do not import each other.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

from .codecs import Codec
from .envelope import Envelope
from .segment import Segment

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["BusHost", "EngineRef", "FlushesFigures", "PublishOptions", "StoredIds"]


class EngineRef(Protocol):
    """Any engine a publish may name: an :class:`~shmbus.engines.Engine` or a draft
    :class:`~shmbus.engines.PubSubEngine` (both are told of subscriptions this way)."""

    def subscribe(self, to: str, is_pattern: bool = False) -> bool: ...

    def unsubscribe(self, from_: str, is_pattern: bool = False) -> bool: ...


class PublishOptions(TypedDict, total=False):
    """The keyword options of :meth:`Bus.publish <shmbus.bus.Bus.publish>` and ``publish_encoded``."""

    #: deliver only to these HTTP client ids / users / groups (``None``: everyone)
    client_ids: Iterable[str] | None
    user_ids: Iterable[int | str] | None
    group_ids: Iterable[int | str] | None
    #: the site (multisite); None asks ``site_id_lookup``; ignored on ``/global/`` channels
    site_id: str | None
    #: per-channel limits for this channel (default: the bus's)
    max_backlog_size: int | None
    max_backlog_age: float | None
    #: None: the default engine; an :class:`~shmbus.engines.Engine` or :class:`~shmbus.engines.PubSubEngine`;
    #: False: this process's subscribers only (the iodine draft's ``engine = false``)
    engine: EngineRef | bool | None


class FlushesFigures(Protocol):
    """This process's figures of a bus (``bus.metrics``): a relay flushes them after a burst."""

    def flush(self) -> bool: ...


class StoredIds(TypedDict, total=False):
    """What an engine may fix of a message it stores (:meth:`BusHost.store`)."""

    global_id: int | None  #: the backend's global id
    message_id: int | None  #: the backend's id of the message in its channel
    timestamp: float | None  #: when the backend took it
    #: store only if the segment's global id is exactly this (a relay keeping the segment contiguous)
    expect_global_id: int | None


class BusHost(Protocol):
    """The bus as an engine sees it (:class:`~shmbus.bus.Bus` implements it)."""

    @property
    def name(self) -> str: ...

    @property
    def codec(self) -> Codec: ...

    @property
    def segment(self) -> Segment:
        """This host's segment (attached on first use)."""
        ...

    @property
    def max_backlog_size(self) -> int: ...

    @property
    def max_backlog_age(self) -> float: ...

    @property
    def max_global_backlog_size(self) -> int: ...

    @property
    def metrics(self) -> FlushesFigures: ...

    @property
    def default(self) -> object:
        """The bus's default engine (an engine compares itself with it)."""
        ...

    def store(self, envelope: Envelope, **ids: Unpack[StoredIds]) -> int:
        """Store ``envelope`` in this host's segment; return its message id (0 when skipped).

        The engine contract's way in: :class:`~shmbus.engines.SharedMemoryEngine` calls it to publish, and an
        engine whose backend assigns ids (the Redis bridge) passes them (:class:`StoredIds`) so every host agrees.
        Every field is validated: :class:`~shmbus.errors.InvalidMessage` on bad input.
        """
        ...

    def publish(self, channel: str, data: Any, **options: Unpack[PublishOptions]) -> int | None:
        """The bus's own publish (an engine batching publishes hands them back with ``engine=self``)."""
        ...

    def reset(self) -> int:
        """Empty the segment for every process (a relay that found the backend reset)."""
        ...
