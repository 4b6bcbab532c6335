"""Hosts of a fault scenario, and the ledger of what was acknowledged.

A host is a bus name (its own segment) bridged to the shared backend. Its processes: this test process holds the
host's bus with an engine that never relays (``relay=False``): it publishes, and its catch-all subscription is the
host's live subscriber; 1..n child processes (``faults_node.py relay``) hold the same bus with a relaying engine
and elect the host's relay, so a scenario can SIGKILL or SIGSTOP the relay without touching the subscriber.

The :class:`Ledger` records every publish: acknowledged ones (an id came back) with the backend's history
generation at its start and end (a wipe bumps it: messages of an older history may be lost with a reset), and the
payloads of every attempt (a publish that raised may still have been stored; delivering it is no injection).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shmbus import Bus, PublishOutcomeUnknown
from shmbus.segment import Segment
from tests.harness.procs import ProcessTracker, kill_tree
from tests.harness.wait import wait_for

from .faults_backends import Backend

__all__ = ["Ack", "Cluster", "Host", "Ledger"]

NODE = Path(__file__).with_name("faults_node.py")
CHANNELS = ("/c0", "/c1", "/c2")
SENTINEL = "/sentinel"


@dataclass
class Ack:
    host: str
    channel: str
    payload: str
    mid: int
    gen_lo: int  # the history generation when the publish started ...
    gen_hi: int  # ... and when it returned


@dataclass
class Ledger:
    acks: list[Ack] = field(default_factory=list)
    tried: set[str] = field(default_factory=set)
    errors: dict[str, int] = field(default_factory=dict)
    refused: set[str] = field(default_factory=set)  # raised a definite error: must never be delivered
    unknown: set[str] = field(default_factory=set)  # raised PublishOutcomeUnknown: may or may not be delivered
    gen: int = 0  # even: a history; odd: a wipe in progress
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def wipes(self) -> int:
        return (self.gen + 1) // 2

    @contextlib.contextmanager
    def history_change(self) -> Iterator[None]:
        """Wrap what replaces the backend's history (FLUSHDB, TRUNCATE, a Redis crash): resets are justified."""
        with self.lock:
            self.gen += 1
        try:
            yield
        finally:
            with self.lock:
                self.gen += 1

    def attempt(self, payload: str) -> int:
        with self.lock:
            self.tried.add(payload)
            return self.gen

    def acked(self, host: str, channel: str, payload: str, mid: int, gen_lo: int) -> None:
        with self.lock:
            self.acks.append(Ack(host, channel, payload, mid, gen_lo, self.gen))

    def failed(self, exc: BaseException, payload: str | None = None) -> None:
        """A publish that raised: ``PublishOutcomeUnknown`` may have stored it, any other error must not have."""
        with self.lock:
            name = type(exc).__name__
            self.errors[name] = self.errors.get(name, 0) + 1
            if payload is not None:
                (self.unknown if isinstance(exc, PublishOutcomeUnknown) else self.refused).add(payload)


