"""Prometheus metrics of a bus: host-wide figures from the segment, answered identically by any worker.

Three ways in, all built on :func:`families` (one list of metric families made from a
:func:`~shmbus.metrics.read_snapshot`):

* :class:`MetricsApp` — an ASGI app (or middleware: other paths go to the wrapped app) answering ``GET /metrics``
  in the Prometheus text format; :class:`MetricsWSGIApp` is the same for WSGI;
* :class:`BusCollector` — a ``prometheus_client`` collector, for apps that already expose a registry
  (``REGISTRY.register(BusCollector(bus))``; needs the ``[metrics]`` extra);
* :func:`render` — the text itself, for any other framework's route.

Names follow Prometheus conventions: a ``shmbus_`` prefix, units in the name (``_bytes``, ``_seconds``,
``_messages``), ``_total`` on counters; every sample has a ``bus`` label, and per-process figures a ``pid`` label.
Counters per pid restart with their worker (Prometheus' ``rate()`` handles that); the host totals also count
workers that have gone (the segment's retired totals), so they only ever grow until the bus is destroyed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shmbus.metrics import Snapshot, read_snapshot

from .asgi_support import Receive, Scope, Send, fallback, send_whole
from .wsgi_support import Environ, StartResponse, start_whole

if TYPE_CHECKING:
    from shmbus import Bus

__all__ = [
    "CONTENT_TYPE",
    "BusCollector",
    "Family",
    "FamilySource",
    "MetricsApp",
    "MetricsWSGIApp",
    "families",
    "render",
]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Labels = dict[str, str]


@dataclass
class Family:
    """One metric family: ``name`` (counters end in ``_total``), ``kind`` (``counter``/``gauge``), samples."""

    name: str
    kind: str
    help: str
    samples: list[tuple[Labels, float]] = field(default_factory=list)


def families(snap: Snapshot) -> list[Family]:
    """The figures of one snapshot as metric families (see the module doc for the conventions)."""
    bus = {"bus": snap.bus}
    live = [p for p in snap.processes if p.alive]

    def host(name: str, kind: str, help_: str, value: float) -> Family:
        return Family(name, kind, help_, [(dict(bus), float(value))])

    def per_pid(name: str, kind: str, help_: str, get: Callable[[Any], float], procs: Iterable[Any]) -> Family:
        return Family(name, kind, help_, [({**bus, "pid": str(p.pid)}, float(get(p))) for p in procs])

    relay = snap.relay
    out = [
        host(
            "shmbus_published_messages_total",
            "counter",
            "Messages published on this host (all processes, ever).",
            snap.total("publishes"),
        ),
        host(
            "shmbus_delivered_messages_total",
            "counter",
            "Messages handed to clients on this host (HTTP, SSE, WebSocket, guble).",
            snap.total("deliveries"),
        ),
        host(
            "shmbus_relayed_messages_total",
            "counter",
            "Messages a bridge's relay copied into the segment.",
            snap.total("relayed"),
        ),
        host(
            "shmbus_lost_messages_total",
            "counter",
            "Messages listeners report overwritten before they read them.",
            snap.total("lost"),
        ),
        host(
            "shmbus_relay_lost_messages_total",
            "counter",
            "Messages a bridge's relay found gone from the backend when catching up (never stored on this host).",
            snap.total("relay_lost"),
        ),
        per_pid(
            "shmbus_process_published_messages_total",
            "counter",
            "Messages published by one process.",
            lambda p: p.publishes,
            snap.processes,
        ),
        per_pid(
            "shmbus_process_delivered_messages_total",
            "counter",
            "Messages handed to clients by one process.",
            lambda p: p.deliveries,
            snap.processes,
        ),
        per_pid(
            "shmbus_process_lost_messages_total",
            "counter",
            "Messages one process's listener reports lost.",
            lambda p: p.lost,
            snap.processes,
        ),
        per_pid("shmbus_parked_polls", "gauge", "Long polls waiting in one process.", lambda p: p.parked, live),
        per_pid(
            "shmbus_open_streams",
            "gauge",
            "Open streams (chunked HTTP, SSE, WebSocket) in one process.",
            lambda p: p.streams,
            live,
        ),
        per_pid(
            "shmbus_listener_lag_messages",
            "gauge",
            "Messages published but not yet read by a process's listener.",
            lambda p: max(snap.global_id - p.listener_gid, 0) if p.listener_gid else 0,
            live,
        ),
        host("shmbus_processes", "gauge", "Processes attached to the bus.", len(live)),
        host("shmbus_ring_size_bytes", "gauge", "Size of the shared-memory ring.", snap.ring_size),
        host("shmbus_ring_used_bytes", "gauge", "Bytes of the ring holding readable messages.", snap.ring_used),
        host(
            "shmbus_ring_history_seconds", "gauge", "Age of the oldest message still in the ring.", snap.history_seconds
        ),
        host("shmbus_channels", "gauge", "Channels in the channel table.", snap.channels),
        host("shmbus_channels_max", "gauge", "Capacity of the channel table.", snap.max_channels),
        host("shmbus_global_id", "gauge", "The newest global id.", snap.global_id),
        host("shmbus_oldest_global_id", "gauge", "The oldest global id still readable.", snap.oldest_global_id),
        host(
            "shmbus_relay_up",
            "gauge",
            "1 while a process relays for a bridge engine and is relaying.",
            1 if relay is not None and relay.relay_state == "relaying" else 0,
        ),
        host(
            "shmbus_relay_lag_messages",
            "gauge",
            "Messages in the backend (its newest id as the relay knows it) not yet in the segment.",
            snap.relay_lag,
        ),
    ]
    return out


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    return str(int(value)) if value == int(value) and abs(value) < 1 << 53 else repr(float(value))


#: Extra figures beside the bus's own: a callable returning metric families, e.g. ``PushConnector.metric_families``.
FamilySource = Callable[[], list[Family]]


def _all_families(bus: Bus, extra: Iterable[FamilySource]) -> list[Family]:
    out = families(read_snapshot(bus, channels=False))
    for source in extra:
        out.extend(source())
    return out


def render(bus: Bus, extra: Iterable[FamilySource] = ()) -> str:
    """The Prometheus text exposition (format 0.0.4) of ``bus``'s host-wide figures, plus those of ``extra``."""
    lines: list[str] = []
    for fam in _all_families(bus, extra):
        lines.append(f"# HELP {fam.name} {fam.help}")
        lines.append(f"# TYPE {fam.name} {fam.kind}")
        for labels, value in fam.samples:
            body = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            lines.append(f"{fam.name}{{{body}}} {_number(value)}")
    return "\n".join(lines) + "\n"


