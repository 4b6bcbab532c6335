"""``Bus``: message_bus's API over a shared-memory segment that every process on the host attaches to by name."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import forks
from .. import segment as _segment
from ..buses import not_found_message
from ..channels import check_bus_name
from ..codecs import Codec, get_codec
from ..engines import Engine, EngineLike, SharedMemoryEngine, _DraftEngine, as_engine
from ..errors import BusNotFound, InvalidArgument
from ..message import Message
from ..metrics import Metrics
from ..segment import Segment
from .listener import Listening
from .publishing import Publishing
from .reading import Reading
from .results import Subscription
from .state import BatchListener
from .subscriptions import Subscribing
from .validation import check_count, check_seconds

__all__ = ["Bus"]

log = logging.getLogger("shmbus")


class Bus(Publishing, Reading, Subscribing, Listening):
    """A message bus shared by every process on the host that opens the same ``name``.

    Nothing is attached until first use, so a ``Bus`` can be built at import time in a pre-forking master.
    Options mirror message_bus (times in seconds):

    ``ring_size`` (bytes of history, default 32 MiB) and ``max_channels`` (8192) size the segment when this
    process creates it; ``path`` maps a regular file instead of ``/dev/shm`` (a persistent log); ``codec``
    (``"json"``, ``"msgpack"`` or a :class:`~shmbus.codecs.Codec`); ``max_backlog_size`` (1000 per channel),
    ``max_global_backlog_size`` (2000), ``max_backlog_age`` (7 days without a publish expires a channel and
    restarts its ids), ``clear_every`` (1); ``site_id_lookup`` (zero-argument callable giving the current site);
    ``keepalive_interval`` (60; 0 or anything <= 20 disables it); ``engine`` (the default engine); ``create``
    (False: attach only; :class:`~shmbus.errors.BusNotFound` from this constructor if the bus does not exist,
    naming the buses that do); ``mode`` (permission bits of a new segment and the most an existing one may
    grant: ``0o600``, or ``0o660`` to share the bus with a group);
    ``lock_timeout`` (seconds a publish or attach waits for the writer lock before
    :class:`~shmbus.errors.BusLockTimeout`, 5). Bad values raise :class:`~shmbus.errors.InvalidArgument` here,
    not at first use.
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
        create: bool = True,
        mode: int = 0o600,
        lock_timeout: float = 5.0,
    ) -> None:
        check_bus_name(name)
        if not create and not os.path.lexists(path or _segment.segment_path(name)):
            # now, not at first use: a mistyped name fails where it is written, naming the buses that exist
            raise BusNotFound(not_found_message(name, path) + " (create=False: this process only attaches)")
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
        self._default_engine: Engine = as_engine(engine) if engine else self._shm_engine
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
        self._lingers: dict[BatchListener, float] = {}  # batch listener -> its linger (see tap)
        self._engine_refs: dict[tuple[str, bool], int] = {}
        self._owners_gone = False  # set when a subscription's owner is garbage collected (see _sweep_owners)
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
        #: this process's figures (deliveries, gauges) for the host-wide metrics: :mod:`shmbus.metrics`
        self.metrics = Metrics(self)
        self._default_engine.attached(self)
        forks.register(self)

    # ------------------------------------------------------------------ engines (iodine draft)
    @property
    def default(self) -> EngineLike:
        """The default engine (``publish`` uses it unless told otherwise)."""
        engine = self._default_engine
        return engine.draft if isinstance(engine, _DraftEngine) else engine

    @default.setter
    def default(self, engine: EngineLike | None) -> None:
        engine = as_engine(engine) if engine else self._shm_engine
        if engine is not self._default_engine:
            self._default_engine = engine
            engine.attached(self)
            self._inform(engine)

    def attach(self, engine: EngineLike) -> None:
        """Attach an engine: it is told about every existing and future subscription."""
        engine = as_engine(engine)
        with self._lock:
            if engine in self._engines:
                return
            self._engines.append(engine)
        engine.attached(self)
        self._inform(engine)

    def detach(self, engine: EngineLike) -> None:
        engine = as_engine(engine)
        with self._lock:
            if engine not in self._engines:
                return
            self._engines.remove(engine)
        engine.detached(self)

    def reset_engine(self, engine: EngineLike) -> None:
        """The iodine draft's ``reset(engine)``: tell ``engine`` again of every channel and pattern this process
        subscribes to, as if newly attached (e.g. after the engine reconnected and lost its subscriptions)."""
        self._inform(as_engine(engine))

    def _inform(self, engine: Engine) -> None:
        with self._lock:
            refs = list(self._engine_refs)
        for to, is_pat in refs:
            self._safe(engine.subscribe, to, is_pat)

    def engine_hold(self, channel: str | None, kind: str | None, delta: int) -> None:
        """Count a subscription that reads the bus some other way (the transports' connections read it through
        :meth:`tap`) as :meth:`subscribe` counts its own: ``delta`` +1 when it starts, -1 when it ends. Engines
        hear ``subscribe``/``unsubscribe`` once per channel or pattern per process, whoever subscribes.
        ``kind``: None (a channel), ``"glob"`` or ``"prefix"``."""
        with self._lock:
            for to, is_pattern in self._engine_keys(channel, kind):
                self._engine_ref(to, is_pattern, delta)

    def _engine_ref(self, to: str, is_pattern: bool, delta: int) -> None:
        key = (to, is_pattern)
        n = self._engine_refs.get(key, 0) + delta
        engines = list(self._engines)
        if self._default_engine not in engines:
            engines.append(self._default_engine)
        if n <= 0:
            self._engine_refs.pop(key, None)
            if n == 0:
                for e in engines:
                    self._safe(e.unsubscribe, to, is_pattern)
        else:
            self._engine_refs[key] = n
            if n == 1 and delta > 0:
                for e in engines:
                    self._safe(e.subscribe, to, is_pattern)

    @staticmethod
    def _safe(fn: Callable[..., Any], *args: Any) -> None:
        try:
            fn(*args)
        except Exception:
            log.exception("shmbus: engine hook %r raised (engines must not raise)", fn)

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
        self.metrics.after_fork()
        if self._seg is not None:
            self._seg.reregister_after_fork()
        for e in [self._default_engine, *self._engines]:
            try:
                e.after_fork(self)
            except Exception:
                log.exception("shmbus: engine %r after_fork failed", e)
        if self._seg is not None and (self._exact or self._patterns or self._catch_all or self._batch_listeners):
            self._ensure_listener()

    def reset(self) -> int:
        """Empty the bus for every process and give it a new epoch (clients re-read from the start); returns
        the epoch. The iodine draft's ``reset(engine)`` is :meth:`reset_engine`."""
        epoch = self.segment.reset()
        self._channel_cache.clear()
        return epoch

    def close(self) -> None:
        """Detach this process: stop the listener, close engines, unmap the segment (others keep it).

        Afterwards every operation that needs the segment raises :class:`~shmbus.errors.BusClosed` (it used to
        re-attach silently) until :meth:`on` is called.
        """
        self._closed = True
        self.stop_listener()
        self.metrics.flush()  # the last figures stay in the slot (host totals count them)
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
