"""Publishing: validate, encode and hand a message to an engine (or straight to the segment)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from ..channels import GLOBAL_PREFIX
from ..engines import SharedMemoryEngine, as_engine
from ..envelope import Envelope
from ..errors import InvalidMessage
from ..host import BusHost, PublishOptions, StoredIds
from ..message import Message, encode_meta
from ..segment import Segment
from .attachment import Attachment
from .engine_table import EngineTable
from .limits import RetentionLimits
from .names import Names
from .validation import check_count, check_seconds, check_targets

__all__ = ["PublishOptions", "Publisher"]

log = logging.getLogger("shmbus")


_OPTION_NAMES = frozenset(PublishOptions.__annotations__)

#: ``deliver_here(messages)``: this process's subscribers, for ``engine=False`` (the subscription table's).
DeliverHere = Callable[[list[Message]], None]


class Publisher:
    """Every way a message gets into the bus: ``publish`` for applications, ``store`` for engines.

    The common publish (no options, the shared-memory engine, no site lookup) is one dict lookup and one append:
    :attr:`direct` holds the segment while that path applies, and :meth:`rearm` recomputes it whenever what it
    depends on changes (attach, close, the default engine, the site lookup).
    """

    def __init__(
        self,
        host: BusHost,
        attachment: Attachment,
        names: Names,
        limits: RetentionLimits,
        engines: EngineTable,
        deliver_here: DeliverHere,
    ) -> None:
        self.off = False  #: ``Bus.off()``: publish returns None
        #: the segment while a plain publish may append to it straight (see the class doc)
        self.direct: Segment | None = None
        self._host, self._attachment, self._engines = host, attachment, engines
        self._names, self._channel_keys, self._limits = names, names.channel_keys, limits
        self._deliver_here = deliver_here

    def rearm(self) -> None:
        seg = self._attachment.current
        plain = self._engines.default is self._engines.shared_memory and self._names.site_id_lookup is None
        self.direct = seg if plain else None

    def publish(self, channel: str, data: Any, options: PublishOptions) -> int | None:
        """See :meth:`Bus.publish <shmbus.bus.Bus.publish>`."""
        if self.off:
            return None
        try:
            payload = self._names.codec.encode(data)
        except (TypeError, ValueError, OverflowError) as exc:
            raise TypeError(
                f"cannot encode data published on {channel!r} with the {self._names.codec.name} codec: {exc}"
            ) from None
        seg = self.direct
        if seg is not None and not options and type(payload) is bytes:  # the common case: nothing to look at
            try:
                key = self._channel_keys[channel]
            except (KeyError, TypeError):  # not seen yet, or not even hashable: validate (typed errors)
                key = self._names.channel_key(channel)
            limits = self._limits
            return seg.append(
                key, b"", payload, b"", limits.max_backlog_size, limits.max_backlog_age, limits.clear_every
            )[1]
        return self.publish_payload(channel, payload, options)

    def publish_payload(self, channel: str, payload: bytes, options: PublishOptions) -> int | None:
        """:meth:`publish` of a payload already encoded (``Bus.publish_encoded``), and its general path."""
        if self.off:
            return None
        attachment = self._attachment
        attachment.check_usable()
        if attachment.current is None:
            attachment.attach()  # first: attaching a bridged segment may set the default engine
        try:
            channel_key = self._channel_keys[channel]
        except (KeyError, TypeError):
            channel_key = self._names.channel_key(channel)
        if not isinstance(payload, bytes):
            raise InvalidMessage(f"payload must be bytes, got {type(payload).__name__}")
        if options and not _OPTION_NAMES.issuperset(options):
            unknown = sorted(set(options) - _OPTION_NAMES)
            raise TypeError(f"unknown publish option(s) {unknown}; known: {sorted(_OPTION_NAMES)}")
        meta = _targeting(channel, options)
        names, limits = self._names, self._limits
        site_id = options.get("site_id")
        if site_id is not None or names.site_id_lookup is not None:
            site_id = names.resolve_site(channel, site_id)
        site = names.site_key(site_id) if site_id else b""
        max_backlog_size = options.get("max_backlog_size")
        size = (
            limits.max_backlog_size
            if max_backlog_size is None
            else check_count("max_backlog_size", max_backlog_size, error=InvalidMessage)
        )
        max_backlog_age = options.get("max_backlog_age")
        age = (
            limits.max_backlog_age
            if max_backlog_age is None
            else check_seconds("max_backlog_age", max_backlog_age, error=InvalidMessage)
        )
        engine = options.get("engine")
        if engine is None:
            engine = self._engines.default
        if engine is self._engines.shared_memory:  # straight into the segment
            return attachment.segment.append(channel_key, site, payload, meta, size, age, limits.clear_every)[1]
        if engine is False:
            seg = attachment.segment
            epoch = seg.read_epoch()
            here = Message(
                0, 0, channel, payload, names.codec, site_id=site_id, meta=meta, timestamp=time.time(), epoch=epoch
            )
            self._deliver_here([here])
            seg.count_published()
            return True  # the draft's "true: scheduled"; no id is assigned when nothing is stored
        if engine is True:
            raise TypeError("engine must be an Engine, None (the default) or False (this process only)")
        engine = as_engine(engine)
        result = engine.publish(self._host, Envelope(channel, site_id, payload, meta, size, age))
        if not isinstance(engine, SharedMemoryEngine):  # that one appends here, and the append counts itself
            attached = attachment.current
            if attached is not None:
                try:  # the engine stored it: a counter that fails (the lock held by a stopped process) must not
                    attached.count_published()  # make the caller believe it failed and publish it again
                except Exception:
                    log.warning(
                        "shmbus: message %r published on %r, but counting it failed", result, channel, exc_info=True
                    )
        return result

    def store(self, envelope: Envelope, ids: StoredIds) -> int:
        """See :meth:`BusHost.store <shmbus.host.BusHost.store>`."""
        global_id = ids.get("global_id")
        message_id = ids.get("message_id")
        expect_global_id = ids.get("expect_global_id")
        names = self._names
        channel_key = names.channel_key(envelope.channel)
        site = names.site_key(envelope.site_id) if envelope.site_id else b""
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
        return self._attachment.segment.append(
            channel_key,
            site,
            envelope.payload,
            envelope.meta,
            max_backlog_size=envelope.max_backlog_size,
            max_backlog_age=envelope.max_backlog_age,
            clear_every=self._limits.clear_every,
            global_id=global_id,
            message_id=message_id,
            timestamp=ids.get("timestamp"),
            expect_global_id=expect_global_id,
        )[1]


def _targeting(channel: str, options: PublishOptions) -> bytes:
    """The packed ``client_ids``/``user_ids``/``group_ids`` (empty: everyone)."""
    client_ids = options.get("client_ids")
    user_ids = options.get("user_ids")
    group_ids = options.get("group_ids")
    if client_ids is None and user_ids is None and group_ids is None:
        return b""
    if (user_ids is not None or group_ids is not None) and channel.startswith(GLOBAL_PREFIX):
        raise InvalidMessage(f"user_ids/group_ids cannot be used on /global/ channels ({channel!r})")
    return encode_meta(
        check_targets("client_ids", client_ids),
        check_targets("user_ids", user_ids),
        check_targets("group_ids", group_ids),
    )
