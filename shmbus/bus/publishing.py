"""Publishing: validate, encode and hand a message to an engine (or straight to the segment)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TypedDict

from ..channels import GLOBAL_PREFIX
from ..engines import EngineLike, Envelope, SharedMemoryEngine, as_engine
from ..errors import BusDestroyed, InvalidMessage
from ..message import Message, encode_meta
from .state import BusState
from .validation import check_count, check_seconds, check_targets

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["PublishOptions", "Publishing"]


class PublishOptions(TypedDict, total=False):
    """The keyword options of :meth:`Publishing.publish` and :meth:`Publishing.publish_encoded`."""

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
    engine: EngineLike | bool | None


_OPTION_NAMES = frozenset(PublishOptions.__annotations__)


class Publishing(BusState):
    """``publish`` and ``publish_encoded`` for applications; ``store`` for engines."""

    def publish(self, channel: str, data: Any, **options: Unpack[PublishOptions]) -> int | None:
        """Publish ``data`` on ``channel``; return the channel's new message id.

        Options (:class:`PublishOptions`): ``client_ids``, ``user_ids``, ``group_ids`` (targeting), ``site_id``,
        ``max_backlog_size``, ``max_backlog_age`` (this channel's limits), ``engine``. Returns None when
        publishing is switched off (``off()``), and True when no id is assigned: ``engine=False`` (delivered to
        this process's subscribers and transport connections only, nothing stored) or a
        :class:`~shmbus.engines.PubSubEngine` (the draft's "true: scheduled"). Raises ``TypeError`` (naming
        the channel) when the codec cannot encode ``data`` or an option is unknown, and
        :class:`InvalidMessage` / :class:`InvalidChannel` for bad input; nothing is written in either case.
        Unlike the gem, ``max_backlog_size`` is honoured together with ``max_backlog_age``.
        """
        if self._publish_off:
            return None
        try:
            payload = self.codec.encode(data)
        except (TypeError, ValueError, OverflowError) as exc:
            raise TypeError(
                f"cannot encode data published on {channel!r} with the {self.codec.name} codec: {exc}"
            ) from None
        return self._publish_payload(channel, payload, options)

    def publish_encoded(self, channel: str, payload: bytes, **options: Unpack[PublishOptions]) -> int | None:
        """:meth:`publish` for data already in the bus's codec (``payload`` is stored as is: a pipeline that
        holds encoded rows skips a decode and an encode). The caller vouches that ``payload`` decodes."""
        if self._publish_off:
            return None
        return self._publish_payload(channel, payload, options)

    def _publish_payload(self, channel: str, payload: bytes, options: PublishOptions) -> int | None:
        if self._destroyed:
            raise BusDestroyed(f"bus {self.name!r} was destroyed; call on() to use it again")
        if self._seg is None:
            self._attach()  # first: attaching a bridged segment may set the default engine (see _adopt_bridge)
        try:
            channel_key = self._channel_cache[channel]
        except (KeyError, TypeError):  # not seen yet, or not even hashable: validate (typed errors)
            channel_key = self._channel_key(channel)
        if not isinstance(payload, bytes):
            raise InvalidMessage(f"payload must be bytes, got {type(payload).__name__}")
        if not options:  # the common case: nothing to look at
            segment = self._seg
            if segment is not None and self._default_engine is self._shm_engine and self.site_id_lookup is None:
                return segment.append(
                    channel_key, b"", payload, b"", self.max_backlog_size, self.max_backlog_age, self.clear_every
                )[1]
        elif not _OPTION_NAMES.issuperset(options):
            unknown = sorted(set(options) - _OPTION_NAMES)
            raise TypeError(f"unknown publish option(s) {unknown}; known: {sorted(_OPTION_NAMES)}")
        client_ids = options.get("client_ids")
        user_ids = options.get("user_ids")
        group_ids = options.get("group_ids")
        if client_ids is None and user_ids is None and group_ids is None:
            meta = b""
        else:
            if (user_ids is not None or group_ids is not None) and channel.startswith(GLOBAL_PREFIX):
                raise InvalidMessage(f"user_ids/group_ids cannot be used on /global/ channels ({channel!r})")
            meta = encode_meta(
                check_targets("client_ids", client_ids),
                check_targets("user_ids", user_ids),
                check_targets("group_ids", group_ids),
            )
        site_id = options.get("site_id")
        if site_id is not None or self.site_id_lookup is not None:
            site_id = self._resolve_site(channel, site_id)
        site = self._site_key(site_id) if site_id else b""
        max_backlog_size = options.get("max_backlog_size")
        size = (
            self.max_backlog_size
            if max_backlog_size is None
            else check_count("max_backlog_size", max_backlog_size, error=InvalidMessage)
        )
        max_backlog_age = options.get("max_backlog_age")
        age = (
            self.max_backlog_age
            if max_backlog_age is None
            else check_seconds("max_backlog_age", max_backlog_age, error=InvalidMessage)
        )
        engine = options.get("engine")
        if engine is None:
            engine = self._default_engine
        if engine is self._shm_engine:  # the fast path: straight into the segment
            segment = self._seg or self.segment
            return segment.append(channel_key, site, payload, meta, size, age, self.clear_every)[1]
        if engine is False:
            self._dispatch_local(channel, site_id, payload, meta)
            self._count_published()
            return True  # the draft's "true: scheduled"; no id is assigned when nothing is stored
        if engine is True:
            raise TypeError("engine must be an Engine, None (the default) or False (this process only)")
        engine = as_engine(engine)
        result = engine.publish(self._as_bus(), Envelope(channel, site_id, payload, meta, size, age))
        if not isinstance(engine, SharedMemoryEngine):  # that one appends here, and the append counts itself
            self._count_published()
        return result

    def _count_published(self) -> None:
        """Count a publish an engine handled in this process's metrics (a segment append counts its own)."""
        seg = self._seg
        if seg is not None:
            seg.count_published()

    def store(
        self,
        envelope: Envelope,
        *,
        global_id: int | None = None,
        message_id: int | None = None,
        timestamp: float | None = None,
        expect_global_id: int | None = None,
    ) -> int:
        """Store ``envelope`` in this host's segment; return its message id (0 when skipped).

        The engine contract's way in: :class:`~shmbus.engines.SharedMemoryEngine` calls it to publish, and an
        engine whose backend assigns ids (the Redis bridge) passes them as ``global_id``/``message_id`` so every
        host agrees. ``expect_global_id`` stores only if the segment's global id is exactly that (a relay
        keeping the segment contiguous). Every field is validated: :class:`InvalidMessage` on bad input.
        """
        channel_key = self._channel_key(envelope.channel)
        site = self._site_key(envelope.site_id) if envelope.site_id else b""
        check_count("max_backlog_size", envelope.max_backlog_size, error=InvalidMessage)
        check_seconds("max_backlog_age", envelope.max_backlog_age, error=InvalidMessage)
        for name, value in (
            ("global_id", global_id),
            ("message_id", message_id),
            ("expect_global_id", expect_global_id),
        ):
            if value is not None:
                check_count(name, value, 0 if name == "expect_global_id" else 1, error=InvalidMessage)
        if not isinstance(envelope.payload, bytes) or not isinstance(envelope.meta, bytes):
            raise InvalidMessage("an envelope's payload and meta must be bytes")
        return self.segment.append(
            channel_key,
            site,
            envelope.payload,
            envelope.meta,
            max_backlog_size=envelope.max_backlog_size,
            max_backlog_age=envelope.max_backlog_age,
            clear_every=self.clear_every,
            global_id=global_id,
            message_id=message_id,
            timestamp=timestamp,
            expect_global_id=expect_global_id,
        )[1]

    def _dispatch_local(self, channel: str, site_id: str | None, payload: bytes, meta: bytes) -> None:
        msg = Message(
            0, 0, channel, payload, self.codec, site_id=site_id, meta=meta, timestamp=time.time(), epoch=self._epoch
        )
        with self._dispatch_lock:
            self._dispatch([msg], local=True)
