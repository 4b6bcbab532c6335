"""Middleware options and routes: what a path under ``<base_route>message-bus/`` means."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from shmbus.bus import Bus
from shmbus.channels import RESERVED_PREFIX

from .wire import (
    CLIENT_ID_RE,
    INVALID_CLIENT_ID,
    MAX_BODY_SIZE,
    MAX_CHANNELS_PER_POLL,
    MAX_STREAM_BUFFER,
    ProtocolError,
)

_OPTION_NAMES: frozenset[str]


# ---------------------------------------------------------------------------------------------------- options
def bus_or_default(bus: Bus | None) -> Bus:
    """``bus``, or :func:`shmbus.default_bus` when None (the adapters' ``bus=None`` default)."""
    if bus is None:
        import shmbus

        bus = shmbus.default_bus()
    return bus


def normalize_base_route(route: str) -> str:
    """The gem's normalisation: leading and trailing ``/``, runs of ``/`` collapsed (``"a//b"`` -> ``/a/b/``)."""
    if not isinstance(route, str):
        raise TypeError(f"base_route must be a str, got {route!r}")
    return re.sub(r"/+", "/", f"/{route}/")


def presence_rule(value: Any) -> bool | tuple[str, ...]:
    """The ``presence`` option checked: a bool, or the channel prefixes it covers as a tuple."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) or not all(isinstance(p, str) for p in value):
        raise TypeError(f"presence must be a bool or a sequence of channel prefixes, got {value!r}")
    return tuple(value)


def presence_grace(value: Any) -> float:
    """The ``presence_grace`` option checked (seconds >= 0)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"presence_grace must be >= 0 seconds, got {value!r}")
    return float(value)


