"""The listener: one thread per process follows the ring and dispatches new messages to subscribers."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from ..channels import GLOBAL_PREFIX
from ..errors import BusLockTimeout, SegmentCorrupt
from ..message import Message
from .results import Subscription
from .state import BusState

__all__ = ["KEEPALIVE_CHANNEL", "MIN_KEEPALIVE", "Listening"]

log = logging.getLogger("shmbus")

#: The keepalive's channel: every listener should see its message within ``keepalive_interval`` seconds.
KEEPALIVE_CHANNEL = "/__mb_keepalive__/"
#: Intervals at or below this many seconds disable the keepalive (as in the gem).
MIN_KEEPALIVE = 20


class Listening(BusState):
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
            self._listener = t
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
        metrics = self.metrics
        while not stop.is_set():
            try:
                if self._owners_gone:  # owners of subscriptions were garbage collected: close theirs
                    self._sweep_owners()
                word = seg.futex_word()
                epoch = seg.read_epoch()
                if epoch != self._epoch:
                    self._epoch = epoch
                    self._cursor = seg.tail()
                    self._last_gid = 0
                    self._on_reset()
                recs, self._cursor, lost = seg.read_since(self._cursor)
                if recs:
                    jumped = recs[0].global_id > self._last_gid + 1 and self._last_gid and not seg.sparse_ids
                    if lost or jumped:  # sparse ids (PostgreSQL) may jump legitimately: only the ring's word counts
                        n = recs[0].global_id - self._last_gid - 1
                        if n > 0:
                            self._lost += n
                            log.warning(
                                "shmbus: listener of %r fell behind the ring; %d messages were "
                                "overwritten before this process read them",
                                self.name,
                                n,
                            )
                    self._last_gid = recs[-1].global_id
                    seg.store_metric("listener_gid", self._last_gid)
                    self._last_received = time.monotonic()
                    msgs = [self._message(r, epoch) for r in recs]
                    with self._dispatch_lock:
                        self._dispatch(msgs)
                    metrics.maybe_flush()  # after the delivery, never in front of it
                    linger = self._linger()
                    if linger > 0:  # every consumer gathers anyway: let what is published meanwhile come as one
                        stop.wait(linger)
                    continue
                if stop.is_set():
                    break
                metrics.maybe_flush()
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
                log.error(
                    "shmbus: bus %r is damaged (%s); the listener skips to the newest record, up to %d "
                    "messages are lost",
                    self.name,
                    exc,
                    skipped,
                )
                self._cursor, self._last_gid = head, seg.global_id()
                time.sleep(0.05)
            except Exception:  # never let the listener die: log and carry on
                if stop.is_set() or self._seg is None:
                    break
                log.exception("shmbus: listener error on bus %r", self.name)
                time.sleep(0.05)

    def _linger(self) -> float:
        """How long the listener may wait after a batch (:meth:`tap`'s ``linger``): the smallest of the taps',
        0 when a subscription wants each message at once."""
        if self._exact or self._patterns or self._catch_all or not self._batch_listeners:
            return 0.0
        lingers = self._lingers
        return min(lingers.get(fn, 0.0) for fn in self._batch_listeners)

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
        if sub.owner_gone:  # closed by the garbage collector; the listener removes it shortly
            return
        if sub.site_id is not None and msg.site_id != sub.site_id and not msg.channel.startswith(GLOBAL_PREFIX):
            return
        self._call(sub, msg)

    @staticmethod
    def _call(sub: Subscription, msg: Message) -> None:
        try:
            sub.callback(msg)
        except Exception:
            log.exception(
                "shmbus: failed to deliver message, skipping (subscriber %r, channel %r)", sub.callback, msg.channel
            )

    def _keepalive(self) -> None:
        interval = self.keepalive_interval
        stop = self._stop
        while not stop.wait(interval):
            try:
                self.publish(KEEPALIVE_CHANNEL, os.getpid(), user_ids=[-1], max_backlog_size=10)
            except Exception:
                log.exception("shmbus: keepalive publish failed on bus %r", self.name)
            if time.monotonic() - self._last_received > 3 * interval:
                log.warning(
                    "shmbus: global messages on %d timed out, message bus %r is no longer functioning "
                    "correctly (the listener received nothing for %.0f s)",
                    os.getpid(),
                    self.name,
                    time.monotonic() - self._last_received,
                )

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
        engine_health = self._default_engine.health()
        if engine_health is not None:
            info["engine_health"] = engine_health
        return info

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
