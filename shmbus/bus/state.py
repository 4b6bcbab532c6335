"""What every part of :class:`~shmbus.bus.Bus` shares: its state, the attached segment, and names as stored."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from ..channels import GLOBAL_PREFIX, SITE_SEPARATOR_BYTES, channel_key, check_site
from ..codecs import Codec
from ..errors import BusClosed, BusDestroyed
from ..message import Message
from ..segment import Record, Segment

if TYPE_CHECKING:
    from ..engines import Engine, SharedMemoryEngine
    from ..metrics import Metrics
    from .core import Bus
    from .results import Backlog, Subscription

__all__ = ["BatchListener", "BusState"]

log = logging.getLogger("shmbus")

BatchListener = Callable[[list[Message]], Any]


class BusState:
    """The instance state :class:`~shmbus.bus.Bus` and its parts (publishing, reading, subscriptions, listener)
    share, declared once so every part is type-checked against it. ``Bus.__init__`` sets it all."""

    name: str
    ring_size: int
    max_channels: int
    path: str | None
    codec: Codec
    max_backlog_size: int
    max_global_backlog_size: int
    max_backlog_age: float
    clear_every: int
    site_id_lookup: Callable[[], str | None] | None
    keepalive_interval: float
    create: bool
    mode: int
    lock_timeout: float
    client_message_filters: list[tuple[str, Callable[[Message], bool]]]
    _closed: bool
    _shm_engine: SharedMemoryEngine
    _default_engine: Engine
    _engines: list[Engine]
    _seg: Segment | None
    _lock: threading.RLock
    _dispatch_lock: threading.RLock
    _channel_cache: dict[str, bytes]
    _site_cache: dict[str, bytes]
    _name_cache: dict[bytes, str]
    _exact: dict[str, list[Subscription]]
    _patterns: list[Subscription]
    _catch_all: list[Subscription]
    _batch_listeners: list[BatchListener]
    _lingers: dict[BatchListener, float]
    _engine_refs: dict[tuple[str, bool], int]
    _listener: Any  # threading.Thread, or a native thread under gevent
    _watchdog: threading.Thread | None
    _stop: threading.Event
    _pid: int
    _epoch: int
    _cursor: int
    _last_gid: int
    _last_received: float
    _lost: int
    metrics: Metrics
    _off: bool
    _publish_off: bool
    _destroyed: bool
    # provided by the other parts of Bus, declared here so each part is checked against them
    publish: Callable[..., int | None]
    last_id: Callable[..., int]
    look_back: Callable[..., int]
    backlog: Callable[..., Backlog]
    global_backlog: Callable[..., list[Message]]
    _ensure_listener: Callable[[], None]
    _dispatch: Callable[..., None]
    _engine_ref: Callable[[str, bool, int], None]
    _sweep_owners: Callable[[], None]
    _owners_gone: bool
    _call: Callable[[Subscription, Message], None]

    @staticmethod
    def _engine_keys(channel: str | None, kind: str | None) -> list[tuple[str, bool]]:
        """What engines are told of a subscription (they know channels and globs only): a channel as itself; a
        glob as a pattern; a prefix ``/foo`` as the channel ``/foo`` and the pattern ``/foo/**``; every channel
        (``None``) as the pattern ``*``."""
        if channel is None:
            return [("*", True)]
        if kind is None:
            return [(channel, False)]
        if kind == "prefix":
            base = channel.rstrip("/")
            return [(base, False), (base + "/**", True)] if base else [("/**", True)]
        return [(channel, True)]

    # ------------------------------------------------------------------ attach
    @property
    def segment(self) -> Segment:
        """The attached segment (attaching on first use)."""
        seg = self._seg
        if seg is None:
            seg = self._attach()
        return seg

    def _attach(self) -> Segment:
        with self._lock:
            if self._destroyed:
                raise BusDestroyed(f"bus {self.name!r} was destroyed; call on() to use it again")
            if self._closed:
                raise BusClosed(f"bus {self.name!r} was closed in this process; call on() to attach again")
            if self._seg is None:
                seg = Segment.open(
                    self.name,
                    ring_size=self.ring_size,
                    max_channels=self.max_channels,
                    codec_name=self.codec.name,
                    path=self.path,
                    create=self.create,
                    mode=self.mode,
                    lock_timeout=self.lock_timeout,
                )
                if seg.codec_name and seg.codec_name != self.codec.name:
                    seg.close()
                    raise ValueError(
                        f"bus {self.name!r} was created with codec {seg.codec_name!r}, "
                        f"this process uses {self.codec.name!r}; every process must use the same"
                    )
                self._epoch = seg.epoch
                self._seg = seg
                self._pid = os.getpid()
                if seg.bridged:
                    self._adopt_bridge(seg)
            return self._seg

    def _adopt_bridge(self, seg: Segment) -> None:
        """The segment is bridged and this process was given no engine (a cron job, a Celery worker, ``shmbus
        publish``): build the workers' engine from ``SHMBUS_ENGINE_URL`` or the segment's record (when its URL
        needs no password), publishing only (the host's workers relay). Otherwise stay as is: a publish then
        raises :class:`~shmbus.errors.BusBridged` saying what to configure (the segment refuses local ids)."""
        from ..engines import engine_from_url

        if self._default_engine is not self._shm_engine:
            return
        rec = seg.bridge()
        url = os.environ.get("SHMBUS_ENGINE_URL") or (rec.url if rec is not None and not rec.secret else None)
        if not url:
            return
        try:
            engine = engine_from_url(url, kind=rec.kind if rec else None, options=rec.options if rec else None)
        except (ImportError, ValueError) as exc:
            log.warning(
                "shmbus: bus %r is bridged but its engine cannot be built (%s); publishes will fail", self.name, exc
            )
            return
        log.info("shmbus: bus %r is bridged: publishing through %r", self.name, engine)
        self._default_engine = engine
        engine.attached(self._as_bus())

    @property
    def epoch(self) -> int:
        """Random per-segment generation: a new value means the bus was reset (ids restarted)."""
        return self.segment.read_epoch()

    # ------------------------------------------------------------------ validation
    def _channel_key(self, channel: Any) -> bytes:
        """The channel's UTF-8 name, validated once and cached (see :mod:`shmbus.channels`)."""
        return _cached_name(self._channel_cache, channel, channel_key, 50_000)

    def _site_key(self, site_id: Any) -> bytes:
        """The site's UTF-8 name, validated once and cached."""
        return _cached_name(self._site_cache, site_id, check_site, 10_000)

    def _resolve_site(self, channel: str, site_id: str | None) -> str | None:
        self._channel_key(channel)  # a typed InvalidChannel for None, lists, NUL, ... (cached once valid)
        if channel.startswith(GLOBAL_PREFIX):
            return None
        if site_id is None and self.site_id_lookup is not None:
            site_id = self.site_id_lookup()
        return site_id or None

    def _key(self, channel: str, site_id: str | None) -> bytes:
        ch = self._channel_key(channel)
        return ch + SITE_SEPARATOR_BYTES + self._site_key(site_id) if site_id else ch

    def _as_bus(self) -> Bus:
        """``self`` as the :class:`~shmbus.bus.Bus` it is part of (engines are handed the bus)."""
        return cast("Bus", self)

    def _message(self, record: Record, epoch: int) -> Message:
        """A record as a :class:`Message`; channel names are decoded once per process (cached)."""
        name = self._name_cache.get(record.channel)
        if name is None:
            name = record.channel.decode()
            if len(self._name_cache) > 50_000:
                self._name_cache.clear()
            self._name_cache[record.channel] = name
        site = record.site.decode() if record.site else None
        return Message(
            record.global_id,
            record.message_id,
            name,
            record.payload,
            self.codec,
            site_id=site,
            meta=record.meta,
            timestamp=record.timestamp,
            epoch=epoch,
        )


def _cached_name(cache: dict[str, bytes], name: Any, check: Callable[[Any], bytes], most: int) -> bytes:
    """``check(name)``, remembered in ``cache`` (cleared past ``most`` names: ids of any shape cannot grow it)."""
    try:
        cached = cache.get(name)
    except TypeError:  # not even hashable: check() says why
        cached = None
    if cached is not None:
        return cached
    encoded = check(name)
    if len(cache) > most:
        cache.clear()
    cache[name] = encoded
    return encoded
