"""``Bus``: message_bus's API over a shared-memory segment that every process on the host attaches to by name."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from . import segment as _segment
from .codecs import Codec, get_codec
from .engines import Engine, Envelope, SharedMemoryEngine
from .errors import (
    BusClosed,
    BusDestroyed,
    BusLockTimeout,
    InvalidArgument,
    InvalidChannel,
    InvalidMessage,
    InvalidMessageTarget,
    SegmentCorrupt,
)
from .message import Message, encode_meta
from .patterns import compile_pattern
from .segment import Record, Segment

__all__ = ["MAX_CHANNEL_BYTES", "MAX_SITE_BYTES", "Backlog", "Bus", "Subscription"]

log = logging.getLogger("shmbus")

#: Longest channel name accepted, in UTF-8 bytes (the channel index stores names inline).
MAX_CHANNEL_BYTES = 160
#: Longest site id accepted, in UTF-8 bytes.
MAX_SITE_BYTES = 29
KEEPALIVE_CHANNEL = "/__mb_keepalive__/"
MIN_KEEPALIVE = 20

Callback = Callable[[Message], Any]
BatchListener = Callable[[list[Message]], Any]

_live_buses: weakref.WeakSet[Bus] = weakref.WeakSet()


class Backlog(list[Message]):
    """A list of messages that also says what could not be returned.

    ``first_available`` is the oldest message id still readable; when it is above ``after_id + 1`` (``gap`` is
    True) the messages in between were trimmed or overwritten: the loss is reported, never silent.
    """

    __slots__ = ("after_id", "first_available", "last_id")

    def __init__(self, messages: Iterable[Message], *, after_id: int, last_id: int, first_available: int):
        super().__init__(messages)
        self.after_id = after_id
        self.last_id = last_id
        self.first_available = first_available

    @property
    def gap(self) -> bool:
        return self.first_available > self.after_id + 1


class Subscription:
    """A registered callback; pass it (or the callback) to ``unsubscribe``."""

    __slots__ = ("callback", "channel", "kind", "matcher", "site_id", "skip_gid")

    def __init__(self, channel: str | None, callback: Callback, kind: str | None, site_id: str | None):
        self.channel = channel
        self.callback = callback
        self.kind = kind  # None (exact / all channels), "glob" or "prefix"
        self.matcher = compile_pattern(channel, kind) if kind and channel is not None else None
        self.site_id = site_id  # set for local_subscribe: only this site's messages
        self.skip_gid = 0  # messages up to this global id were already delivered by the replay

    def __repr__(self) -> str:
        return f"Subscription({self.channel!r}, kind={self.kind!r}, site_id={self.site_id!r})"


#: Integer ids (targets, message ids) travel as signed 64-bit integers (msgpack in the segment, the gem's JSON).
MIN_WIRE_INT = -(1 << 63)
MAX_WIRE_INT = (1 << 63) - 1


def _check_targets(name: str, ids: Any) -> list[Any] | None:
    if ids is None:
        return None
    if isinstance(ids, (str, bytes)) or not isinstance(ids, (list, tuple, set, frozenset)):
        raise InvalidMessageTarget(f"{name} must be a list of ids, got {type(ids).__name__}")
    out = list(ids)
    if not out:
        raise InvalidMessageTarget(f"{name}=[] would target nobody; pass None to target everyone")
    for v in out:
        if isinstance(v, bool) or not isinstance(v, (int, str)):
            raise InvalidMessageTarget(f"{name} entries must be int or str, got {v!r}")
        if isinstance(v, int) and not MIN_WIRE_INT <= v <= MAX_WIRE_INT:
            raise InvalidMessageTarget(f"{name} entry {v} does not fit the wire's signed 64-bit integers")
    return out


def check_count(name: str, value: Any, minimum: int = 1, error: type[InvalidArgument] = InvalidArgument) -> int:
    """An ``int`` (not a bool) in ``[minimum, 2**63)``: backlog sizes, ``clear_every``, ids."""
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_WIRE_INT:
        raise error(f"{name} must be an int from {minimum} to 2**63-1, got {value!r}")
    return value


def check_seconds(name: str, value: Any, error: type[InvalidArgument] = InvalidArgument) -> float:
    """A finite number of seconds above 0: backlog ages."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise error(f"{name} must be a finite number of seconds above 0, got {value!r}")
    return float(value)