class Host:
    """One host: a bus name with its relay processes and this process's subscriber/publisher (see module doc)."""

    def __init__(
        self,
        cluster: Cluster,
        label: str,
        *,
        relays: int,
        bus_options: dict[str, Any],
        engine_options: dict[str, Any] | None = None,
    ) -> None:
        self.cluster = cluster
        self.engine_options = engine_options or {}
        self.label = label
        self.name = f"{cluster.bus_name}{label}"
        # roomy by default: only the scenarios about trimming make hosts trim (they pass smaller limits)
        self.bus_options = {"max_backlog_size": 5000, "max_global_backlog_size": 15000, **bus_options}
        self.received: list[tuple[int, str, int, int, Any]] = []  # (epoch, channel, id, global id, data)
        self.epochs: list[int] = []
        self.children: list[subprocess.Popen[str]] = []
        self.lines: list[tuple[str, int]] = []
        self._cond = threading.Condition()
        self._seq = itertools.count()
        self._last: tuple[int, int] = (0, 0)  # (epoch, global id) of the newest delivery
        self.bus: Bus | None = None
        self.born = len(cluster.ledger.acks)  # what was acknowledged before the host existed is not owed to it
        self.up(relays)

    # ------------------------------------------------------------------ processes
    def up(self, relays: int = 1) -> None:
        """Start the host (again): relay processes, then this process's bus and subscriber."""
        self.spawn_relays(relays)
        bus = Bus(
            self.name,
            keepalive_interval=0,
            engine=self.cluster.backend.engine(relay=False, **self.engine_options),
            create=True,
            **self.bus_options,
        )
        self.note_epoch(bus.epoch)
        epoch, gid = self._last
        # a client that comes back asks for what followed the last message it saw (all of it after a reset)
        last_id = gid if self.received and epoch == bus.epoch else 0
        self.bus = bus
        bus.subscribe(None, self._on_message, last_id=last_id)
        self.wait_relaying()

    def down(self) -> None:
        """Every process of the host exits (a deploy): relays are killed, this process's bus is closed."""
        for proc in self.children:
            kill_tree(proc, 2.0)
        self.children = []
        if self.bus is not None:
            bus, self.bus = self.bus, None
            bus.close()

    def spawn_relays(self, count: int) -> None:
        spec = {"bus": self.name, "backend": self.cluster.backend.spec(), "bus_options": self.bus_options}
        for _ in range(count):
            proc = self.cluster.procs.spawn(
                [sys.executable, str(NODE), json.dumps(spec), "relay"], stdout=subprocess.PIPE, text=True
            )
            self.children.append(proc)
            threading.Thread(target=self._follow, args=(proc,), daemon=True).start()

    def _follow(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            parts = line.split()
            if len(parts) == 2 and parts[1].isdigit():
                with self._cond:
                    self.lines.append((parts[0], int(parts[1])))
                    self._cond.notify_all()

    def relay_pid(self, timeout: float = 30.0) -> int:
        """The pid of the host's relay process (the newest RELAY line from a child still running)."""
        alive = {p.pid for p in self.children if p.poll() is None}

        def current() -> int | None:
            for tag, pid in reversed(self.lines):
                if tag == "RELAY" and pid in alive:
                    return pid
            return None

        with self._cond:
            if not self._cond.wait_for(lambda: current() is not None, timeout):
                raise AssertionError(f"host {self.label}: no relay within {timeout}s (lines {self.lines})")
            pid = current()
            assert pid is not None
            return pid

    def wait_relaying(self, timeout: float = 30.0) -> None:
        if self.children:
            self.relay_pid(timeout)

    def relays_seen(self) -> int:
        with self._cond:
            return sum(1 for tag, _ in self.lines if tag == "RELAY")

    # ------------------------------------------------------------------ subscriber
    def _on_message(self, msg: Any) -> None:
        self.received.append((msg.epoch, msg.channel, msg.message_id, msg.global_id, msg.data))
        self._last = (msg.epoch, msg.global_id)
        self.note_epoch(msg.epoch)

    def note_epoch(self, epoch: int) -> None:
        if not self.epochs or self.epochs[-1] != epoch:
            self.epochs.append(epoch)

    @property
    def resets(self) -> int:
        return max(len(self.epochs) - 1, 0)

    def payloads(self) -> set[Any]:
        return {r[4] for r in self.received}

    # ------------------------------------------------------------------ publisher
    def publish(self, channel: str, payload: str | None = None) -> int | None:
        """Publish one message through this host; the ledger learns whether it was acknowledged."""
        if payload is None:
            payload = f"{self.label}:{next(self._seq)}"
        ledger = self.cluster.ledger
        gen_lo = ledger.attempt(payload)
        assert self.bus is not None
        try:
            mid = self.bus.publish(channel, payload)
        except Exception as exc:  # refused, unreachable, timed out: not acknowledged
            ledger.failed(exc, payload)
            return None
        if mid is None:
            return None
        ledger.acked(self.label, channel, payload, mid, gen_lo)
        return mid


class Cluster:
    """The hosts of one scenario on one backend, the ledger, and the load they publish."""

    def __init__(self, backend: Backend, bus_name: str, procs: ProcessTracker) -> None:
        self.backend = backend
        self.bus_name = bus_name
        self.procs = procs
        self.ledger = Ledger()
        self.hosts: list[Host] = []
        self._stop_poll = threading.Event()
        self._poller = threading.Thread(target=self._poll_epochs, daemon=True)
        self._poller.start()

    def host(
        self, label: str, *, relays: int = 1, engine_options: dict[str, Any] | None = None, **bus_options: Any
    ) -> Host:
        h = Host(self, label, relays=relays, bus_options=bus_options, engine_options=engine_options)
        self.hosts.append(h)
        return h

    def _poll_epochs(self) -> None:
        """A reset between two deliveries is still a reset: every host's epoch, every 10 ms."""
        while not self._stop_poll.wait(0.01):
            for h in list(self.hosts):
                bus = h.bus
                if bus is not None:
                    with contextlib.suppress(Exception):  # closed under us
                        h.note_epoch(bus.epoch)

    @contextlib.contextmanager
    def load(self, *hosts: Host, interval: float = 0.002, channels: tuple[str, ...] = CHANNELS) -> Iterator[None]:
        """Each of ``hosts`` publishes round-robin on ``channels`` (one thread each) until the block ends."""
        stop = threading.Event()

        def run(h: Host) -> None:
            for ch in itertools.cycle(channels):
                if stop.is_set():
                    return
                h.publish(ch)
                if interval:
                    time.sleep(interval)

        threads = [threading.Thread(target=run, args=(h,), daemon=True) for h in hosts]
        for t in threads:
            t.start()
        try:
            yield
        finally:
            stop.set()
            for t in threads:
                t.join(60)

    def publish_many(self, h: Host, count: int, channels: tuple[str, ...] = CHANNELS) -> None:
        for i in range(count):
            h.publish(channels[i % len(channels)])

    def wait_for_acks(self, count: int, timeout: float = 60.0) -> None:
        start = len(self.ledger.acks)
        wait_for(lambda: len(self.ledger.acks) >= start + count, timeout, f"{count} more acknowledged publishes")

    def settle(self, timeout: float = 40.0) -> None:
        """Every live host publishes a sentinel after everything else; wait until every host has seen every
        sentinel (relays deliver in order, so each host has then stored or skipped all that came before), and
        let the figures reach the segments (flushed at least once a second)."""
        live = [h for h in self.hosts if h.bus is not None]
        sentinels = []
        for h in live:
            for _ in range(50):
                payload = f"{h.label}:sentinel:{len(sentinels)}"
                if h.publish(SENTINEL, payload) is not None:
                    sentinels.append(payload)
                    break
                time.sleep(0.2)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not all(set(sentinels) <= h.payloads() for h in live):
            time.sleep(0.05)
        time.sleep(1.2)

    def close(self) -> None:
        self._stop_poll.set()
        self._poller.join(5)
        for h in self.hosts:
            h.down()
        for h in self.hosts:
            Segment.destroy_by_name(h.name)


def until(pred: Callable[[], Any], timeout: float, what: str) -> Any:
    """:func:`harness.wait.wait_for` (re-exported for scenarios)."""
    return wait_for(pred, timeout, what)