class BusCollector:
    """A ``prometheus_client`` collector of ``bus``'s figures (``REGISTRY.register(BusCollector(bus))``), plus
    those of ``extra`` (e.g. ``[connector.metric_families]`` for Web Push)."""

    def __init__(self, bus: Bus, extra: Iterable[FamilySource] = ()) -> None:
        self.bus = bus
        self.extra = list(extra)

    def describe(self) -> list[Any]:
        return []  # figures are read at scrape time; nothing to check at registration

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        for fam in _all_families(self.bus, self.extra):
            names = list(fam.samples[0][0]) if fam.samples else ["bus"]
            if fam.kind == "counter":
                out: Any = CounterMetricFamily(fam.name.removesuffix("_total"), fam.help, labels=names)
            else:
                out = GaugeMetricFamily(fam.name, fam.help, labels=names)
            for labels, value in fam.samples:
                out.add_metric([labels[n] for n in names], value)
            yield out


class _MetricsEndpoint:
    """Both shells' options and their answer to a request for ``path`` (sans-IO)."""

    def __init__(
        self,
        app: Callable[..., Any] | None = None,
        *,
        bus: Bus,
        path: str = "/metrics",
        allow: Callable[[Any], bool] | None = None,
        extra: Iterable[FamilySource] = (),
    ) -> None:
        self.app = app
        self.bus = bus
        self.path = path
        self.allow = allow
        self.extra = list(extra)

    def refusal(self, method: str | None, request: Any) -> tuple[int, bytes] | None:
        """Why not to answer (status, text) — not a GET, or ``allow(request)`` said no — else None."""
        if method not in ("GET", "HEAD"):
            return 405, b"GET only\n"
        if self.allow is not None and not self.allow(request):
            return 403, b"forbidden\n"
        return None

    def render(self) -> bytes:
        return render(self.bus, self.extra).encode()


class MetricsApp(_MetricsEndpoint):
    """ASGI: ``GET {path}`` answers the metrics; other requests go to ``app`` (404 without one).

    Protect it like any internal endpoint (a network policy, or ``allow(scope) -> bool``: refused with 403).
    ``extra``: more metric families, each a callable read at scrape time (``[connector.metric_families]``).
    """

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") != self.path:
            await fallback(self.app, scope, receive, send)
            return
        refused = self.refusal(scope.get("method"), scope)
        if refused is not None:
            status, body, content_type = *refused, "text/plain"
        else:
            # in a thread: a scrape reads the segment's stats under its lock, which must never stall the event loop
            status, body, content_type = 200, await asyncio.to_thread(self.render), CONTENT_TYPE
        await send_whole(send, status, [("content-type", content_type), *_NO_STORE], body)


class MetricsWSGIApp(_MetricsEndpoint):
    """WSGI twin of :class:`MetricsApp` (``allow(environ) -> bool``)."""

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != self.path:
            if self.app is not None:
                result: Iterable[bytes] = self.app(environ, start_response)
                return result
            return start_whole(start_response, 404, [("content-type", "text/plain"), *_NO_STORE], b"not found\n")
        refused = self.refusal(environ.get("REQUEST_METHOD"), environ)
        if refused is not None:
            return start_whole(start_response, refused[0], [("content-type", "text/plain"), *_NO_STORE], refused[1])
        return start_whole(start_response, 200, [("content-type", CONTENT_TYPE), *_NO_STORE], self.render())


_NO_STORE = [("cache-control", "no-store")]