class Bus:
    """A message bus shared by every process on the host that opens the same ``name``.

    Nothing is attached until first use, so a ``Bus`` can be built at import time in a pre-forking master.
    Options mirror message_bus (times in seconds):

    ``ring_size`` (bytes of history, default 32 MiB) and ``max_channels`` (8192) size the segment when this
    process creates it; ``path`` maps a regular file instead of ``/dev/shm`` (a persistent log); ``codec``
    (``"json"``, ``"msgpack"`` or a :class:`~shmbus.codecs.Codec`); ``max_backlog_size`` (1000 per channel),
    ``max_global_backlog_size`` (2000), ``max_backlog_age`` (7 days without a publish expires a channel and
    restarts its ids), ``clear_every`` (1); ``site_id_lookup`` (zero-argument callable giving the current site);
    ``keepalive_interval`` (60; 0 or anything <= 20 disables it); ``engine`` (the default engine); ``create``
    (False: attach only, ``FileNotFoundError`` if the bus does not exist yet); ``mode`` (permission bits of a new
    segment and the most an existing one may grant: ``0o600``, or ``0o660`` to share the bus with a group);
    ``lock_timeout`` (seconds a publish or attach waits for the writer lock before
    :class:`~shmbus.errors.BusLockTimeout`, 5). Bad values raise :class:`~shmbus.errors.InvalidArgument` here,
    not at first use.
    """

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
        engine: Engine | None = None,
        create: bool = True,
        mode: int = 0o600,
        lock_timeout: float = 5.0,
    ) -> None:
        if not isinstance(name, str) or not name or "/" in name or "\x00" in name or len(name) > 200:
            raise InvalidArgument(f"bus name must be a non-empty string without '/' or NUL, got {name!r}")
        check_count("max_backlog_size", max_backlog_size)
        check_count("max_global_backlog_size", max_global_backlog_size)
        max_backlog_age = check_seconds("max_backlog_age", max_backlog_age)
        check_count("clear_every", clear_every)
        if check_count("ring_size", ring_size, _segment.MIN_RING) % 4096:
            raise InvalidArgument(f"ring_size must be a multiple of 4096 bytes, got {ring_size}")
        check_count("max_channels", max_channels, 16)
        lock_timeout = check_seconds("lock_timeout", lock_timeout)
        if isinstance(mode, bool) or not isinstance(mode, int) or mode & ~0o666 or (mode & 0o600) != 0o600:
            raise InvalidArgument(f"mode must be permission bits within 0o666 including 0o600, got {mode!r}")
        self.name = name
        self.ring_size = ring_size
        self.max_channels = max_channels
        self.path = path
        self.codec: Codec = get_codec(codec)
        self.max_backlog_size = max_backlog_size
        self.max_global_backlog_size = max_global_backlog_size
        self.max_backlog_age = max_backlog_age
        self.clear_every = clear_every
        self.site_id_lookup = site_id_lookup
        self.keepalive_interval = keepalive_interval
        self.create = create
        self.mode = mode
        self.lock_timeout = lock_timeout
        self._closed = False
        self.client_message_filters: list[tuple[str, Callable[[Message], bool]]] = []
        self._shm_engine = SharedMemoryEngine()
        self._default_engine: Engine = engine or self._shm_engine
        self._engines: list[Engine] = []
        self._seg: Segment | None = None
        self._lock = threading.RLock()  # attach/detach, subscription table
        self._dispatch_lock = threading.RLock()  # held while the listener (or a replay) runs callbacks
        self._channel_cache: dict[str, bytes] = {}
        self._site_cache: dict[str, bytes] = {}
        self._name_cache: dict[bytes, str] = {}
        self._exact: dict[str, list[Subscription]] = {}
        self._patterns: list[Subscription] = []
        self._catch_all: list[Subscription] = []
        self._batch_listeners: list[BatchListener] = []
        self._engine_refs: dict[tuple[str, bool], int] = {}
        self._listener: threading.Thread | None = None
        self._watchdog: threading.Thread | None = None
        self._stop = threading.Event()
        self._pid = os.getpid()
        self._epoch = 0
        self._cursor = 0
        self._last_gid = 0
        self._last_received = time.monotonic()
        self._lost = 0
        self._off = False
        self._publish_off = False
        self._destroyed = False
        self._default_engine.attached(self)
        _live_buses.add(self)

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
                seg = Segment.open(self.name, ring_size=self.ring_size, max_channels=self.max_channels,
                                   codec_name=self.codec.name, path=self.path, create=self.create,
                                   mode=self.mode, lock_timeout=self.lock_timeout)
                if seg.codec_name and seg.codec_name != self.codec.name:
                    seg.close()
                    raise ValueError(f"bus {self.name!r} was created with codec {seg.codec_name!r}, "
                                     f"this process uses {self.codec.name!r}; every process must use the same")
                self._epoch = seg.epoch
                self._seg = seg
                self._pid = os.getpid()
            return self._seg

    @property
    def epoch(self) -> int:
        """Random per-segment generation: a new value means the bus was reset (ids restarted)."""
        return self.segment.read_epoch()

    # ------------------------------------------------------------------ validation
    def _channel_key(self, channel: Any) -> bytes:
        """The channel's UTF-8 name, validated once and cached (the one channel validator)."""
        if not isinstance(channel, str):
            raise InvalidChannel(f"channel must be a str, got {type(channel).__name__}: {channel!r}")
        b = self._channel_cache.get(channel)
        if b is not None:
            return b
        if not channel:
            raise InvalidChannel("channel must not be empty")
        if "\x00" in channel:
            raise InvalidChannel(f"channel must not contain NUL: {channel!r}")
        if "$|$" in channel:
            raise InvalidChannel(f"channel must not contain the site separator '$|$': {channel!r}")
        try:
            b = channel.encode()
        except UnicodeEncodeError as exc:
            raise InvalidChannel(f"channel is not valid unicode: {exc}") from None
        if len(b) > MAX_CHANNEL_BYTES:
            raise InvalidChannel(f"channel is {len(b)} bytes in UTF-8; the limit is {MAX_CHANNEL_BYTES}")
        if len(self._channel_cache) > 50_000:
            self._channel_cache.clear()
        self._channel_cache[channel] = b
        return b

    def _site_key(self, site_id: Any) -> bytes:
        if not isinstance(site_id, str):
            raise InvalidChannel(f"site_id must be a str, got {type(site_id).__name__}: {site_id!r}")
        b = self._site_cache.get(site_id)
        if b is not None:
            return b
        if "\x00" in site_id or "$|$" in site_id:
            raise InvalidChannel(f"site_id must be a str without NUL or '$|$', got {site_id!r}")
        b = site_id.encode()
        if len(b) > MAX_SITE_BYTES:
            raise InvalidChannel(f"site_id is {len(b)} bytes in UTF-8; the limit is {MAX_SITE_BYTES}")
        if len(self._site_cache) > 10_000:
            self._site_cache.clear()
        self._site_cache[site_id] = b
        return b

    def _resolve_site(self, channel: str, site_id: str | None) -> str | None:
        self._channel_key(channel)  # a typed InvalidChannel for None, lists, NUL, ... (cached once valid)
        if channel.startswith("/global/"):
            return None
        if site_id is None and self.site_id_lookup is not None:
            site_id = self.site_id_lookup()
        return site_id or None

    def _key(self, channel: str, site_id: str | None) -> bytes:
        ch = self._channel_key(channel)
        return ch + b"$|$" + self._site_key(site_id) if site_id else ch

    # ------------------------------------------------------------------ publish
    def publish(
        self,
        channel: str,
        data: Any,
        *,
        client_ids: Iterable[str] | None = None,
        user_ids: Iterable[int | str] | None = None,
        group_ids: Iterable[int | str] | None = None,
        site_id: str | None = None,
        max_backlog_size: int | None = None,
        max_backlog_age: float | None = None,
        engine: Engine | bool | None = None,
    ) -> int | None:
        """Publish ``data`` on ``channel``; return the channel's new message id.

        Returns None when publishing is switched off (``off()``), and 0 for ``engine=False`` (delivered to this
        process's subscribers only, nothing stored). Raises ``TypeError`` (naming the channel) when the codec
        cannot encode ``data``, and :class:`InvalidMessage` / :class:`InvalidChannel` for bad input; nothing is
        written in either case. Unlike the gem, ``max_backlog_size`` is honoured together with ``max_backlog_age``.
        """
        if self._publish_off:
            return None
        if self._destroyed:
            raise BusDestroyed(f"bus {self.name!r} was destroyed; call on() to use it again")
        try:
            ch = self._channel_cache[channel]
        except (KeyError, TypeError):  # not seen yet, or not even hashable: validate (typed errors)
            ch = self._channel_key(channel)
        if client_ids is None and user_ids is None and group_ids is None:
            meta = b""
        else:
            if (user_ids is not None or group_ids is not None) and channel.startswith("/global/"):
                raise InvalidMessage(f"user_ids/group_ids cannot be used on /global/ channels ({channel!r})")
            meta = encode_meta(_check_targets("client_ids", client_ids), _check_targets("user_ids", user_ids),
                               _check_targets("group_ids", group_ids))
        if site_id is not None or self.site_id_lookup is not None:
            site_id = self._resolve_site(channel, site_id)
        site = self._site_key(site_id) if site_id else b""
        try:
            payload = self.codec.encode(data)
        except (TypeError, ValueError, OverflowError) as exc:
            raise TypeError(f"cannot encode data published on {channel!r} with the {self.codec.name} codec: "
                            f"{exc}") from None
        size = self.max_backlog_size if max_backlog_size is None else check_count(
            "max_backlog_size", max_backlog_size, error=InvalidMessage)
        age = self.max_backlog_age if max_backlog_age is None else check_seconds(
            "max_backlog_age", max_backlog_age, error=InvalidMessage)
        if engine is None:
            engine = self._default_engine
        if engine is self._shm_engine:  # the fast path: straight into the segment
            seg = self._seg or self.segment
            return seg.append(ch, site, payload, meta, size, age, self.clear_every)[1]
        if engine is False:
            self._dispatch_local(channel, site_id, payload, meta)
            return 0
        if engine is True:
            raise TypeError("engine must be an Engine, None (the default) or False (this process only)")
        return engine.publish(self, Envelope(channel, site_id, payload, meta, size, age))

    def _append(self, env: Envelope, *, global_id: int | None = None, message_id: int | None = None,
                timestamp: float | None = None, expect_global_id: int | None = None) -> int:
        """Store an envelope in the segment (engines call this; ``global_id``/``message_id`` impose ids,
        ``expect_global_id`` appends only if the segment's global id is exactly that; 0 when skipped)."""
        ch = self._channel_key(env.channel)
        site = self._site_key(env.site_id) if env.site_id else b""
        check_count("max_backlog_size", env.max_backlog_size, error=InvalidMessage)
        check_seconds("max_backlog_age", env.max_backlog_age, error=InvalidMessage)
        for name, value in (("global_id", global_id), ("message_id", message_id),
                            ("expect_global_id", expect_global_id)):
            if value is not None:
                check_count(name, value, 0 if name == "expect_global_id" else 1, error=InvalidMessage)
        if not isinstance(env.payload, bytes) or not isinstance(env.meta, bytes):
            raise InvalidMessage("an envelope's payload and meta must be bytes")
        return self.segment.append(ch, site, env.payload, env.meta, max_backlog_size=env.max_backlog_size,
                                   max_backlog_age=env.max_backlog_age, clear_every=self.clear_every,
                                   global_id=global_id, message_id=message_id, timestamp=timestamp,
                                   expect_global_id=expect_global_id)[1]

    def _dispatch_local(self, channel: str, site_id: str | None, payload: bytes, meta: bytes) -> None:
        msg = Message(0, 0, channel, payload, self.codec, site_id=site_id, meta=meta, timestamp=time.time(),
                      epoch=self._epoch)
        with self._dispatch_lock:
            self._dispatch([msg], local=True)

    # ------------------------------------------------------------------ reading
    def _message(self, rec: Record, epoch: int) -> Message:
        name = self._name_cache.get(rec.channel)
        if name is None:
            name = rec.channel.decode()
            if len(self._name_cache) > 50_000:
                self._name_cache.clear()
            self._name_cache[rec.channel] = name
        site = rec.site.decode() if rec.site else None
        return Message(rec.global_id, rec.message_id, name, rec.payload, self.codec, site_id=site, meta=rec.meta,
                       timestamp=rec.timestamp, epoch=epoch)

    def last_id(self, channel: str, site_id: str | None = None) -> int:
        """Id of the newest message on ``channel`` (0 when empty, unknown or expired)."""
        return self.segment.last_id(self._key(channel, self._resolve_site(channel, site_id)))

    def last_ids(self, *channels: str, site_id: str | None = None) -> dict[str, int]:
        """``{channel: last_id}`` for several channels in one call."""
        seg = self.segment
        return {ch: seg.last_id(self._key(ch, self._resolve_site(ch, site_id))) for ch in channels}

    def backlog(self, channel: str | None = None, last_id: int | None = 0, site_id: str | None = None, *,
                upto: int | None = None, limit: int | None = None) -> Backlog:
        """Retained messages on ``channel`` with id above ``last_id`` (and at most ``upto``), oldest first.

        ``channel=None`` reads the global backlog. ``limit`` caps the count from the oldest end (guble's replay
        with start id and count). The result is a :class:`Backlog`: a list that also reports any gap.
        """
        for name, value in (("last_id", last_id), ("upto", upto), ("limit", limit)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise InvalidArgument(f"backlog {name} must be an int or None, got {value!r}")
        if limit is not None and limit < 0:
            raise InvalidArgument(f"backlog limit must be >= 0, got {limit}")
        if channel is None:
            msgs = self.global_backlog(last_id)
            return Backlog(msgs, after_id=last_id or 0, last_id=self.segment.global_id(),
                           first_available=msgs[0].global_id if msgs else (last_id or 0) + 1)
        after = last_id or 0
        if after < 0:
            raise InvalidArgument("last_id must be >= 0 (use subscribe(..., last_id=-n) to look back)")
        seg = self.segment
        epoch = seg.read_epoch()
        site = self._resolve_site(channel, site_id)
        recs, last, first = seg.channel_backlog(self._key(channel, site), after, upto=upto, limit=limit)
        bl = Backlog([self._message(r, epoch) for r in recs], after_id=after, last_id=last, first_available=first)
        if bl.gap:  # an engine that keeps older messages elsewhere (the Redis bridge) may fill the gap
            fill = getattr(self._default_engine, "backlog", None)
            if fill is not None:
                try:
                    better = fill(self, channel, site, after, upto, limit, bl)
                except Exception:
                    log.exception("shmbus: engine %r could not fill a backlog gap on %r", self._default_engine,
                                  channel)
                    better = None
                if better is not None:
                    return better
        return bl

    def last_message(self, channel: str, site_id: str | None = None) -> Message | None:
        last = self.last_id(channel, site_id)
        if not last:
            return None
        msgs = self.backlog(channel, last - 1, site_id)
        return msgs[-1] if msgs else None

    def global_backlog(self, last_id: int | None = None) -> list[Message]:
        """Messages of every channel and site with global id above ``last_id`` (at most
        ``max_global_backlog_size``, the newest), oldest first; per-channel trimming and expiry apply."""
        if last_id is not None and (isinstance(last_id, bool) or not isinstance(last_id, int)):
            raise InvalidArgument(f"global_backlog last_id must be an int or None, got {last_id!r}")
        seg = self.segment
        epoch = seg.read_epoch()
        floor = max(last_id or 0, seg.global_id() - self.max_global_backlog_size)
        out = []
        states: dict[bytes, tuple[int, int, int, int]] = {}
        for rec in seg.global_backlog(floor):
            key = rec.channel + b"$|$" + rec.site if rec.site else rec.channel
            st = states.get(key)
            if st is None:
                st = states[key] = seg.channel_state(key)
            last, _newest, trim_below, since_gid = st
            if rec.message_id <= trim_below or rec.global_id < since_gid or rec.message_id > last:
                continue
            out.append(self._message(rec, epoch))
        return out

    # ------------------------------------------------------------------ subscribe
    def subscribe(
        self,
        channel: str | None,
        callback: Callback,
        last_id: int | None = None,
        *,
        pattern: bool | str = False,
        site_id: str | None = None,
    ) -> Subscription | None:
        """Call ``callback(message)`` for every message on ``channel`` (all sites), on this process's listener.

        ``channel=None`` receives every channel. ``last_id``: None (or -1) = only new messages; 0 = the whole
        retained backlog first; n = messages after n; -k (k >= 2) = the last k-1 messages first. The replay runs
        in the calling thread before this returns, and live messages follow with no gap and no duplicate.
        ``pattern=True``/``"glob"`` or ``"prefix"`` subscribes to a pattern (see :mod:`shmbus.patterns`).
        Returns the :class:`Subscription`, or None when the bus is ``off()``.
        """
        return self._subscribe(channel, callback, last_id, pattern, None, site_id)

    def local_subscribe(self, channel: str | None, callback: Callback, last_id: int | None = None, *,
                        pattern: bool | str = False) -> Subscription | None:
        """Like :meth:`subscribe`, but only for messages of the current site (``site_id_lookup()``)."""
        site = self.site_id_lookup() if self.site_id_lookup else None
        return self._subscribe(channel, callback, last_id, pattern, site or None, site or None)

    def _subscribe(self, channel: str | None, callback: Callback, last_id: int | None, pattern: bool | str,
                   only_site: str | None, replay_site: str | None) -> Subscription | None:
        if self._destroyed:
            raise BusDestroyed(f"bus {self.name!r} was destroyed; call on() to use it again")
        if self._off:
            return None
        if not callable(callback):
            raise TypeError("callback must be callable")
        kind = None
        if pattern:
            kind = "glob" if pattern is True else str(pattern)
            if channel is None:
                raise InvalidChannel("a pattern subscription needs a pattern string")
        if channel is not None:
            if not isinstance(channel, str) or not channel or "\x00" in channel:
                raise InvalidChannel(f"channel must be a non-empty str without NUL, got {channel!r}")
            if kind is None:
                self._channel_key(channel)
        if last_id is not None and (isinstance(last_id, bool) or not isinstance(last_id, int)):
            raise TypeError(f"last_id must be an int or None, got {last_id!r}")
        sub = Subscription(channel, callback, kind, only_site)
        seg = self.segment
        self._ensure_listener()
        with self._dispatch_lock:
            sub.skip_gid = seg.global_id()
            replay: list[Message] = []
            if last_id is not None and last_id != -1:
                replay = self._replay(channel, kind, last_id, replay_site)
                if replay:
                    sub.skip_gid = max(sub.skip_gid, max(m.global_id for m in replay))
            with self._lock:
                if kind is not None:
                    self._patterns.append(sub)
                elif channel is None:
                    self._catch_all.append(sub)
                else:
                    self._exact.setdefault(channel, []).append(sub)
                self._engine_ref(channel or "*", kind is not None or channel is None, +1)
            for msg in replay:
                self._call(sub, msg)
        return sub

    def _replay(self, channel: str | None, kind: str | None, last_id: int, site: str | None) -> list[Message]:
        if channel is not None and kind is None:
            site = self._resolve_site(channel, site)
            after = last_id
            if last_id < -1:
                after = max(self.last_id(channel, site) + last_id + 1, 0)
            return list(self.backlog(channel, after, site))
        msgs = self.global_backlog(0 if last_id < 0 else last_id)
        if last_id < -1:
            msgs = msgs[last_id + 1:]
        if kind is not None and channel is not None:
            match = compile_pattern(channel, kind)
            msgs = [m for m in msgs if match(m.channel)]
        return msgs

    def unsubscribe(self, channel: str | None = None, callback: Callback | Subscription | None = None, *,
                    pattern: bool | str = False) -> int:
        """Remove subscriptions on ``channel`` (or pattern): the one given, or all of them. Returns how many."""
        removed = 0
        is_pat = bool(pattern)
        with self._lock:
            if is_pat:
                lst = self._patterns
            elif channel is None:
                lst = self._catch_all
            else:
                lst = self._exact.get(channel, [])
            keep = []
            for sub in lst:
                hit = sub.channel == channel and (callback is None or callback is sub or callback == sub.callback)
                if hit:
                    removed += 1
                else:
                    keep.append(sub)
            lst[:] = keep
            if channel is not None and not is_pat and not keep:
                self._exact.pop(channel, None)
            for _ in range(removed):
                self._engine_ref(channel or "*", is_pat or channel is None, -1)
        return removed

    def tap(self, listener: BatchListener) -> None:
        """Call ``listener(messages)`` on the listener thread with every batch of new messages (all channels,
        unfiltered). This is how web adapters wake their waiting clients: one call per batch, not per client."""
        self._ensure_listener()
        with self._lock:
            self._batch_listeners.append(listener)

    def untap(self, listener: BatchListener) -> None:
        with self._lock:
            if listener in self._batch_listeners:
                self._batch_listeners.remove(listener)

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

    # ------------------------------------------------------------------ engines (iodine draft)
    @property
    def default(self) -> Engine:
        """The default engine (``publish`` uses it unless told otherwise)."""
        return self._default_engine

    @default.setter
    def default(self, engine: Engine | None) -> None:
        engine = engine or self._shm_engine
        if engine is not self._default_engine:
            self._default_engine = engine
            engine.attached(self)
            self._inform(engine)

    def attach(self, engine: Engine) -> None:
        """Attach an engine: it is told about every existing and future subscription."""
        with self._lock:
            if engine in self._engines:
                return
            self._engines.append(engine)
        engine.attached(self)
        self._inform(engine)

    def detach(self, engine: Engine) -> None:
        with self._lock:
            if engine not in self._engines:
                return
            self._engines.remove(engine)
        engine.detached(self)

    def reset_engine(self, engine: Engine) -> None:
        """Re-inform ``engine`` of every subscription, as if newly attached."""
        self._inform(engine)

    def _inform(self, engine: Engine) -> None:
        with self._lock:
            refs = list(self._engine_refs)
        for to, is_pat in refs:
            self._safe(engine.subscribe, to, is_pat)

    def _engine_ref(self, to: str, is_pat: bool, delta: int) -> None:
        key = (to, is_pat)
        n = self._engine_refs.get(key, 0) + delta
        engines = list(self._engines)
        if self._default_engine not in engines:
            engines.append(self._default_engine)
        if n <= 0:
            self._engine_refs.pop(key, None)
            if n == 0:
                for e in engines:
                    self._safe(e.unsubscribe, to, is_pat)
        else:
            self._engine_refs[key] = n
            if n == 1 and delta > 0:
                for e in engines:
                    self._safe(e.subscribe, to, is_pat)

    @staticmethod
    def _safe(fn: Callable[..., Any], *args: Any) -> None:
        try:
            fn(*args)
        except Exception:
            log.exception("shmbus: engine hook %r raised (engines must not raise)", fn)

    # ------------------------------------------------------------------ listener
    def _ensure_listener(self) -> None:
        if self._listener is not None and self._listener.is_alive() and self._pid == os.getpid():
            return
        with self._lock:
            if self._listener is not None and self._listener.is_alive() and self._pid == os.getpid():
                return
            seg = self.segment
            self._stop = threading.Event()
            self._cursor = seg.head()
            self._last_gid = seg.global_id()
            self._epoch = seg.read_epoch()
            self._last_received = time.monotonic()
            t = _listener_thread(self._listen, f"shmbus-listener-{self.name}")
            self._listener = t  # type: ignore[assignment]
            t.start()
            if self.keepalive_interval and self.keepalive_interval > MIN_KEEPALIVE:
                w = threading.Thread(target=self._keepalive, name=f"shmbus-keepalive-{self.name}", daemon=True)
                self._watchdog = w
                w.start()

    @property
    def listening(self) -> bool:
        return self._listener is not None and self._listener.is_alive()

    def _listen(self) -> None:
        stop = self._stop
        seg = self.segment
        while not stop.is_set():
            try:
                word = seg.futex_word()
                epoch = seg.read_epoch()
                if epoch != self._epoch:
                    self._epoch = epoch
                    self._cursor = seg.tail()
                    self._last_gid = 0
                    self._on_reset()
                recs, self._cursor, lost = seg.read_since(self._cursor)
                if recs:
                    if lost or (recs[0].global_id > self._last_gid + 1 and self._last_gid):
                        n = recs[0].global_id - self._last_gid - 1
                        if n > 0:
                            self._lost += n
                            log.warning("shmbus: listener of %r fell behind the ring; %d messages were "
                                        "overwritten before this process read them", self.name, n)
                    self._last_gid = recs[-1].global_id
                    self._last_received = time.monotonic()
                    msgs = [self._message(r, epoch) for r in recs]
                    with self._dispatch_lock:
                        self._dispatch(msgs)
                    continue
                if stop.is_set():
                    break
                seg.wait(word, 1.0)
            except BusLockTimeout as exc:  # a stopped lock holder: say so, keep trying (reads go on meanwhile)
                if stop.is_set() or self._seg is None:
                    break
                log.warning("shmbus: listener of bus %r: %s", self.name, exc)
            except SegmentCorrupt as exc:  # damage in the ring: skip past it (reported), never stall on it
                if stop.is_set() or self._seg is None:
                    break
                head = seg.head()
                skipped = max(seg.global_id() - self._last_gid, 0)
                self._lost += skipped
                log.error("shmbus: bus %r is damaged (%s); the listener skips to the newest record, up to %d "
                          "messages are lost", self.name, exc, skipped)
                self._cursor, self._last_gid = head, seg.global_id()
                time.sleep(0.05)
            except Exception:  # never let the listener die: log and carry on
                if stop.is_set() or self._seg is None:
                    break
                log.exception("shmbus: listener error on bus %r", self.name)
                time.sleep(0.05)

    def _on_reset(self) -> None:
        with self._lock:
            for sub in self._iter_subs():
                sub.skip_gid = 0

    def _iter_subs(self) -> Iterable[Subscription]:
        for lst in self._exact.values():
            yield from lst
        yield from self._patterns
        yield from self._catch_all

    def _dispatch(self, msgs: list[Message], local: bool = False) -> None:
        exact, patterns, catch_all = self._exact, self._patterns, self._catch_all
        for msg in msgs:
            subs = exact.get(msg.channel)
            if subs:
                for sub in tuple(subs):
                    self._deliver(sub, msg, local)
            if patterns:
                for sub in tuple(patterns):
                    if sub.matcher is not None and sub.matcher(msg.channel):
                        self._deliver(sub, msg, local)
            if catch_all:
                for sub in tuple(catch_all):
                    self._deliver(sub, msg, local)
        if self._batch_listeners:
            for listener in tuple(self._batch_listeners):
                try:
                    listener(msgs)
                except Exception:
                    log.exception("shmbus: batch listener %r failed", listener)

    def _deliver(self, sub: Subscription, msg: Message, local: bool) -> None:
        if not local and msg.global_id <= sub.skip_gid:
            return
        if sub.site_id is not None and msg.site_id != sub.site_id and not msg.channel.startswith("/global/"):
            return
        self._call(sub, msg)

    @staticmethod
    def _call(sub: Subscription, msg: Message) -> None:
        try:
            sub.callback(msg)
        except Exception:
            log.exception("shmbus: failed to deliver message, skipping (subscriber %r, channel %r)",
                          sub.callback, msg.channel)

    def _keepalive(self) -> None:
        interval = self.keepalive_interval
        stop = self._stop
        while not stop.wait(interval):
            try:
                self.publish(KEEPALIVE_CHANNEL, os.getpid(), user_ids=[-1], max_backlog_size=10)
            except Exception:
                log.exception("shmbus: keepalive publish failed on bus %r", self.name)
            if time.monotonic() - self._last_received > 3 * interval:
                log.warning("shmbus: global messages on %d timed out, message bus %r is no longer functioning "
                            "correctly (the listener received nothing for %.0f s)", os.getpid(), self.name,
                            time.monotonic() - self._last_received)

    def health(self) -> dict[str, Any]:
        """What an operator wants to know: is this process attached, listening, and receiving?"""
        info: dict[str, Any] = {
            "bus": self.name,
            "pid": os.getpid(),
            "attached": self._seg is not None,
            "listening": self.listening,
            "seconds_since_last_message": round(time.monotonic() - self._last_received, 3),
            "lost_by_listener": self._lost,
            "engine": repr(self._default_engine),
        }
        h = getattr(self._default_engine, "health", None)
        if callable(h):
            info["engine_health"] = h()
        return info

    # ------------------------------------------------------------------ lifecycle
    @property
    def is_off(self) -> bool:
        return self._off

    def off(self, disable_publish: bool = True) -> None:
        """Stop new subscriptions and, by default, turn ``publish`` into a no-op (returns None)."""
        self._off = True
        self._publish_off = disable_publish

    def on(self) -> None:
        """Undo ``off()``, ``close()`` and ``destroy()`` (the next use attaches again, creating the bus if needed)."""
        self._off = False
        self._publish_off = False
        self._destroyed = False
        self._closed = False

    def after_fork(self) -> None:
        """Re-arm this bus in a forked child: a new listener thread (threads do not survive fork), a process-
        table slot of its own, fresh locks. Called automatically (``os.register_at_fork``); idempotent."""
        if self._pid == os.getpid():
            return
        self._pid = os.getpid()
        self._lock = threading.RLock()
        self._dispatch_lock = threading.RLock()
        self._listener = None
        self._watchdog = None
        self._stop = threading.Event()
        if self._seg is not None:
            self._seg.reregister_after_fork()
        for e in [self._default_engine, *self._engines]:
            try:
                e.after_fork(self)
            except Exception:
                log.exception("shmbus: engine %r after_fork failed", e)
        if self._seg is not None and (self._exact or self._patterns or self._catch_all or self._batch_listeners):
            self._ensure_listener()

    def reset(self, engine: Engine | None = None) -> int:
        """Empty the bus for every process and give it a new epoch; returns the epoch.

        With an engine argument this is the iodine ``reset(engine)`` instead (see :meth:`reset_engine`).
        """
        if engine is not None:
            self.reset_engine(engine)
            return self.epoch
        epoch = self.segment.reset()
        self._channel_cache.clear()
        return epoch

    def stop_listener(self, timeout: float = 5.0) -> None:
        """Stop this process's listener thread and wait for it (a clean shutdown)."""
        t, w = self._listener, self._watchdog
        self._stop.set()
        if self._seg is not None and t is not None and t.is_alive():
            self._seg.wake_all()
        if t is not None and t is not threading.current_thread():
            t.join(timeout)
        if w is not None and w is not threading.current_thread():
            w.join(timeout)
        self._listener = None
        self._watchdog = None

    def close(self) -> None:
        """Detach this process: stop the listener, close engines, unmap the segment (others keep it).

        Afterwards every operation that needs the segment raises :class:`~shmbus.errors.BusClosed` (it used to
        re-attach silently) until :meth:`on` is called.
        """
        self._closed = True
        self.stop_listener()
        for e in [self._default_engine, *self._engines]:
            try:
                e.close()
            except Exception:
                log.exception("shmbus: engine %r close failed", e)
        with self._lock:
            seg, self._seg = self._seg, None
        if seg is not None and self._pid == os.getpid():
            seg.close()

    def destroy(self) -> None:
        """Close and remove the segment itself (all history, for every process). Idempotent; for tests and
        for tearing a bus down for good."""
        self.close()
        self._destroyed = True
        if self.path is None:
            Segment.destroy_by_name(self.name)
        else:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass

    def stats(self) -> _segment.SegmentStats:
        return self.segment.stats()

    def __enter__(self) -> Bus:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Bus({self.name!r})"


class _NativeThread:
    """A real OS thread even when gevent has monkey-patched ``threading`` (then ``threading.Thread`` runs in a
    greenlet, and the listener's blocking futex wait would freeze the whole gevent hub)."""

    def __init__(self, target: Callable[[], Any], name: str) -> None:
        from gevent import monkey

        self.name = name
        self.daemon = True
        self._start_new = monkey.get_original("_thread", "start_new_thread")
        self._done = monkey.get_original("_thread", "allocate_lock")()
        self._done.acquire()
        self._alive = False
        self._target = target

    def _run(self) -> None:
        try:
            self._target()
        finally:
            self._alive = False
            self._done.release()

    def start(self) -> None:
        self._alive = True
        self._start_new(self._run, ())

    def is_alive(self) -> bool:
        return self._alive

    def join(self, timeout: float | None = None) -> None:
        if self._done.acquire(True, -1 if timeout is None else timeout):
            self._done.release()


def _listener_thread(target: Callable[[], Any], name: str) -> threading.Thread | _NativeThread:
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None and monkey.is_module_patched("threading"):
        return _NativeThread(target, name)
    return threading.Thread(target=target, name=name, daemon=True)


def _after_fork_in_child() -> None:
    for bus in list(_live_buses):
        try:
            bus.after_fork()
        except Exception:
            log.exception("shmbus: after_fork failed for %r", bus)


os.register_at_fork(after_in_child=_after_fork_in_child)
