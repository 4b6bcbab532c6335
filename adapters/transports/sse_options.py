"""The two SSE apps' options, defined once: :class:`SSEKeywords` types their constructors' keywords (mypy checks
each one through ``Unpack``), :class:`SSEOptions` holds them with their defaults and checks them (an unknown
keyword is a ``TypeError``, as in any signature). :class:`~.sse.SSEApp` (ASGI) and
:class:`~.sse_wsgi.SSEWSGIApp` (WSGI, which adds ``max_streams`` and ``allow_sync_workers``) take the same
keywords with the same meaning, so they are written here, not in two signatures."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shmbus.bus import Bus

from .connection import Connection, check_hooks
from .identity import LookupKeywords, LookupOptions
from .sink import DEFAULT_MAX_BUFFER
from .sse_stream import check_keepalive
from .validation import MAX_SUBSCRIPTIONS

__all__ = ["SSEKeywords", "SSEOptions", "SSEWSGIKeywords", "SSEWSGIOptions"]

Hook = Callable[[Connection], Any]


class SSEKeywords(LookupKeywords, total=False):
    """The keywords of both SSE apps (defaults and meaning: :class:`SSEOptions`)."""

    bus: Bus | None
    path: str
    keepalive_interval: float
    max_buffer: int
    max_subscriptions: int
    retry_ms: int | None
    on_open: Hook | None
    on_close: Hook | None


class SSEWSGIKeywords(SSEKeywords, total=False):
    """:class:`SSEKeywords` plus the WSGI app's capacity options."""

    max_streams: int
    allow_sync_workers: bool


@dataclass
class SSEOptions(LookupOptions):
    """An SSE app's options: the lookups (:class:`LookupOptions`), the bus (None: :func:`shmbus.default_bus`), the
    route, the keepalive period in seconds (it also bounds how late a bus reset with no new message is noticed),
    the per-client buffer and subscription limits, the ``retry:`` hint sent to the browser and the hooks."""

    bus: Bus | None = None
    path: str = "/sse"
    keepalive_interval: float = 15.0
    max_buffer: int = DEFAULT_MAX_BUFFER
    max_subscriptions: int = MAX_SUBSCRIPTIONS
    retry_ms: int | None = 2000
    on_open: Hook | None = None
    on_close: Hook | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check_keepalive(self.keepalive_interval)
        check_hooks(self.on_open, self.on_close)


@dataclass
class SSEWSGIOptions(SSEOptions):
    """:class:`SSEOptions` plus ``max_streams`` (streams per process) and ``allow_sync_workers`` (serve streams on
    a worker that handles one request at a time)."""

    max_streams: int = 1000
    allow_sync_workers: bool = False