@dataclass
class Options:
    """Middleware options: the gem's names in snake_case, times in seconds.

    Lookups are plain callables receiving the WSGI environ or the ASGI scope (ASGI lookups may also be
    coroutine functions): ``user_id_lookup`` -> user id or None; ``group_ids_lookup`` -> iterable of group ids
    or None; ``site_id_lookup`` -> site id or None; ``is_admin_lookup`` (accepted, unused, as in the gem 4.x);
    ``extra_response_headers_lookup`` -> mapping or ``(name, value)`` pairs added to every poll/OPTIONS response
    (the way to emit CORS headers; ``set-cookie`` is dropped so polls never re-send session cookies);
    ``on_middleware_error(environ_or_scope, exc)`` -> a response ``(status, headers, body)`` or None (then a
    bad request gets its 4xx and any other exception propagates to the server).

    ``subscribe_allowed(info, channel)`` -> bool (:mod:`.subscribe`): may this request read ``channel``? Asked once
    per channel per poll, after the lookups, with their results in ``info`` (a :class:`~.subscribe.RequestInfo`);
    a refused channel is left out of the answer entirely (no message, backlog, last id or ``/__status``). None:
    every channel may be read (the gem's behaviour).
    """

    base_route: str = "/"
    long_polling_enabled: bool = True
    long_polling_interval: float = 25.0
    chunked_encoding_enabled: bool = True
    max_active_clients: int = 1000
    allow_broadcast: bool = False
    user_id_lookup: Callable[[Any], Any] | None = None
    group_ids_lookup: Callable[[Any], Any] | None = None
    site_id_lookup: Callable[[Any], Any] | None = None
    is_admin_lookup: Callable[[Any], Any] | None = None
    extra_response_headers_lookup: Callable[[Any], Any] | None = None
    on_middleware_error: Callable[[Any, BaseException], Any] | None = None
    subscribe_allowed: Callable[[Any, str], Any] | None = None
    #: Presence (docs/presence.md): True records every polled channel's clients, a sequence of prefixes those
    #: channels starting with one; False (the default) records nothing and costs nothing.
    presence: bool | tuple[str, ...] = False
    #: Seconds a client stays present after the long-polling interval that followed its last poll.
    presence_grace: float = 5.0
    max_body_size: int = MAX_BODY_SIZE
    max_channels_per_poll: int = MAX_CHANNELS_PER_POLL
    max_stream_buffer: int = MAX_STREAM_BUFFER
    #: ASGI only: seconds to wait for the rest of a request body once its head arrived (``408`` after). WSGI
    #: servers read bodies themselves; their own timeouts apply.
    body_timeout: float = 30.0
    #: Seconds live messages are gathered before they are handed to waiting clients (every shell):
    #: messages published within the window reach each client as one chunk, one write per client instead of one
    #: per message, which is what fan-out costs. Adds at most this much latency; 0 delivers each batch at once.
    #: The asyncio shells stretch it to the duration of the last dispatch (at most 10 windows) under fan-out load.
    batch_window: float = 0.002
    #: WSGI only: allow parking on a worker that serves one request at a time (gunicorn ``sync``, uwsgi without
    #: threads). Off by default: such workers answer long polls at once (as ``dlp=t``); see ``wsgi.py``.
    long_polling_on_sync_workers: bool = False
    #: Serve the browser client at ``<prefix>assets/message-bus.js`` and ``.../message-bus-ajax.js`` (see
    #: :mod:`shmbus.adapters.http.assets`).
    serve_assets: bool = True
    prefix: str = field(init=False, default="/message-bus/")

    def __post_init__(self) -> None:
        self.base_route = normalize_base_route(self.base_route)
        self.prefix = self.base_route + "message-bus/"
        if not self.long_polling_interval > 0:
            raise ValueError("long_polling_interval must be > 0 seconds")
        if (
            isinstance(self.batch_window, bool)
            or not isinstance(self.batch_window, (int, float))
            or not 0 <= self.batch_window <= 1
        ):
            raise ValueError(f"batch_window must be from 0 to 1 second, got {self.batch_window!r}")
        if (
            isinstance(self.body_timeout, bool)
            or not isinstance(self.body_timeout, (int, float))
            or not self.body_timeout > 0
        ):
            raise ValueError(f"body_timeout must be > 0 seconds, got {self.body_timeout!r}")
        self._check_presence()
        for name in ("max_active_clients", "max_body_size", "max_channels_per_poll", "max_stream_buffer"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be an int >= 0, got {v!r}")
        for name in (
            "user_id_lookup",
            "group_ids_lookup",
            "site_id_lookup",
            "is_admin_lookup",
            "extra_response_headers_lookup",
            "on_middleware_error",
            "subscribe_allowed",
        ):
            v = getattr(self, name)
            if v is not None and not callable(v):
                raise TypeError(f"{name} must be callable, got {v!r}")

    def _check_presence(self) -> None:
        self.presence = presence_rule(self.presence)
        self.presence_grace = presence_grace(self.presence_grace)

    def presence_of(self, channels: Iterable[str]) -> list[str]:
        """The channels of a poll that presence records (none when it is off)."""
        rule = self.presence
        if rule is True:
            return [ch for ch in channels if not ch.startswith(RESERVED_PREFIX)]  # never a view channel's own
        return [ch for ch in channels if ch.startswith(rule) and not ch.startswith(RESERVED_PREFIX)] if rule else []

    @classmethod
    def from_kwargs(cls, options: Mapping[str, Any]) -> Options:
        unknown = sorted(set(options) - _OPTION_NAMES)
        if unknown:
            raise TypeError(f"unknown message bus option(s) {unknown}; known: {sorted(_OPTION_NAMES)}")
        return cls(**options)


_OPTION_NAMES = frozenset(f.name for f in fields(Options) if f.init)


# ---------------------------------------------------------------------------------------------------- routing
#: What a path under the base route is: not ours (``app``), a CORS preflight, the broadcast route, a poll, or an
#: error to answer.
RouteKind = Literal["app", "options", "broadcast", "poll", "asset", "error"]


@dataclass
class Route:
    """What a request path means: ``kind`` is ``"app"`` (not ours), ``"options"``, ``"broadcast"``, ``"poll"``
    (with ``client_id``), ``"asset"`` (with ``asset``, the file name) or ``"error"`` (with ``error``)."""

    kind: RouteKind
    client_id: str = ""
    error: ProtocolError | None = None
    asset: str = ""


_APP = Route("app")


def match_route(method: str, path: str, options: Options) -> Route:
    prefix = options.prefix
    if not path.startswith(prefix):
        return _APP
    rest = path[len(prefix) :]
    if method == "OPTIONS":
        return Route("options")
    if rest == "broadcast":
        if options.allow_broadcast:
            return Route("broadcast")
        return Route("error", error=ProtocolError(404, "broadcast is disabled (allow_broadcast=False)"))
    cid, _, tail = rest.partition("/")
    if not cid:
        if not rest:
            return Route("error", error=ProtocolError(404, "not found"))
        return Route("error", error=ProtocolError(404, "missing client id"))
    if cid == "assets" and tail not in ("", "poll") and options.serve_assets:
        return Route("asset", asset=tail)  # "assets" stays a valid client id: its polls end in "" or "poll"
    if tail not in ("", "poll"):
        return Route("error", error=ProtocolError(404, "unknown message-bus route"))
    if not CLIENT_ID_RE.match(cid):
        return Route("error", error=ProtocolError(400, INVALID_CLIENT_ID))
    return Route("poll", client_id=cid)
