"""The ``SHMBUS = {...}`` setting, read and checked once: what bus, which engine, which middleware options.

Keys (all upper case, as in ``DATABASES``; unknown keys are refused so a typo never goes unnoticed):

``BUS`` (required)            the bus every worker attaches to (made at the first start: ``Bus(name, create=True)``)
``BUS_OPTIONS``               other :class:`shmbus.Bus` options (``ring_size``, ``path``, ``codec``, ``mode``, ...)
``ENGINE``                    ``None`` (one host), or a bridge URL: ``redis://``/``rediss://`` (RedisBridge) or
                              ``postgres://``/``postgresql://`` (PostgresBridge)
``ENGINE_OPTIONS``            keyword arguments of that bridge
``MIDDLEWARE``                options of the message_bus middleware (``base_route``, ``long_polling_interval``, ...)
``USER_ID_LOOKUP``,           dotted paths of functions taking the Django ``HttpRequest`` (its ``session`` and
``GROUP_IDS_LOOKUP``,         ``user`` set from the session cookie); defaults: the authenticated user's ``pk``,
``SITE_ID_LOOKUP``,           that user's group ids; ``None`` turns one off
``EXTRA_RESPONSE_HEADERS_LOOKUP``, ``ON_MIDDLEWARE_ERROR`` (``(request, exc)``)
``SUBSCRIBE_ALLOWED``         dotted path of the permission function ``fn(info, channel) -> bool``: may this request
                              read ``channel``? ``info`` is the middleware's ``RequestInfo`` with the Django
                              ``HttpRequest`` as ``info.request``; default ``None``: every channel may be read
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

__all__ = ["DEFAULT_LOOKUPS", "ENGINE_SCHEMES", "LOOKUP_KEYS", "BusSettings", "SettingError", "read_settings"]

#: Setting keys naming a lookup, and the middleware option each one becomes.
LOOKUP_KEYS: dict[str, str] = {
    "USER_ID_LOOKUP": "user_id_lookup",
    "GROUP_IDS_LOOKUP": "group_ids_lookup",
    "SITE_ID_LOOKUP": "site_id_lookup",
    "EXTRA_RESPONSE_HEADERS_LOOKUP": "extra_response_headers_lookup",
    "ON_MIDDLEWARE_ERROR": "on_middleware_error",
    "SUBSCRIBE_ALLOWED": "subscribe_allowed",
}
_PKG = "shmbus.adapters.integrations.django.lookups"
#: What an absent lookup key means (an explicit ``None`` turns the lookup off).
DEFAULT_LOOKUPS: dict[str, str | None] = {
    "USER_ID_LOOKUP": f"{_PKG}.authenticated_user_pk",
    "GROUP_IDS_LOOKUP": f"{_PKG}.user_group_ids",
}
#: URL scheme -> (the bridge's dotted path, the extra that installs its client library, that library).
ENGINE_SCHEMES: dict[str, tuple[str, str, str]] = {
    "redis": ("shmbus.adapters.redis.RedisBridge", "redis", "redis"),
    "rediss": ("shmbus.adapters.redis.RedisBridge", "redis", "redis"),
    "postgres": ("shmbus.adapters.postgres.PostgresBridge", "postgres", "psycopg"),
    "postgresql": ("shmbus.adapters.postgres.PostgresBridge", "postgres", "psycopg"),
}
_KEYS = frozenset({"BUS", "BUS_OPTIONS", "ENGINE", "ENGINE_OPTIONS", "MIDDLEWARE", *LOOKUP_KEYS})
#: Middleware options that the lookup keys set (refused inside ``MIDDLEWARE``: one place for each).
_LOOKUP_OPTIONS = frozenset({*LOOKUP_KEYS.values(), "is_admin_lookup"})


class SettingError(ValueError):
    """``settings.SHMBUS`` is missing or wrong; ``check_id`` names the system check that reports it."""

    def __init__(self, message: str, check_id: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.check_id = check_id
        self.hint = hint


@dataclass(frozen=True)
class BusSettings:
    """``settings.SHMBUS`` once read: plain values, lookups still dotted paths (imported by :meth:`lookup`)."""

    bus: str
    bus_options: dict[str, Any] = field(default_factory=dict)
    engine: str | None = None
    engine_options: dict[str, Any] = field(default_factory=dict)
    middleware: dict[str, Any] = field(default_factory=dict)
    lookups: dict[str, str | None] = field(default_factory=dict)

    @property
    def engine_scheme(self) -> str | None:
        return urlsplit(self.engine).scheme.lower() if self.engine else None

    def lookup(self, key: str) -> Callable[..., Any] | None:
        """The function a lookup key names (``ImportError`` if the path does not import)."""
        from django.utils.module_loading import import_string

        path = self.lookups.get(key)
        if path is None:
            return None
        fn = import_string(path)
        if not callable(fn):
            raise ImportError(f"{path} is not callable")
        return fn  # type: ignore[no-any-return]

    def make_engine(self) -> Any:
        """A new bridge for ``ENGINE`` (None without one)."""
        if not self.engine:
            return None
        from django.utils.module_loading import import_string

        bridge_path = ENGINE_SCHEMES[self.engine_scheme or ""][0]
        return import_string(bridge_path)(self.engine, **self.engine_options)


def _mapping(raw: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = raw.get(key) or {}
    if not isinstance(value, Mapping):
        raise SettingError(f"SHMBUS[{key!r}] must be a dict, got {type(value).__name__}", "shmbus.E001")
    return dict(value)


def read_settings(raw: Any) -> BusSettings:
    """Read ``settings.SHMBUS`` (``raw``); :class:`SettingError` says what is wrong with it."""
    if raw is None:
        raise SettingError(
            "settings.SHMBUS is not set",
            "shmbus.E001",
            hint="add SHMBUS = {'BUS': 'myapp'} to your settings (docs/django.md)",
        )
    if not isinstance(raw, Mapping):
        raise SettingError(f"settings.SHMBUS must be a dict, got {type(raw).__name__}", "shmbus.E001")
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        raise SettingError(
            f"unknown key(s) in settings.SHMBUS: {unknown}", "shmbus.E001", hint=f"known keys: {sorted(_KEYS)}"
        )
    bus = raw.get("BUS")
    if not isinstance(bus, str) or not bus:
        raise SettingError(f"SHMBUS['BUS'] must name the bus, got {bus!r}", "shmbus.E002")
    bus_options = _mapping(raw, "BUS_OPTIONS")
    for key in ("name", "engine"):
        if key in bus_options:
            raise SettingError(
                f"SHMBUS['BUS_OPTIONS'] may not contain {key!r}",
                "shmbus.E001",
                hint="the bus name is SHMBUS['BUS'] and the engine SHMBUS['ENGINE']",
            )
    engine = raw.get("ENGINE")
    if engine is not None:
        scheme = urlsplit(engine).scheme.lower() if isinstance(engine, str) else ""
        if scheme not in ENGINE_SCHEMES:
            raise SettingError(
                f"SHMBUS['ENGINE'] must be None or a redis://, rediss://, postgres:// or postgresql:// URL, "
                f"got {engine!r}",
                "shmbus.E003",
            )
    middleware = _mapping(raw, "MIDDLEWARE")
    misplaced = sorted(set(middleware) & _LOOKUP_OPTIONS)
    if misplaced:
        raise SettingError(
            f"lookups go in their own keys of SHMBUS, not in SHMBUS['MIDDLEWARE']: {misplaced}",
            "shmbus.E001",
            hint="e.g. 'USER_ID_LOOKUP': 'myapp.bus.user_id' (a dotted path to a function of the request)",
        )
    if middleware.get("allow_broadcast"):
        raise SettingError(
            "SHMBUS['MIDDLEWARE']['allow_broadcast'] is refused under Django: the broadcast route publishes what "
            "any browser POSTs, and the message_bus routes are served without CsrfViewMiddleware",
            "shmbus.E005",
            hint="publish from a view (bus.publish or publish_on_commit), where CSRF and permissions apply",
        )
    lookups: dict[str, str | None] = {}
    for key in LOOKUP_KEYS:
        path = raw.get(key, DEFAULT_LOOKUPS.get(key))
        if path is not None and not isinstance(path, str):
            raise SettingError(f"SHMBUS[{key!r}] must be a dotted path or None, got {path!r}", "shmbus.E004")
        lookups[key] = path
    return BusSettings(
        bus=bus,
        bus_options=bus_options,
        engine=engine,
        engine_options=_mapping(raw, "ENGINE_OPTIONS"),
        middleware=middleware,
        lookups=lookups,
    )
