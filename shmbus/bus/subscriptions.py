"""The subscription table: callbacks per channel, pattern or every channel, batch listeners, and dispatch."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

from ..channels import GLOBAL_PREFIX
from ..message import Message
from .engine_table import EngineTable
from .results import Subscription

__all__ = ["BatchListener", "SubscriptionTable"]

log = logging.getLogger("shmbus")

BatchListener = Callable[[list[Message]], Any]


class SubscriptionTable:
    """Who gets which message in this process, and the delivery itself (:meth:`dispatch`).

    ``lock`` guards the tables; ``dispatch_lock`` is held while callbacks run (the listener's batches, a
    subscription's replay), so a replay and live messages never interleave. Every subscription added or removed
    is counted in ``engines`` (:meth:`EngineTable.hold`).
    """

    def __init__(self, engines: EngineTable) -> None:
        self._engines = engines
        self._exact: dict[str, list[Subscription]] = {}
        self._patterns: list[Subscription] = []
        self._catch_all: list[Subscription] = []
        self._batch: list[BatchListener] = []
        self._lingers: dict[BatchListener, float] = {}  # batch listener -> its linger (see tap)
        self._owners_gone = False  # set when a subscription's owner is garbage collected (see sweep_owners)
        self.lock = threading.RLock()
        self.dispatch_lock = threading.RLock()

    # ------------------------------------------------------------------ reading the table
    def on(self, channel: str) -> tuple[Subscription, ...]:
        """The subscriptions to exactly ``channel``."""
        return tuple(self._exact.get(channel, ()))

    def patterns(self) -> tuple[Subscription, ...]:
        return tuple(self._patterns)

    def __iter__(self) -> Iterator[Subscription]:
        for lst in list(self._exact.values()):
            yield from lst
        yield from self._patterns
        yield from self._catch_all

    def __bool__(self) -> bool:
        """Anyone to deliver to (a subscription or a batch listener)?"""
        return bool(self._exact or self._patterns or self._catch_all or self._batch)

    def lingering(self) -> dict[BatchListener, float]:
        return dict(self._lingers)

    # ------------------------------------------------------------------ changing it
    def add(self, sub: Subscription) -> list[Subscription]:
        """Add ``sub``; with an owner, remove and return the owner's earlier subscriptions to the same channel or
        pattern (the draft: a new one replaces the old), counted out after the new one is counted in (engines see
        no unsubscribe/subscribe flap)."""
        with self.lock:
            self._list_for(sub.channel, sub.kind, create=True).append(sub)
            self._engines.hold(sub.channel, sub.kind, +1)
            if sub.owner is None:
                return []
            lst = self._list_for(sub.channel, sub.kind)
            replaced = [
                s
                for s in lst
                if s is not sub and s.owner is sub.owner and s.channel == sub.channel and s.kind == sub.kind
            ]
            if replaced:
                lst[:] = [s for s in lst if s not in replaced]
                for old in replaced:
                    self._engines.hold(old.channel, old.kind, -1)
            return replaced

    def remove(
        self, channel: str | None, callback: object = None, *, pattern: bool = False, owner: object = None
    ) -> int:
        """Remove the subscriptions on ``channel`` (or the patterns, with ``pattern``) matching ``callback`` (a
        callback or a :class:`Subscription`; None: any) and ``owner`` (None: any). Returns how many."""
        with self.lock:
            if pattern:
                lst = self._patterns
            elif channel is None:
                lst = self._catch_all
            else:
                lst = self._exact.get(channel, [])
            gone = [
                sub
                for sub in lst
                if sub.channel == channel
                and (callback is None or callback is sub or callback == sub.callback)
                and (owner is None or sub.owner is owner)
            ]
            lst[:] = [sub for sub in lst if sub not in gone]
            if channel is not None and not pattern and not lst:
                self._exact.pop(channel, None)
            for sub in gone:
                self._engines.hold(sub.channel, sub.kind, -1)
            return len(gone)

    def note_owner_gone(self) -> None:
        """A subscription's owner was garbage collected (called by the collector, in any thread: only a note;
        the listener removes such subscriptions, see :meth:`sweep_owners`)."""
        self._owners_gone = True

    @property
    def owners_gone(self) -> bool:
        return self._owners_gone

    def sweep_owners(self) -> None:
        """Remove the subscriptions whose owner was garbage collected (the draft: they close), telling engines."""
        self._owners_gone = False
        with self.dispatch_lock, self.lock:
            gone: list[Subscription] = []
            for lst in (*self._exact.values(), self._patterns, self._catch_all):
                dead = [s for s in lst if s.owner_gone]
                if dead:
                    lst[:] = [s for s in lst if not s.owner_gone]
                    gone.extend(dead)
            for channel in [ch for ch, lst in self._exact.items() if not lst]:
                del self._exact[channel]
            for sub in gone:
                self._engines.hold(sub.channel, sub.kind, -1)

    def forget_replays(self) -> None:
        """The bus was reset (ids restart): no subscription skips ids it saw before."""
        with self.lock:
            for sub in self:
                sub.skip_gid = 0

    def tap(self, listener: BatchListener, linger: float) -> None:
        with self.lock:
            self._batch.append(listener)
            self._lingers[listener] = linger

    def untap(self, listener: BatchListener) -> None:
        with self.lock:
            if listener in self._batch:
                self._batch.remove(listener)
                if listener not in self._batch:
                    self._lingers.pop(listener, None)

    def linger(self) -> float:
        """How long the listener may wait after a batch (``Bus.tap``'s ``linger``): the smallest of the taps',
        0 when a subscription wants each message at once."""
        if self._exact or self._patterns or self._catch_all or not self._batch:
            return 0.0
        lingers = self._lingers
        return min(lingers.get(fn, 0.0) for fn in self._batch)

    def after_fork(self) -> None:
        """In a forked child: fresh locks (one held by a parent's thread at fork would stay held)."""
        self.lock = threading.RLock()
        self.dispatch_lock = threading.RLock()

    def _list_for(self, channel: str | None, kind: str | None, create: bool = False) -> list[Subscription]:
        if kind is not None:
            return self._patterns
        if channel is None:
            return self._catch_all
        if create:
            return self._exact.setdefault(channel, [])
        return self._exact.get(channel, [])

    # ------------------------------------------------------------------ delivering
    def dispatch(self, msgs: list[Message], local: bool = False) -> None:
        """Hand ``msgs`` to every subscription they match, then to the batch listeners (caller holds
        ``dispatch_lock``). ``local``: published with ``engine=False`` (no global id to compare)."""
        exact, patterns, catch_all = self._exact, self._patterns, self._catch_all
        deliver = self._deliver
        for msg in msgs:
            subs = exact.get(msg.channel)
            if subs:
                for sub in tuple(subs):
                    # the common case inline (a plain callback, no site, past its replay): a call per delivery less
                    direct = sub.direct
                    if direct is not None and (local or msg.global_id > sub.skip_gid):
                        try:
                            direct(msg)
                        except Exception:
                            _failed(direct, msg)
                    else:
                        deliver(sub, msg, local)
            if patterns:
                for sub in tuple(patterns):
                    if sub.matcher is not None and sub.matcher(msg.channel):
                        deliver(sub, msg, local)
            if catch_all:
                for sub in tuple(catch_all):
                    deliver(sub, msg, local)
        if self._batch:
            for listener in tuple(self._batch):
                try:
                    listener(msgs)
                except Exception:
                    log.exception("shmbus: batch listener %r failed", listener)

    def deliver_here(self, msgs: list[Message]) -> None:
        """Dispatch messages published with ``engine=False`` (this process only; taking ``dispatch_lock``)."""
        with self.dispatch_lock:
            self.dispatch(msgs, local=True)

    @staticmethod
    def _deliver(sub: Subscription, msg: Message, local: bool) -> None:
        if not local and msg.global_id <= sub.skip_gid:
            return
        if sub.owner_gone:  # closed by the garbage collector; the listener removes it shortly
            return
        if sub.site_id is not None and msg.site_id != sub.site_id and not msg.channel.startswith(GLOBAL_PREFIX):
            return
        call(sub, msg)


def call(sub: Subscription, msg: Message) -> None:
    """Run ``sub``'s callback on ``msg``; what it raises is logged, never passed on."""
    callback = sub.callback
    try:
        callback(msg)
    except Exception:
        _failed(callback, msg)


def _failed(callback: object, msg: Message) -> None:
    """Log a callback's exception (called in its ``except``)."""
    log.exception("shmbus: failed to deliver message, skipping (subscriber %r, channel %r)", callback, msg.channel)
