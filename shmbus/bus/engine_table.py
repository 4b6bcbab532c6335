"""The engines a bus drives: its default engine, the attached ones, and what they were told of subscriptions."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from ..engine_urls import engine_from_url
from ..engines import Engine, EngineLike, SharedMemoryEngine, _DraftEngine, as_engine
from ..figures import RelayFigures
from ..host import BusHost
from ..segment import Segment

__all__ = ["EngineTable", "engine_keys"]

log = logging.getLogger("shmbus")


def engine_keys(channel: str | None, kind: str | None) -> list[tuple[str, bool]]:
    """What engines are told of a subscription (they know channels and globs only): a channel as itself; a glob
    as a pattern; a prefix ``/foo`` as the channel ``/foo`` and the pattern ``/foo/**``; every channel (``None``)
    as the pattern ``*``."""
    if channel is None:
        return [("*", True)]
    if kind is None:
        return [(channel, False)]
    if kind == "prefix":
        base = channel.rstrip("/")
        return [(base, False), (base + "/**", True)] if base else [("/**", True)]
    return [(channel, True)]


class EngineTable:
    """The iodine draft's engine side of a bus. Engines hear ``subscribe``/``unsubscribe`` once per channel or
    pattern per process (:meth:`hold` counts holders); their hooks must not raise (logged and swallowed)."""

    def __init__(self, host: BusHost, default: EngineLike | None) -> None:
        self._host = host
        #: the segment's own engine: a publish through it is a plain append
        self.shared_memory = SharedMemoryEngine()
        self.default: Engine = as_engine(default) if default else self.shared_memory
        self.attached: list[Engine] = []
        self._refs: dict[tuple[str, bool], int] = {}
        self._lock = threading.RLock()

    def all(self) -> list[Engine]:
        """The default engine and the attached ones."""
        return [self.default, *self.attached]

    def subscribed(self) -> dict[tuple[str, bool], int]:
        """``{(channel or pattern, is_pattern): holders}``: what engines were told this process subscribes to."""
        with self._lock:
            return dict(self._refs)

    def set_default(self, engine: EngineLike | None) -> None:
        new = as_engine(engine) if engine else self.shared_memory
        if new is not self.default:
            self.default = new
            new.attached(self._host)
            self.inform(new)

    def attach(self, engine: EngineLike) -> None:
        new = as_engine(engine)
        with self._lock:
            if new in self.attached:
                return
            self.attached.append(new)
        new.attached(self._host)
        self.inform(new)

    def detach(self, engine: EngineLike) -> None:
        old = as_engine(engine)
        with self._lock:
            if old not in self.attached:
                return
            self.attached.remove(old)
        old.detached(self._host)

    def inform(self, engine: Engine) -> None:
        """Tell ``engine`` of every channel and pattern this process subscribes to."""
        with self._lock:
            refs = list(self._refs)
        for to, is_pattern in refs:
            _safe(engine.subscribe, to, is_pattern)

    def hold(self, channel: str | None, kind: str | None, delta: int) -> None:
        """Count a subscription to ``channel`` (``kind``: None, ``"glob"`` or ``"prefix"``) starting (+1) or
        ending (-1); engines hear of the first holder and of the last one leaving."""
        with self._lock:
            for to, is_pattern in engine_keys(channel, kind):
                self._hold(to, is_pattern, delta)

    def _hold(self, to: str, is_pattern: bool, delta: int) -> None:
        key = (to, is_pattern)
        n = self._refs.get(key, 0) + delta
        engines = list(self.attached)
        if self.default not in engines:
            engines.append(self.default)
        if n <= 0:
            self._refs.pop(key, None)
            if n == 0:
                for e in engines:
                    _safe(e.unsubscribe, to, is_pattern)
        else:
            self._refs[key] = n
            if n == 1 and delta > 0:
                for e in engines:
                    _safe(e.subscribe, to, is_pattern)

    def relay_figures(self) -> list[RelayFigures]:
        """What the engines that relay report (:meth:`Engine.relay_figures`)."""
        return [f for e in self.all() if (f := e.relay_figures()) is not None]

    def adopt_bridge(self, seg: Segment) -> None:
        """The segment is bridged and this process was given no engine (a cron job, a Celery worker, ``shmbus
        publish``): build the workers' engine from ``SHMBUS_ENGINE_URL`` or the segment's record (when its URL
        needs no password), publishing only (the host's workers relay). Otherwise stay as is: a publish then
        raises :class:`~shmbus.errors.BusBridged` saying what to configure (the segment refuses local ids)."""
        if not seg.bridged or self.default is not self.shared_memory:
            return
        rec = seg.bridge()
        url = os.environ.get("SHMBUS_ENGINE_URL") or (rec.url if rec is not None and not rec.secret else None)
        if not url:
            return
        name = self._host.name
        try:
            engine = engine_from_url(url, kind=rec.kind if rec else None, options=rec.options if rec else None)
        except (ImportError, ValueError) as exc:
            log.warning("shmbus: bus %r is bridged but its engine cannot be built (%s); publishes will fail", name, exc)
            return
        log.info("shmbus: bus %r is bridged: publishing through %r", name, engine)
        self.default = engine
        engine.attached(self._host)

    def as_given(self) -> EngineLike:
        """The default engine as the application gave it (a draft engine, not its adapter)."""
        engine = self.default
        return engine.draft if isinstance(engine, _DraftEngine) else engine

    def after_fork(self) -> None:
        """In a forked child: a fresh lock, and every engine told to drop what belongs to the parent."""
        self._lock = threading.RLock()
        for e in self.all():
            try:
                e.after_fork(self._host)
            except Exception:
                log.exception("shmbus: engine %r after_fork failed", e)

    def close(self) -> None:
        for e in self.all():
            try:
                e.close()
            except Exception:
                log.exception("shmbus: engine %r close failed", e)


def _safe(fn: Callable[..., Any], *args: Any) -> None:
    try:
        fn(*args)
    except Exception:
        log.exception("shmbus: engine hook %r raised (engines must not raise)", fn)
