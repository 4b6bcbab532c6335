"""One event loop's fan-out of live batches to the clients waiting on it (:class:`LoopFanout`): the ASGI
middleware's, and so the lean server's, where waking a stream is writing to it.

Why slices sized by time: a broadcast to the ~5,000 streams of a worker is ~5,000 deliveries and writes, tens of
milliseconds; a chat message published meanwhile to a few clients must not wait for all of them (nor must the read
of its publish request). A channel with many clients on this loop is delivered and woken in slices of about
:data:`SLICE_BUDGET` of the loop's time: its dispatch only sets it aside (a :class:`~.http.group.Deferred`), and
each slice makes the next clients' pieces and writes them. Each next slice is a timer due at once, which asyncio
runs after the I/O callbacks of its turn, so between two slices the loop accepts, reads and answers what came in,
and runs a drain that came due. A small fan-out (:data:`SMALL_FANOUT` clients at most) is delivered and woken at
once, never queued behind a running one.

Order and loss: dispatches run in the order their batches were published, appending to each client's own queue
of pieces (``Waiter.pending``); a wake-up writes all of a client's queue, oldest first. A deferred delivery that
has not reached a client yet gives it its piece first whenever a later dispatch delivers to that client or the
client ends (:meth:`~.http.registry.Registry.dispatch`), and then skips it. Delivering or waking clients late or
out of turn therefore changes when a client's pieces leave, never their order, and a client woken with nothing
queued (a chat's wake-up took its broadcast piece too) writes nothing.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from shmbus.bus import Bus
from shmbus.bus.idle import when_idle
from shmbus.message import Message

from .http import MessageBusProtocol, Options, Waiter
from .http.group import DEFER_OVER, Deferred
from .http.protocol import null_lock
from .http.waiter import Stage
from .loop_lock import held_outside_select
from .probe import PROBE

__all__ = ["SLICE_BUDGET", "SLICE_STEP", "SMALL_FANOUT", "WINDOW_STRETCH", "LoopFanout"]

log = logging.getLogger("shmbus.adapters")

#: The gathering window stretches to the duration of the last fan-out, up to this many ``batch_window``\ s.
WINDOW_STRETCH = 10
#: A large fan-out wakes its clients in slices of about this much of the loop's time (seconds): what a read, a
#: request or a small fan-out waits behind it at most (plus one step of wake-ups).
SLICE_BUDGET = 0.001
#: Deliveries and wake-ups between two looks at the clock (a look costs ~50 ns; a wake-up on the lean server is a
#: write).
SLICE_STEP = 8
#: A fan-out to at most this many clients is small: delivered and woken at once, never gathered for longer than
#: ``batch_window`` (a channel with more clients here is deferred: the registry's threshold).
SMALL_FANOUT = DEFER_OVER


class _Run:
    """A large fan-out in progress: the clients to wake (their pieces queued), the next one to wake, the
    deliveries left to make a client at a time (:class:`~.http.group.Deferred`), when it began, its oldest
    publish."""

    __slots__ = ("clients", "deferred", "pos", "stamp", "started")

    def __init__(self, clients: list[Waiter], deferred: list[Deferred], started: float, stamp: float) -> None:
        self.clients = clients
        self.deferred = deferred
        self.pos = 0
        self.started = started
        self.stamp = stamp


class LoopFanout:
    """One loop's fan-out: its protocol (the clients waiting on this loop), the batches the listener thread
    queued for it, and the large fan-outs in progress.

    Batches that arrive before the loop gets to run are merged: the listener appends to ``batches`` and
    schedules :meth:`drain` only when none is pending, so per-client work (encoding, waking, writing) happens
    once per drain instead of once per batch.

    The window adapts to the fan-out: after a fan-out that took longer than ``batch_window`` (many clients),
    the next batches for many clients are gathered for as long as it took (at most ``WINDOW_STRETCH`` windows).
    Messages that an app publishes one request at a time then travel several to a chunk while fan-out is what
    the loop spends its time on; the latency added is at most the time the last fan-out took. Batches for a few
    clients (a chat room) cost little and must not wait for a broadcast's length: they keep ``batch_window``, or
    are drained as soon as the loop gets them while the bus listener's linger (``batch_window``) spaces them.
    """

    def __init__(self, bus: Bus, options: Options, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.proto = MessageBusProtocol(bus, options, null_lock())
        self.batches: list[list[Message]] = []
        self.scheduled = False
        self.window = options.batch_window
        self.wait = options.batch_window  # batch_window, stretched after a long fan-out
        self.lock = threading.Lock()
        self.runs: deque[_Run] = deque()  # large fan-outs in progress, oldest first
        self.slicing = False  # the next slice is scheduled
        #: the slices' clock (seconds); tests put a fake one here
        self.clock: Callable[[], float] = time.perf_counter
        self.queued_at = 0.0  # when the first batch of the next drain was queued (the probe's ``gather``)
        #: the lock the loop's thread holds outside ``select`` (the lean server's loop), else None
        self.inline = held_outside_select(loop)
        if PROBE is not None:
            PROBE.watch(loop)

    # ------------------------------------------------------------------ the listener thread
    def add(self, msgs: list[Message]) -> None:
        """Listener thread: queue a batch; at most one ``call_soon_threadsafe`` is pending at a time."""
        if PROBE is not None and msgs:
            PROBE.since_publish("listener", msgs[0].timestamp)
        with self.lock:
            self.batches.append(msgs)
            if self.scheduled:
                return
            self.scheduled = True
            self.queued_at = time.perf_counter()
        when_idle(self._wake_loop)  # once the listener has nothing more to read (see shmbus.bus.idle)

    def _wake_loop(self) -> None:
        """Listener thread: a small fan-out is made here while the loop idles in ``select`` (its lock free: see
        :mod:`.loop_lock`); anything else is the loop's, woken for it."""
        lock = self.inline
        if (
            lock is not None
            and (self.window <= 0 or self.proto.bus.subscriptions.linger() >= self.window)
            and lock.acquire(blocking=False)
        ):
            try:
                if self.few_queued():  # asked under the lock: the index is the loop's
                    self._drain_here()
                    return
            finally:
                lock.release()
        try:
            self.loop.call_soon_threadsafe(self.drain if self.window <= 0 else self._drain_soon)
        except RuntimeError:  # loop closed
            with self.lock:
                self.batches = []
                self.scheduled = False

    # ------------------------------------------------------------------ the loop
    def _drain_soon(self) -> None:
        """Drain after the window, so batches arriving meanwhile reach each client as one chunk. Batches for a
        few clients are drained at once while the bus listener lingers ``batch_window`` after each batch it hands
        over (it does unless something in the process subscribes to the bus): a chat room's messages still come
        at most one batch a window, and waiting here too only added the window to their latency and a second
        wake-up of the loop to each."""
        if self.few_queued():
            if self.proto.bus.subscriptions.linger() >= self.window:
                self.drain()
                return
            wait = self.window
        else:
            wait = self.wait
        self.loop.call_later(wait, self.drain)

    def few_queued(self) -> bool:
        """The queued batches' channels have at most ``SMALL_FANOUT`` clients on this loop (a look-up per
        channel)."""
        index = self.proto.registry.index
        with self.lock:
            batches = self.batches[:]
        n = 0
        seen: set[tuple[str | None, str]] = set()
        for batch in batches:
            for m in batch:
                key = (m.site_id, m.channel)
                if key not in seen:
                    seen.add(key)
                    clients = index.get(key)
                    if clients:
                        n += len(clients)
                        if n > SMALL_FANOUT:
                            return False
        return True

    def _drain_here(self) -> None:
        """:meth:`drain` of a small fan-out on the listener thread, holding the loop's lock: the deliveries, and the
        writes to streams that stay parked; what else a wake-up may do (answer a long poll, end a stream, start the
        connection's next request) is left to the loop, woken for it, as is anything a write scheduled there."""
        with self.lock:
            batches, self.batches = self.batches, []
            self.scheduled = False
        if not batches:
            return
        started = self.clock()
        clients = self.proto.deliver_batches(batches)  # small (few_queued): nothing would be deferred
        wake = self.proto.wake
        later = []
        for c in clients:
            if c.streaming and c.stage is Stage.PARKED:
                wake(c)  # a write: the connection's only step
            else:
                later.append(c)
        if later or getattr(self.loop, "_ready", None):  # (a failed write's close is scheduled with call_soon)
            try:
                self.loop.call_soon_threadsafe(self._wake_all, later)
            except RuntimeError:  # loop closed: nothing is answered any more
                pass
        self._finished(started, batches[0][0].timestamp if batches[0] else 0.0, "small")

    def _wake_all(self, clients: list[Waiter]) -> None:
        wake = self.proto.wake
        for c in clients:
            wake(c)

    def drain(self) -> None:
        """Dispatch every queued batch, consecutive batches of one epoch as one. A channel with many clients here
        is only set aside (a :class:`~.http.group.Deferred`): its deliveries are made in slices
        (:meth:`_slice`), after the fan-outs already in progress, as are the wake-ups when they are many; a few
        clients' are made and woken at once (ahead of the slices: a client a slice still owes its piece gets it
        first)."""
        with self.lock:
            batches, self.batches = self.batches, []
            self.scheduled = False
            queued_at = self.queued_at
        if not batches:
            return
        started = self.clock()
        gathered = time.perf_counter() - queued_at if PROBE is not None else 0.0
        deferred: list[Deferred] = []
        clients = self.proto.deliver_batches(batches, deferred)
        small = len(clients) <= SMALL_FANOUT
        stamp = 0.0
        if PROBE is not None:
            PROBE.note("gather" if small and not deferred else "gather_large", gathered)
            PROBE.note("dispatch", self.clock() - started)
            stamp = batches[0][0].timestamp if batches[0] else 0.0
        if small:
            self._wake_all(clients)
            if not deferred:
                self._finished(started, stamp, "small")
                return
            clients = []
        self.runs.append(_Run(clients, deferred, started, stamp))
        if not self.slicing:
            self._slice()

    def _slice(self) -> None:
        """Deliver to and wake clients of the fan-outs in progress, oldest first, for about ``SLICE_BUDGET``;
        schedule the next slice behind what the loop has to do meanwhile."""
        self.slicing = False
        clock = self.clock
        begun = clock()
        deadline = begun + SLICE_BUDGET
        wake = self.proto.wake
        serve = self.proto.registry.serve
        runs = self.runs
        step = SLICE_STEP
        while runs:
            run = runs[0]
            clients = run.clients
            pos, n = run.pos, len(clients)
            spent = False
            while pos < n:
                for c in clients[pos : pos + step]:
                    wake(c)
                pos += step
                if clock() >= deadline:
                    spent = True
                    break
            run.pos = pos
            deferred = run.deferred
            while deferred and not spent:
                d = deferred[0]
                n = len(d.clients)
                while d.pos < n:
                    for c in serve(d, step):
                        waker = c.waker  # what proto.wake does, without its call
                        if waker is not None:
                            try:
                                waker(c)
                            except Exception:
                                log.exception("shmbus: waking %r failed", c)
                    if clock() >= deadline:
                        spent = True
                        break
                if d.pos >= n:
                    del deferred[0]
            if pos >= len(clients) and not deferred:
                runs.popleft()
                self._finished(run.started, run.stamp, "large")
            if spent:
                break
        if PROBE is not None:
            PROBE.note("slice", clock() - begun)
        if runs:
            self.slicing = True
            self.loop.call_later(0, self._slice)  # a timer: it runs after the I/O callbacks of its turn

    def _finished(self, started: float, stamp: float, kind: str) -> None:
        """A fan-out woke its last client: the window stretches to what it took (or returns to the window)."""
        if PROBE is not None:
            PROBE.since_publish(kind, stamp)
        if self.window > 0:
            spent = self.clock() - started
            self.wait = min(max(self.window, spent), self.window * WINDOW_STRETCH)
