"""The bridge engine: what the bus calls (publish, the hooks, health), composed of the kit's objects and a
:class:`~.backend.Backend`. ``RedisBridge`` and ``PostgresBridge`` are this class with their backend and options."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shmbus.engines import BacklogGap, Engine, Envelope, RelayFigures
from shmbus.errors import EngineError
from shmbus.perprocess import Birth

from .backend import Acknowledged, Backend
from .election import RelayElection
from .landing import Landing
from .queue import PublishQueue
from .relay import Relay
from .status import BridgeStatus

if TYPE_CHECKING:
    from shmbus.bus import Backlog
    from shmbus.host import BusHost

__all__ = ["Batch", "BridgeEngine", "RelayOptions"]

GROUP = 1000  # envelopes per backend publish call (one round trip)


@dataclass(frozen=True, kw_only=True)
class RelayOptions:
    """The options every bridge takes for its relay and landing (documented on ``RedisBridge``). Built and read by
    name only: keyword-only and not a tuple, so nothing can unpack or build it by position."""

    relay: bool
    election_interval: float
    reconnect_max: float
    local_wait: float
    autostart: bool
    trim_interval: float = 0.0


class Batch:
    """What ``batch()`` yields: publishes inside the block are sent together on exit; ``ids`` then holds each one's
    message id (None for a queued one), in publish order (iterating the batch iterates ``ids``)."""

    def __init__(self, bus: BusHost | None) -> None:
        self.bus = bus
        self.envelopes: list[Envelope] = []
        self.ids: list[int | None] = []

    def __iter__(self) -> Iterator[int | None]:
        return iter(self.ids)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> int | None:
        return self.ids[i]


class BridgeEngine(Engine):
    """An engine whose backend assigns ids and holds the history every host copies (see the kit's modules).

    Holds: ``backend`` (:class:`~.backend.Backend`), ``status`` (:class:`~.status.BridgeStatus`, what it reports),
    and once attached ``election`` (:class:`~.election.RelayElection`), ``relay`` (:class:`~.relay.Relay`),
    ``landing`` (:class:`~.landing.Landing`), plus ``queue`` (:class:`~.queue.PublishQueue`) when asked for.
    """

    def __init__(
        self,
        backend: Backend,
        status: BridgeStatus,
        log: logging.Logger,
        options: RelayOptions,
        *,
        queue_in_memory: bool = False,
        max_in_memory_publish_backlog: int = 1000,
    ) -> None:
        self.backend = backend
        self.status = status
        self.log = log
        self.options = options
        self.may_relay = options.relay  #: this process may relay (``relay=False``: never, e.g. a cron script)
        self.queue_in_memory = queue_in_memory
        self.queue = PublishQueue(self._send_queued, max_in_memory_publish_backlog, log) if queue_in_memory else None
        self._bus: BusHost | None = None
        self._started = False
        self._closed = False
        self._birth = Birth()
        self._tls = threading.local()
        self.election: RelayElection | None = None
        self.relay: Relay | None = None  #: the election loop and relay of this process, once attached
        self.landing: Landing | None = None

    # ------------------------------------------------------------------ engine hooks
    def attached(self, bus: BusHost) -> None:
        if self._bus is not None and self._bus is not bus:
            raise ValueError(f"this {type(self).__name__} already serves {self._bus!r}; create one bridge per bus")
        self.backend.check(bus)
        self._bus = bus
        self._closed = False
        seg = bus.segment
        seg.mark_bridged(self.backend.record(), sparse_ids=self.backend.sparse_ids)
        self.election = RelayElection(seg.path)
        options = self.options
        self.landing = Landing(self.election, options.local_wait, self.log)
        self.relay = Relay(
            bus,
            self.backend,
            self.status,
            self.election,
            self.log,
            election_interval=options.election_interval,
            reconnect_max=options.reconnect_max,
            trim_interval=options.trim_interval,
            landing_wait=options.local_wait,
        )
        if options.autostart:
            self.start()

    def detached(self, bus: BusHost) -> None:
        if bus.default is not self:
            self.close()

    def after_fork(self, bus: BusHost) -> None:
        """In the child: the parent's threads are gone; its sockets and lock must be neither used nor released."""
        if self._birth.here:
            return
        self._birth.renew()
        self._tls = threading.local()
        self.backend.after_fork()
        self.status.after_fork()
        if self.election is not None:
            self.election.after_fork()
        if self.queue is not None:
            self.queue.after_fork()
        if self.relay is not None:
            self.relay.after_fork()
        started, self._started = self._started, False
        if started and not self._closed:
            self.start()

    def start(self) -> None:
        """Start this process's election thread (the relay runs in it while this process holds the lock)."""
        if self._started or not self.may_relay or self.relay is None:
            return
        self._started = True
        self.relay.start()

    def close(self) -> None:
        """Stop relaying and electing, release the relay lock, drop connections. Idempotent."""
        self._closed = True
        mine = self._birth.here
        if self.relay is not None:
            self.relay.close(join=mine)
        if self.queue is not None:
            self.queue.close()
        if self.election is not None:
            self.election.close()
        if mine:
            self.backend.close()
        self._started = False
        self.status.relay.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.backend.record().url!r})"

    # ------------------------------------------------------------------ publish
    def _bus_of(self, bus: BusHost | None) -> BusHost:
        b = bus or self._bus
        if b is None:
            raise RuntimeError(f"{type(self).__name__} is not attached to a bus")
        return b

    def publish(self, bus: BusHost, envelope: Envelope) -> int | None:
        """Store ``envelope`` in the backend (which assigns its ids), then on this host; its message id (None: it
        was queued, or collected by ``batch()``)."""
        if self._bus is None:
            self.attached(bus)
        batch: Batch | None = getattr(self._tls, "batch", None)
        if batch is not None:
            batch.bus = bus
            batch.envelopes.append(envelope)
            return None
        return self.publish_envelopes(bus, [envelope])[0]

    @contextlib.contextmanager
    def batch(self) -> Iterator[Batch]:
        """Collect every ``bus.publish`` this thread makes inside the block; on exit send them in calls of up to
        1000 (one round trip each)."""
        if getattr(self._tls, "batch", None) is not None:
            raise RuntimeError(f"{type(self).__name__}.batch() blocks do not nest")
        b = Batch(self._bus)
        self._tls.batch = b
        try:
            yield b
        finally:
            self._tls.batch = None
        if b.envelopes:
            b.ids = self.publish_envelopes(self._bus_of(b.bus), b.envelopes)

    def publish_many(self, bus: BusHost, items: Iterable[tuple[Any, ...]]) -> list[int | None]:
        """Publish ``(channel, data)`` or ``(channel, data, {publish kwargs})`` items, batched, in order."""
        with self.batch() as b:
            for item in items:
                bus.publish(item[0], item[1], **(item[2] if len(item) > 2 else {}), engine=self)
        return b.ids

    def publish_envelopes(self, bus: BusHost, envs: list[Envelope]) -> list[int | None]:
        """Send ``envs`` in order: sizes checked first (``PayloadTooLarge``, nothing sent), then the backend, then
        landed on this host. With a queue, what the backend refuses while down is queued (None)."""
        seg = bus.segment
        for env in envs:  # a message no segment can store must not be acknowledged and stored nowhere
            seg.check_fits(env.channel.encode(), (env.site_id or "").encode(), env.payload, env.meta)
        out: list[int | None] = []
        for i in range(0, len(envs), GROUP):
            chunk = envs[i : i + GROUP]
            if self.queue is not None and self.queue.offer_if_queueing(chunk):
                out.extend([None] * len(chunk))
                continue
            try:
                ack = self._backend_publish(bus, chunk)
            except EngineError:  # refused: nothing stored (PublishOutcomeUnknown is no EngineError: never queued)
                if self.queue is None:
                    raise
                self.queue.put(chunk)
                out.extend([None] * len(chunk))
                continue
            self._acknowledged(bus, chunk, ack)
            out.extend(m for _, m in ack.ids)
        return out

    def _backend_publish(self, bus: BusHost, chunk: list[Envelope]) -> Acknowledged:
        """The backend's publish, counted as a waiting call while it runs (``health()``'s ``stalled``). The start is
        stored and popped inline, with no function of ours between the store and the ``try``: see ``Calls``."""
        waiting, thread = self.status.calls.started, threading.get_ident()
        try:
            waiting[thread] = time.monotonic()
            ack = self.backend.publish(bus, chunk)  # (not ``return``: the code after the call stays in the try)
        finally:
            waiting.pop(thread, None)
        return ack

    def _acknowledged(self, bus: BusHost, chunk: list[Envelope], ack: Acknowledged) -> None:
        """What follows the backend's ack is bookkeeping: the message is stored and will reach every host, so a
        failure here (the segment's lock timing out, a closed segment) is logged, never raised: a caller told
        "failed" would publish it again."""
        self.status.published += len(ack.ids)
        self.status.set_state("ok")
        if self.landing is None:
            return
        try:
            self.landing.land(bus, [(e, g, m) for e, (g, m) in zip(chunk, ack.ids, strict=True)], ack.history)
        except Exception:
            self.log.exception(
                "shmbus %s bridge: published %d message(s) (newest id %d) but landing them here failed; the relay "
                "stores them",
                self.status.kind,
                len(ack.ids),
                ack.ids[-1][0] if ack.ids else 0,
            )

    def _send_queued(self, env: Envelope) -> None:
        bus = self._bus_of(None)
        self._acknowledged(bus, [env], self._backend_publish(bus, [env]))

    # ------------------------------------------------------------------ reads, health
    def backlog(self, bus: BusHost, gap: BacklogGap) -> Backlog | None:
        """Fill a gap in the segment's backlog from the backend (called by ``Bus.backlog``)."""
        return self.backend.fill_backlog(bus, gap)

    def relay_figures(self) -> RelayFigures:
        return self.status.figures()

    def health(self) -> dict[str, Any]:
        """This process's side of the bridge (``bus.health()`` includes it under ``engine_health``)."""
        out = {**self.backend.describe(), **self.status.health()}
        out["queued"] = len(self.queue) if self.queue is not None else 0
        out["dropped_from_queue"] = self.queue.dropped if self.queue is not None else 0
        return out
