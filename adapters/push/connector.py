"""The push connector: in every process, a thread that stands for election; in the elected one, the sender.

The sender reads the bus's global log after its cursor (``Bus.global_backlog``), keeps the messages on pushing
channels, finds each one's devices (:class:`~.subscriptions.Recipients`) and hands one job per device to the
lanes (:mod:`.sender`). The cursor is the newest global id below which every message is *settled* (each of its
pushes sent, failed, expired or dropped); it is saved at most every ``save_interval`` seconds when it moved (and
every ``HEARTBEAT`` seconds anyway), under the sender's term (:class:`~.state.StaleSender` ends a sender that
lost its election without noticing).

What the cursor admits (the duplicate window): a sender killed at any point is replaced by one that starts after
the last saved cursor, so the pushes it resends are those of messages above it: at most ``max_in_flight``
messages being pushed at the kill, plus those settled within the last ``save_interval``. Nothing at or below
the cursor is pushed again, and nothing above it is skipped (unless the ring overwrote it meanwhile: counted as
``missed``). Every push that could not be made is reported: counted, logged, kept in :attr:`undelivered` (the
newest 1000) and passed to ``on_undelivered(global_id, registration, outcome, reason)``.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from shmbus.bus import Bus
from shmbus.message import Message

from .addresses import DEFAULT_PORTS, IPAddress, ports_of, public_address
from .cursor import CursorTracker
from .election import Elector, FileElector
from .figures import metric_families
from .options import PushOptions, message_options, payload_for
from .sender import Job, LaneOptions, Outcome, Sender
from .state import COUNTERS, HEARTBEAT, SenderState, StaleSender, Store
from .stores import FileStore, store_for
from .subscriptions import Recipients, Registration, topic_matches
from .vapid import VapidKeys

__all__ = ["PushConnector"]

log = logging.getLogger(__name__)
Undelivered = tuple[int, Registration, str, str]


def _after_fork(ref: weakref.ReferenceType[PushConnector]) -> None:
    connector = ref()
    if connector is not None:
        connector._after_fork()


def _pusher(channels: str | Iterable[str] | Callable[[str], bool]) -> Callable[[str], bool]:
    if callable(channels):
        return channels
    prefixes = [channels] if isinstance(channels, str) else list(channels)
    for p in prefixes:
        if not isinstance(p, str) or not p.startswith("/"):
            raise ValueError(f"push channel prefixes must start with '/', got {p!r}")
    tops = [p.rstrip("/") or "/" for p in prefixes]
    return lambda channel: any(topic_matches(t, channel) for t in tops)


class PushConnector:
    """Web Push for a bus. Create one in every worker (they elect one sender) and call :meth:`start`.

    ``channels``: which channels push — a prefix (``"/chat"``: it and everything below), a list of them, or
    ``callable(channel) -> bool``. ``vapid``: the :class:`~.vapid.VapidKeys`. ``store``: default
    :func:`~.stores.store_for` the bus; ``elector``: default a PostgreSQL advisory lock with a PostgreSQL store,
    else a file lock next to a file store. ``namespace`` separates apps sharing a database. ``group_ids_for(user_id)``
    resolves groups at send time for ``group_ids`` targeting. ``options_for(message) -> PushOptions | None``
    replaces the ``__push__`` convention (:mod:`.options`); ``default_options`` (TTL one day) applies otherwise.
    ``allow_address(ip) -> bool`` (default :func:`~.subscriptions.public_address`): the addresses the sender may
    connect to, checked after resolving each endpoint's host (an endpoint is a URL a user chose: SSRF).
    ``allow_ports`` (default :data:`~.addresses.DEFAULT_PORTS`: 443; None: any): the ports it may connect to,
    checked at registration too (a user's endpoint must not reach a service on another port of a public host).
    """

    def __init__(
        self,
        bus: Bus,
        *,
        vapid: VapidKeys,
        channels: str | Iterable[str] | Callable[[str], bool],
        store: Store | None = None,
        elector: Elector | None = None,
        namespace: str = "default",
        group_ids_for: Callable[[Any], Any] | None = None,
        options_for: Callable[[Message], PushOptions | None] | None = None,
        default_options: PushOptions | None = None,
        workers_per_service: int = 4,
        max_queue: int = 10_000,
        timeout: float = 10.0,
        max_attempts: int = 5,
        max_retry_after: float = 600.0,
        stall_after: float | None = None,
        max_in_flight: int = 256,
        save_interval: float = 0.1,
        election_interval: float = 0.5,
        catch_up: float = 10.0,
        on_undelivered: Callable[[int, Registration, str, str], None] | None = None,
        allow_address: Callable[[IPAddress], bool] = public_address,
        allow_ports: Iterable[int] | None = DEFAULT_PORTS,
    ) -> None:
        self.bus = bus
        self.vapid = vapid
        self.pushes = _pusher(channels)
        self.namespace = namespace
        self.store: Store = store if store is not None else store_for(bus, namespace)
        self.elector: Elector = elector if elector is not None else self._default_elector()
        self.group_ids_for = group_ids_for
        self.options_for = options_for
        self.default_options = default_options or PushOptions()
        self.lane_options = LaneOptions(
            workers_per_service, max_queue, timeout, max_attempts, max_retry_after,
            timeout if stall_after is None else stall_after, allow_address, ports_of(allow_ports),
        )  # fmt: skip
        self.max_in_flight = max_in_flight
        self.save_interval = save_interval
        self.election_interval = election_interval
        self.catch_up = catch_up
        self.on_undelivered = on_undelivered
        self.undelivered: deque[Undelivered] = deque(maxlen=1000)
        self.leading = False
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._counts_lock = threading.Lock()
        self._state: SenderState | None = None
        self._sender: Sender | None = None
        self._gone: set[str] = set()  # endpoints answered 404/410 this term (before the store reload drops them)
        self._started = False  # started and not closed: a forked child starts again
        self._grace = 0.0
        self._saved_counters: dict[str, int] = {}
        os.register_at_fork(after_in_child=functools.partial(_after_fork, weakref.ref(self)))

    def _default_elector(self) -> Elector:
        if isinstance(self.store, FileStore):
            return FileElector(self.store.base + ".sender.lock")
        from .pgstore import PostgresElector, PostgresStore

        if isinstance(self.store, PostgresStore):
            return PostgresElector(self.store.dsn, self.store.namespace)
        raise ValueError("pass elector= for a custom store")

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> PushConnector:
        """Start standing for election in this process (idempotent; again by itself in a forked child)."""
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self.bus.untap(self._on_batch)  # after a fork the tap came along
            self.bus.tap(self._on_batch)
            self._thread = threading.Thread(target=self._run, name="shmbus-push", daemon=True)
            self._started = True
            self._thread.start()
        return self

    def close(self, grace: float = 2.0) -> None:
        """Stop (a sender first finishes its in-flight pushes for up to ``grace`` seconds and saves its cursor)."""
        self._grace = grace
        self._started = False  # a child forked from now on does not start again
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread.ident != threading.get_ident():
            self._thread.join(timeout=grace + self.lane_options.timeout + 5)
        self.bus.untap(self._on_batch)

    def _after_fork(self) -> None:
        started = self._started
        self._thread, self._sender, self.leading = None, None, False
        self._stop, self._wake, self._counts_lock = threading.Event(), threading.Event(), threading.Lock()
        if started:
            self.start()

    def _on_batch(self, _msgs: list[Message]) -> None:
        self._wake.set()

    # ------------------------------------------------------------------ figures
    def stats(self) -> dict[str, Any]:
        """The sender's persisted figures (any process of any host reads the same): counters, cursor, queue
        depth as of its last save, the leader, and whether this process is it."""
        state = self.store.load()
        return {**state.counters, "cursor": state.cursor, "queue_depth": state.queue_depth, "leader": state.leader,
                "term": state.term, "updated": state.updated, "leading_here": self.leading}  # fmt: skip

    def metric_families(self) -> list[Any]:
        """The push figures for :mod:`shmbus.adapters.metrics` (``MetricsApp(..., extra=[c.metric_families])``):
        the store's, so every worker of every host reports the same cluster-wide totals."""
        return metric_families(self.store.load(), {"bus": self.bus.name, "namespace": self.namespace})

    def _count(self, name: str, n: int = 1) -> None:
        with self._counts_lock:
            if self._state is not None:
                self._state.counters[name] = self._state.counters.get(name, 0) + n

    # ------------------------------------------------------------------ the election loop
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self.elector.try_acquire():
                    try:
                        self._lead()
                    finally:
                        self.elector.release()
            except Exception:  # a store or database failure: stand again later
                log.exception("shmbus push: sender error (standing for election again)")
            self._stop.wait(self.election_interval)

    def _lead(self) -> None:
        me = f"{socket.gethostname()}:{os.getpid()}"
        state = self.store.take_over(me)
        # A cursor past this segment's head is usually another host's, and this host's relay is catching up:
        # wait for it (restarting at the head would push those messages again); past ``catch_up`` the bus was
        # reset (or is new), and the cursor restarts at its head.
        deadline = time.monotonic() + self.catch_up
        while (state.cursor or 0) > self.bus.segment.global_id() and time.monotonic() < deadline:
            if self._stop.wait(0.05) or not self.elector.held():
                return
        head = self.bus.segment.global_id()
        if state.cursor is None or state.cursor > head:
            if state.cursor is not None:
                log.warning("shmbus push: cursor %d is past the bus (reset?); starting at %d", state.cursor, head)
            state.cursor = head
        epoch = self.bus.epoch
        log.info("shmbus push: %s sends from global id %d (term %d)", me, state.cursor, state.term)
        tracker = CursorTracker(state.cursor)
        sender = Sender(self.vapid, self.lane_options, self._count)
        with self._counts_lock:
            self._state, self._sender = state, sender
        self._gone.clear()
        self._save(state, tracker, sender)  # where this term starts, durably (a first start: the bus's head)
        self.leading = True
        version: Any = object()
        recipients = Recipients(())
        saved = 0.0
        try:
            while not self._stop.is_set() and self.elector.held():
                if self.bus.epoch != epoch:  # reset: every message of the new epoch is new
                    log.warning("shmbus push: the bus was reset; sending its new messages from the start")
                    epoch, tracker = self.bus.epoch, CursorTracker(0)
                v = self.store.version()
                if v != version:
                    version = v
                    recipients = Recipients(self.store.all(), self.bus, self.group_ids_for)
                    self._gone.clear()
                recipients.new_batch()
                self._read(tracker, recipients, sender)
                now = time.monotonic()
                if now - saved >= HEARTBEAT or (now - saved >= self.save_interval and self._changed(state, tracker)):
                    self._save(state, tracker, sender)
                    saved = now
                # idle: wake on the next message (the tap) or a heartbeat; busy: on settles, and save on time
                self._wake.wait(self.save_interval if tracker.in_flight or self._changed(state, tracker) else 1.0)
                self._wake.clear()
        except StaleSender:
            log.warning("shmbus push: %s lost its term to another sender; stopping", me)
            sender.stop()  # its pushes in flight finish; nothing more is saved
            return
        finally:
            self.leading = False
            if not sender.stopped:  # stopped, lost the election, or failed (the store): stop sending, then save
                left = sender.stop(grace=self._grace if self._stop.is_set() else 0.0)
                if left:
                    log.warning("shmbus push: %d push(es) left unsent for the next sender (above the cursor)", left)
                try:
                    self._save(state, tracker, sender)
                except Exception:  # StaleSender, or the store is down: the next sender starts from the last save
                    log.warning("shmbus push: %s could not save its last cursor", me, exc_info=True)

    def _changed(self, state: SenderState, tracker: CursorTracker) -> bool:
        """Anything to save since the last save (the cursor or a counter)?"""
        with self._counts_lock:
            return tracker.cursor != state.cursor or state.counters != self._saved_counters

    def _save(self, state: SenderState, tracker: CursorTracker, sender: Sender) -> None:
        with self._counts_lock:
            state.cursor = tracker.cursor
            state.queue_depth = sender.queue_depth()
            state.updated = time.time()
            self._saved_counters = dict(state.counters)
            snapshot = SenderState(state.cursor, state.term, dict(state.counters), state.queue_depth, state.leader,
                                   state.updated)  # fmt: skip
        self.store.save(snapshot)

    # ------------------------------------------------------------------ reading and dispatching
    def _read(self, tracker: CursorTracker, recipients: Recipients, sender: Sender) -> None:
        seg = self.bus.segment
        while tracker.in_flight < self.max_in_flight and not self._stop.is_set():
            start = tracker.read_upto
            msgs = self.bus.global_backlog(start)
            if not msgs:
                return
            first = msgs[0].global_id
            if start and first > start + 1 and not seg.sparse_ids:
                self._count("missed", first - start - 1)
                log.warning("shmbus push: %d message(s) after %d were gone before they were pushed", first - start - 1,
                            start)  # fmt: skip
            for msg in msgs:
                if tracker.in_flight >= self.max_in_flight or self._stop.is_set():
                    return
                self._dispatch(msg, tracker, recipients, sender)

    def _dispatch(self, msg: Message, tracker: CursorTracker, recipients: Recipients, sender: Sender) -> None:
        gid = msg.global_id
        try:
            if not self.pushes(msg.channel):
                tracker.skip(gid)
                return
            devices = [r for r in recipients.devices(msg) if r.endpoint not in self._gone]
        except Exception:  # the app's callables (channels, group_ids_for, a client filter), or undecodable data
            log.exception("shmbus push: cannot route global id %d on %r; not pushed", gid, msg.channel)
            self._count("unroutable")
            tracker.skip(gid)
            return
        if not devices:
            if msg.group_ids and not msg.user_ids and self.group_ids_for is None:
                self._count("unroutable")
            tracker.skip(gid)
            return
        try:
            if self.options_for is not None:
                opts = self.options_for(msg)
                data = message_options(msg, self.default_options)[1]
            else:
                opts, data = message_options(msg, self.default_options)
        except Exception as exc:  # malformed __push__ options, or options_for failed
            for reg in devices:
                self._report(gid, reg, Outcome.FAILED, f"bad push options: {exc}"[:200])
            self._count("failed", len(devices))
            tracker.skip(gid)
            return
        if opts is None:
            tracker.skip(gid)
            return
        payload, _fetch = payload_for(msg, data)
        tracker.open(gid, len(devices))
        for reg in devices:
            sender.submit(Job(reg, payload, opts, self._done, context=(gid, tracker)))

    def _done(self, job: Job, outcome: Outcome, why: str) -> None:
        gid, tracker = job.context
        self._count(outcome.value)
        if outcome is Outcome.EXPIRED:
            self._gone.add(job.reg.endpoint)
            try:
                self.store.remove(job.reg.endpoint)
            except Exception:  # removed at the next 404/410 instead
                log.exception("shmbus push: could not remove the expired subscription %s", job.reg.endpoint[:80])
        elif outcome is not Outcome.SENT:
            self._report(gid, job.reg, outcome, why)
        tracker.settle(gid)
        self._wake.set()

    def _report(self, gid: int, reg: Registration, outcome: Outcome, why: str) -> None:
        self.undelivered.append((gid, reg, outcome.value, why))
        log.warning("shmbus push: global id %d to %s…: %s (%s)", gid, reg.endpoint[:60], outcome.value, why)
        if self.on_undelivered is not None:
            try:
                self.on_undelivered(gid, reg, outcome.value, why)
            except Exception:  # the app's hook must not stop the sender
                log.exception("shmbus push: on_undelivered failed")

    @staticmethod
    def counter_names() -> tuple[str, ...]:
        return COUNTERS
