"""The listener: one thread per process follows the ring and hands new messages to the subscription table."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from ..errors import BusLockTimeout, SegmentCorrupt
from ..figures import ListenerFigures
from ..perprocess import Birth
from ..threads import start_without_signals
from .attachment import Attachment
from .idle import IdleCalls
from .names import Names
from .subscriptions import SubscriptionTable

__all__ = ["KEEPALIVE_CHANNEL", "MIN_KEEPALIVE", "Listener"]

log = logging.getLogger("shmbus")

#: The keepalive's channel: every listener should see its message within ``keepalive_interval`` seconds.
KEEPALIVE_CHANNEL = "/__mb_keepalive__/"
#: Intervals at or below this many seconds disable the keepalive (as in the gem).
MIN_KEEPALIVE = 20
#: The most records the listener reads, decodes and dispatches as one batch (it reads again at once while there are
#: more, so a woken listener still drains everything before it sleeps). Small enough that a batch's messages are
#: mostly freed before CPython's young-generation collection runs (each message makes two container objects; it
#: runs at 700), and that the dispatch lock is let go often; large enough that what a batch costs besides its
#: messages (the futex word, the metrics, the lock) is a few per cent. Against 4,096: 2% fewer instructions per
#: delivery in a burst (perf/ab_listen.py).
BATCH = 256
#: Having found nothing new, yield the CPU once (``sched_yield``, the GIL released) and look again before sleeping.
#: On. A listener that keeps up drains faster than a publisher publishes, so it sleeps every few messages, each
#: sleep costing it the lock (to count itself) and a system call, and the publisher a wake-up call; the yield saves
#: most of that. Quiet 2-core VM (``perf/bench_scaling.py --publishers 1 --listeners 1,2 --repeats 3``, with and
#: without ``--listener-yield``, back to back): 1 listening 374k -> 383k deliveries/s (sleeps per 1k 23 -> 2.6),
#: 2 listening 560k -> 739k (1.50 -> 1.93 of one), the publisher's CPU per publish 2.9 -> 2.6 us. On the loaded VM
#: (load 5-7) K=2 / K=1 was 1.26 with it against 1.52 without: a listener that yields stays runnable, and with
#: more runnable processes than cores the publisher gets a smaller share. One yield per sleep bounds what it costs.
YIELD_BEFORE_SLEEP = True


class _Flushes(Protocol):
    def maybe_flush(self) -> None: ...


class Listener:
    """Follows the segment's ring from where it stood when started and dispatches every new batch through the
    subscription table (under its ``dispatch_lock``). Counts what the ring overwrote before it was read
    (:attr:`lost`), flushes the metrics between batches, and runs the keepalive watchdog.

    ``publish(channel, data, **options)`` is the bus's (the keepalive publishes through it).
    """

    def __init__(
        self,
        name: str,
        attachment: Attachment,
        names: Names,
        table: SubscriptionTable,
        metrics: _Flushes,
        publish: Callable[..., Any],
        keepalive_interval: float,
    ) -> None:
        self.name = name
        self.keepalive_interval = keepalive_interval
        self._attachment = attachment
        self._names = names
        self._table = table
        self._metrics = metrics
        self._publish = publish
        self._thread: Any = None  # threading.Thread, or a native thread under gevent
        self._watchdog: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._birth = Birth()
        self.epoch = 0
        self._cursor = 0
        #: the last global id handled (0: none yet)
        self.position = 0
        #: messages overwritten in the ring before this process's listener read them
        self.lost = 0
        self._last_received = time.monotonic()

    @property
    def running(self) -> bool:
        t = self._thread
        return t is not None and t.is_alive()

    def ensure(self) -> None:
        """Start the thread (and the keepalive) unless it runs in this process already."""
        if self.running and self._birth.here:
            return
        with self._lock:
            if self.running and self._birth.here:
                return
            seg = self._attachment.segment
            self._birth.renew()
            self._stop = threading.Event()
            self._cursor = seg.head()
            self.position = seg.global_id()
            self.epoch = seg.read_epoch()
            self._last_received = time.monotonic()
            t = _listener_thread(self._run, f"shmbus-listener-{self.name}")
            self._thread = t
            start_without_signals(t)  # a SIGTERM or Ctrl-C must reach the main thread, never this one
            if self.keepalive_interval and self.keepalive_interval > MIN_KEEPALIVE:
                w = threading.Thread(target=self._keepalive, name=f"shmbus-keepalive-{self.name}", daemon=True)
                self._watchdog = w
                start_without_signals(w)

    def figures(self) -> ListenerFigures:
        return ListenerFigures(self.running, self.position, self.lost, round(time.monotonic() - self._last_received, 3))

    def _run(self) -> None:
        stop = self._stop
        attachment = self._attachment
        seg = attachment.segment
        table = self._table
        metrics = self._metrics
        messages = self._names.messages
        dispatch = table.dispatch
        yielded = False
        idle = IdleCalls.install()  # the taps' wake-ups, run below before each wait (see shmbus.bus.idle)
        gather_until = 0.0  # a batch was handed over: what comes before this is read as one batch (linger)
        while not stop.is_set():
            try:
                # The linger, lazily: after a batch the listener sleeps as usual, and only a message that comes
                # within the window waits for its end. Sleeping the window out after every batch cost each isolated
                # message (a chat) a timed wake-up: a third of a worker's context switches per message.
                if gather_until and seg.global_id() != self.position:
                    left = gather_until - time.monotonic()
                    idle.run()
                    if left > 0 and stop.wait(left):
                        break
                    gather_until = 0.0
                if table.owners_gone:  # owners of subscriptions were garbage collected: close theirs
                    table.sweep_owners()
                word = seg.futex_word()
                epoch = seg.read_epoch()
                if epoch != self.epoch:
                    self.epoch = epoch
                    self._cursor = seg.tail()
                    self.position = 0
                    table.forget_replays()
                rows, self._cursor, lost = seg.read_rows(self._cursor, BATCH)  # (pos, global id, ...)
                if rows:
                    # Only the ring's word means overwritten: ids an engine imposes may jump past messages that
                    # never reached this segment (a bridge's relay counts and reports those itself, with the reason)
                    if lost:
                        self._count_lost(rows[0][1] - self.position - 1)
                    self.position = rows[-1][1]
                    seg.store_metric("listener_gid", self.position)
                    self._last_received = time.monotonic()
                    yielded = False
                    msgs = messages(rows, epoch)
                    with table.dispatch_lock:
                        dispatch(msgs)
                    metrics.maybe_flush()  # after the delivery, never in front of it
                    if len(rows) == BATCH:
                        idle.run()  # a burst: its consumers start on this batch while the next one is read
                    linger = table.linger() if len(rows) < BATCH else 0.0  # a full batch: more is there already
                    if linger > 0:  # every consumer gathers anyway: let what is published meanwhile come as one
                        gather_until = time.monotonic() + linger
                    continue
                if stop.is_set():
                    break
                metrics.maybe_flush()
                if YIELD_BEFORE_SLEEP and not yielded:  # off: see its note
                    yielded = True
                    os.sched_yield()
                    continue
                yielded = False
                idle.run()
                seg.wait(word, 1.0)
            except BusLockTimeout as exc:  # a stopped lock holder: say so, keep trying (reads go on meanwhile)
                if stop.is_set() or attachment.current is None:
                    break
                log.warning("shmbus: listener of bus %r: %s", self.name, exc)
            except SegmentCorrupt as exc:  # damage in the ring: skip past it (reported), never stall on it
                if stop.is_set() or attachment.current is None:
                    break
                head = seg.head()
                skipped = max(seg.global_id() - self.position, 0)
                self.lost += skipped
                log.error(
                    "shmbus: bus %r is damaged (%s); the listener skips to the newest record, up to %d "
                    "messages are lost",
                    self.name,
                    exc,
                    skipped,
                )
                self._cursor, self.position = head, seg.global_id()
                idle.run()
                time.sleep(0.05)
            except Exception:  # never let the listener die: log and carry on
                if stop.is_set() or attachment.current is None:
                    break
                log.exception("shmbus: listener error on bus %r", self.name)
                idle.run()
                time.sleep(0.05)
        idle.run()  # stopping: what a last batch deferred is not left behind

    def _count_lost(self, n: int) -> None:
        if n > 0:
            self.lost += n
            log.warning(
                "shmbus: listener of %r fell behind the ring; %d messages were overwritten before this process "
                "read them",
                self.name,
                n,
            )

    def _keepalive(self) -> None:
        interval = self.keepalive_interval
        stop = self._stop
        while not stop.wait(interval):
            try:
                self._publish(KEEPALIVE_CHANNEL, os.getpid(), user_ids=[-1], max_backlog_size=10)
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

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread and the keepalive and wait for them (a clean shutdown)."""
        t, w = self._thread, self._watchdog
        self._stop.set()
        seg = self._attachment.current
        if seg is not None and t is not None and t.is_alive():
            seg.wake_all()
        if t is not None and t is not threading.current_thread():
            t.join(timeout)
        if w is not None and w is not threading.current_thread():
            w.join(timeout)
        self._thread = None
        self._watchdog = None

    def after_fork(self) -> None:
        """In a forked child: the parent's threads did not survive, and what it lost is counted in its slot."""
        self._thread = None
        self._watchdog = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.lost = 0


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
