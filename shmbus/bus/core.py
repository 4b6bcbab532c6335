"""``Bus``: message_bus's API over a shared-memory segment that every process on the host attaches to by name.

The bus is a facade: it validates its options and owns one object per concept (see ``docs/architecture.md``):
the :class:`~.attachment.Attachment` (the segment), :class:`~.names.Names` (keys and decoded messages), the
:class:`~.engine_table.EngineTable`, the :class:`~.publishing.Publisher`, the :class:`~.reading.Reader`, the
:class:`~.subscriptions.SubscriptionTable`, the :class:`~.subscribing.Subscriber` and the :class:`~.listener.Listener`
thread.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import forks
from .. import segment as _segment
from .._native import require_supported
from ..buses import CREATE_HINT, not_found_message
from ..channels import check_bus_name
from ..codecs import Codec, get_codec
from ..engines import EngineLike, as_engine
from ..envelope import Envelope
from ..errors import BusNotFound
from ..figures import BusFigures
from ..host import PublishOptions, StoredIds
from ..message import Message
from ..metrics import Metrics
from ..perprocess import Birth
from ..presence import Member, PresenceEvent, hub_for
from ..segment import Segment
from .attachment import Attachment
from .engine_table import EngineTable
from .lifecycle import BusLifecycle
from .limits import Forwarded, RetentionLimits
from .listener import Listener
from .names import Names
from .publishing import Publisher
from .reading import Reader
from .results import Backlog, Callback, Subscription
from .subscribing import Subscriber
from .subscriptions import BatchListener, SubscriptionTable
from .validation import check_options

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["Bus"]


class Bus(BusLifecycle):
    """A message bus shared by every process on the host that opens the same ``name``.

    Nothing is attached until first use, so a ``Bus`` can be built at import time in a pre-forking master.
    Options mirror message_bus (times in seconds):

    ``ring_size`` (bytes of history, default 32 MiB) and ``max_channels`` (8192) size the segment when this
    process creates it; ``path`` maps a regular file instead of ``/dev/shm`` (a persistent log); ``codec``
    (``"json"``, ``"msgpack"`` or a :class:`~shmbus.codecs.Codec`); ``max_backlog_size`` (1000 per channel),
    ``max_global_backlog_size`` (2000), ``max_backlog_age`` (7 days without a publish expires a channel and
    restarts its ids), ``clear_every`` (1); ``site_id_lookup`` (zero-argument callable giving the current site);
    ``keepalive_interval`` (60; 0 or anything <= 20 disables it); ``engine`` (the default engine); ``create``
    (False: attach only, :class:`~shmbus.errors.BusNotFound` here if the bus does not exist, naming those that do,
    so a typo never makes a new 34.5 MiB bus; True where the app makes its bus); ``mode`` (permission bits of a new
    segment and the most an existing one may grant: ``0o600``, or ``0o660`` to share the bus with a group);
    ``lock_timeout`` (seconds a publish or attach waits for the writer lock before
    :class:`~shmbus.errors.BusLockTimeout`, 5). Bad values raise :class:`~shmbus.errors.InvalidArgument` here, not
    at first use, and so does :class:`~shmbus.errors.UnsupportedPlatform` off Linux x86-64 with glibc.
    """

    #: The iodine pub/sub draft's ``pubsub?``: the version of the draft this API follows (0, the draft's
    #: development version). Client connections of the SSE and WebSocket transports carry it too.
    pubsub_version: int = 0

    def __init__(
        self,
        name: str = "default",
        *,
        ring_size: int = 32 << 20,
        max_channels: int = 8192,
        path: str | None = None,
        codec: str | Codec | None = None,
        max_backlog_size: int = 1000,
        max_global_backlog_size: int = 2000,
        max_backlog_age: float = 604800,
        clear_every: int = 1,
        site_id_lookup: Callable[[], str | None] | None = None,
        keepalive_interval: float = 60,
        engine: EngineLike | None = None,
        create: bool = False,
        mode: int = 0o600,
        lock_timeout: float = 5.0,
    ) -> None:
        require_supported()  # here, not at first use: import shmbus works everywhere, a bus only where it can
        check_bus_name(name)
        if not create and not os.path.lexists(path or _segment.segment_path(name)):
            # now, not at first use: a mistyped name fails where it is written, naming the buses that exist
            raise BusNotFound(not_found_message(name, path) + f" ({CREATE_HINT})")
        max_backlog_age, lock_timeout = check_options(
            max_backlog_size, max_global_backlog_size, max_backlog_age, clear_every, ring_size, max_channels,
            lock_timeout, mode,
        )  # fmt: skip
        self.name = name
        self.codec: Codec = get_codec(codec)
        self.client_message_filters: list[tuple[str, Callable[[Message], bool]]] = []
        self._birth = Birth()
        self._limits = limits = RetentionLimits(max_backlog_size, max_global_backlog_size, max_backlog_age, clear_every)
        self._names = names = Names(self.codec, site_id_lookup)
        self._attachment = at = Attachment(
            name, ring_size, max_channels, self.codec.name, path, create, mode, lock_timeout
        )
        #: the default engine, the attached ones, and what they were told of this process's subscriptions
        self.engines = EngineTable(self, engine)
        #: this process's subscriptions and batch listeners, and the dispatch of messages to them
        self.subscriptions = table = SubscriptionTable(self.engines)
        #: this process's figures (deliveries, gauges) for the host-wide metrics: :mod:`shmbus.metrics`
        self.metrics = Metrics(self.figures, at.here)
        #: the thread that follows the ring and dispatches new messages
        self.listener = Listener(name, at, names, table, self.metrics, self.publish, keepalive_interval)
        self._reader = Reader(self, at, names, limits, self.engines)
        self._publisher = Publisher(self, at, names, limits, self.engines, table.deliver_here)
        self._subscriber = Subscriber(at, names, self._reader, table, self.listener.ensure)
        self._attachment.on_attach += [self.engines.adopt_bridge, lambda seg: self._publisher.rearm()]
        self.engines.default.attached(self)
        forks.register(self)

    ring_size = Forwarded[int]("_attachment")
    max_channels = Forwarded[int]("_attachment")
    path = Forwarded["str | None"]("_attachment")
    create = Forwarded[bool]("_attachment")
    mode = Forwarded[int]("_attachment")
    lock_timeout = Forwarded[float]("_attachment")

    max_backlog_size = Forwarded[int]("_limits")
    max_global_backlog_size = Forwarded[int]("_limits")
    max_backlog_age = Forwarded[float]("_limits")
    clear_every = Forwarded[int]("_limits")
    keepalive_interval = Forwarded[float]("listener")

    @property
    def site_id_lookup(self) -> Callable[[], str | None] | None:
        return self._names.site_id_lookup

    @site_id_lookup.setter
    def site_id_lookup(self, lookup: Callable[[], str | None] | None) -> None:
        self._names.site_id_lookup = lookup
        self._publisher.rearm()

    @property
    def segment(self) -> Segment:
        """The attached segment (attaching on first use)."""
        return self._attachment.segment

    @property
    def epoch(self) -> int:
        """Random per-segment generation: a new value means the bus was reset (ids restarted)."""
        return self.segment.read_epoch()

    def stats(self) -> _segment.SegmentStats:
        return self.segment.stats()

    def publish(self, channel: str, data: Any, **options: Unpack[PublishOptions]) -> int | None:
        """Publish ``data`` on ``channel``; return the channel's new message id.

        Options (:class:`~.publishing.PublishOptions`): ``client_ids``, ``user_ids``, ``group_ids``
        (targeting), ``site_id``, ``max_backlog_size``, ``max_backlog_age`` (this channel's limits), ``engine``.
        Returns None when publishing is switched off (``off()``), and True when no id is assigned:
        ``engine=False`` (delivered to this process's subscribers and transport connections only, nothing stored)
        or a :class:`~shmbus.engines.PubSubEngine` (the draft's "true: scheduled"). Raises ``TypeError`` (naming
        the channel) when the codec cannot encode ``data`` or an option is unknown, and
        :class:`InvalidMessage` / :class:`InvalidChannel` for bad input; nothing is written in either case.
        Unlike the gem, ``max_backlog_size`` is honoured together with ``max_backlog_age``.
        """
        return self._publisher.publish(channel, data, options)

    def publish_encoded(self, channel: str, payload: bytes, **options: Unpack[PublishOptions]) -> int | None:
        """:meth:`publish` for data already in the bus's codec (``payload`` is stored as is: a pipeline that
        holds encoded rows skips a decode and an encode). The caller vouches that ``payload`` decodes."""
        return self._publisher.publish_payload(channel, payload, options)

    def store(self, envelope: Envelope, **ids: Unpack[StoredIds]) -> int:
        """Store ``envelope`` in this host's segment; return its message id (0 when skipped). The engine
        contract's way in: see :meth:`BusHost.store <shmbus.host.BusHost.store>`."""
        return self._publisher.store(envelope, ids)

    def last_id(self, channel: str, site_id: str | None = None) -> int:
        """Id of the newest message on ``channel`` (0 when empty, unknown or expired)."""
        return self._reader.last_id(channel, site_id)

    def last_ids(self, *channels: str, site_id: str | None = None) -> dict[str, int]:
        """``{channel: last_id}`` for several channels in one call."""
        return self._reader.last_ids(channels, site_id)

    def backlog(
        self,
        channel: str | None = None,
        last_id: int | None = 0,
        site_id: str | None = None,
        *,
        upto: int | None = None,
        limit: int | None = None,
    ) -> Backlog:
        """Retained messages on ``channel`` with id above ``last_id`` (and at most ``upto``), oldest first.

        ``channel=None`` reads the global backlog. ``limit`` caps the count from the oldest end (guble's replay
        with start id and count). The result is a :class:`Backlog`: a list that also reports any gap.
        """
        return self._reader.backlog(channel, last_id, site_id, upto, limit)

    def look_back(self, channel: str, count: int, site_id: str | None = None) -> int:
        """The id after which ``channel``'s last ``count`` messages lie: ``backlog(channel, look_back(ch, n))``
        reads the last n. Ids are usually contiguous (``last_id - count``); under an engine whose message ids
        are global ids (PostgreSQL) they are not, and the messages are counted instead."""
        return self._reader.look_back(channel, count, site_id)

    def last_message(self, channel: str, site_id: str | None = None) -> Message | None:
        return self._reader.last_message(channel, site_id)

    def global_backlog(self, last_id: int | None = None) -> list[Message]:
        """Messages of every channel and site with global id above ``last_id`` (at most
        ``max_global_backlog_size``, the newest), oldest first; per-channel trimming and expiry apply."""
        return self._reader.global_backlog(last_id)

    def subscribe(
        self,
        channel: str | None,
        callback: Callback,
        last_id: int | None = None,
        *,
        pattern: bool | str = False,
        site_id: str | None = None,
        owner: object = None,
    ) -> Subscription | None:
        """Call ``callback(message)`` for every message on ``channel`` (all sites), on this process's listener.

        ``channel=None`` receives every channel. ``last_id``: None (or -1) = only new messages; 0 = the whole
        retained backlog first; n = messages after n; -k (k >= 2) = the last k-1 messages first. The replay runs
        in the calling thread before this returns, and live messages follow with no gap and no duplicate.
        ``pattern=True``/``"glob"`` or ``"prefix"`` subscribes to a pattern (see :mod:`shmbus.patterns`).
        ``owner`` (any object, e.g. a connection) gives the iodine draft's rule: a new subscription *replaces*
        the owner's existing one to the same channel (or pattern of the same kind), and the owner is held weakly
        when it allows it (so is a callback that is its bound method): once it is garbage collected its
        subscriptions close. Without an owner, several callbacks may share a channel, as in the gem. Returns the
        :class:`Subscription`, or None when the bus is ``off()``.
        """
        return self._subscriber.subscribe(channel, callback, last_id, pattern, None, site_id, owner)

    def local_subscribe(
        self, channel: str | None, callback: Callback, last_id: int | None = None, *, pattern: bool | str = False
    ) -> Subscription | None:
        """Like :meth:`subscribe`, but only for messages of the current site (``site_id_lookup()``)."""
        lookup = self.site_id_lookup
        site = lookup() if lookup else None
        return self._subscriber.subscribe(channel, callback, last_id, pattern, site or None, site or None)

    def unsubscribe(
        self,
        channel: str | None = None,
        callback: Callback | Subscription | None = None,
        *,
        pattern: bool | str = False,
        owner: object = None,
    ) -> int:
        """Remove subscriptions on ``channel`` (or pattern): the one given, or all of them (all of ``owner``'s,
        when given). Returns how many."""
        return self.subscriptions.remove(channel, callback, pattern=bool(pattern), owner=owner)

    def presence(self, channel: str, *, wait: float | None = None) -> list[Member]:
        """The clients present on ``channel`` on this host, as its web workers with the ``presence`` option see
        them (docs/presence.md); the first call in a process waits up to ``wait`` s (one heartbeat) to hear them."""
        return hub_for(self).members(channel, wait)

    def follow_presence(self, callback: Callable[[PresenceEvent], Any]) -> Callable[[], None]:
        """Call ``callback(event)`` (a :class:`~shmbus.presence.PresenceEvent`: join or leave) on this process's
        presence thread for every change on this host; returns a function that stops it."""
        return hub_for(self).follow(callback)

    def tap(self, listener: BatchListener, linger: float = 0.0) -> None:
        """Call ``listener(messages)`` on the listener thread with every batch of new messages (all channels,
        unfiltered). This is how web adapters wake their waiting clients: one call per batch, not per client.

        ``linger`` (seconds): the listener may wait that long after a batch before it looks again, so messages
        published meanwhile come as one batch: one wake-up of this process (a thread switch, the GIL) per
        ``linger`` instead of one per message. It applies only while every consumer in the process lingers
        (the smallest value wins); a subscription (:meth:`subscribe`) turns it off, as it expects each message
        at once. The first message after a quiet spell is never delayed."""
        if linger < 0:
            raise ValueError("linger must be >= 0")
        self.listener.ensure()
        self.subscriptions.tap(listener, linger)

    def untap(self, listener: BatchListener) -> None:
        self.subscriptions.untap(listener)

    def register_client_message_filter(self, prefix: str, fn: Callable[[Message], bool] | None = None) -> None:
        """Register ``fn(message) -> bool`` deciding whether HTTP clients get messages on channels starting
        with ``prefix``. Every applicable filter must pass (checked newest first). ``fn=None`` registers nothing,
        as in the gem."""
        if fn is None:
            return
        if not callable(fn):
            raise TypeError("filter must be callable")
        self.client_message_filters.append((prefix, fn))

    def allowed_by_filters(self, msg: Message) -> bool:
        for prefix, fn in reversed(self.client_message_filters):
            if msg.channel.startswith(prefix) and not fn(msg):
                return False
        return True

    @property
    def default(self) -> EngineLike:
        """The default engine (``publish`` uses it unless told otherwise)."""
        return self.engines.as_given()

    @default.setter
    def default(self, engine: EngineLike | None) -> None:
        self.engines.set_default(engine)
        self._publisher.rearm()

    def attach(self, engine: EngineLike) -> None:
        """Attach an engine: it is told about every existing and future subscription."""
        self.engines.attach(engine)

    def detach(self, engine: EngineLike) -> None:
        self.engines.detach(engine)

    def reset_engine(self, engine: EngineLike) -> None:
        """The iodine draft's ``reset(engine)``: tell ``engine`` again of every channel and pattern this process
        subscribes to, as if newly attached (e.g. after the engine reconnected and lost its subscriptions)."""
        self.engines.inform(as_engine(engine))

    def engine_hold(self, channel: str | None, kind: str | None, delta: int) -> None:
        """Count a subscription that reads the bus some other way (the transports' connections read it through
        :meth:`tap`) as :meth:`subscribe` counts its own: ``delta`` +1 when it starts, -1 when it ends. Engines
        hear ``subscribe``/``unsubscribe`` once per channel or pattern per process, whoever subscribes.
        ``kind``: None (a channel), ``"glob"`` or ``"prefix"``."""
        self.engines.hold(channel, kind, delta)

    @property
    def listening(self) -> bool:
        return self.listener.running

    def figures(self) -> BusFigures:
        """This process's figures (the host metrics write them to its slot): the listener's position and losses,
        and the relays of the engines that relay."""
        return BusFigures(self.listener.figures(), self.engines.relay_figures())

    def health(self) -> dict[str, Any]:
        """What an operator wants to know: is this process attached, listening, and receiving?"""
        listener = self.listener.figures()
        info: dict[str, Any] = {
            "bus": self.name,
            "pid": os.getpid(),
            "attached": self._attachment.current is not None,
            "listening": listener.listening,
            "seconds_since_last_message": listener.seconds_since_last_message,
            "lost_by_listener": listener.lost,
            "engine": repr(self.engines.default),
        }
        engine_health = self.engines.default.health()
        if engine_health is not None:
            info["engine_health"] = engine_health
        return info

    def __enter__(self) -> Bus:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Bus({self.name!r})"
