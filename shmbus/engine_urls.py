"""Bridge engines by URL: a table the engines' packages fill, so the core builds one without importing them.

A process that attaches a bridged bus and was given no engine (a cron job, ``shmbus publish``) builds the
workers' engine from a URL (``SHMBUS_ENGINE_URL`` or the segment's record). The core must not import
``shmbus.adapters``, so a bridge *registers* its kind here (:func:`register_engine_kind`, called when its package
is imported). A kind nobody registered yet is looked up among the installed packages' ``shmbus.engines`` entry
points (:mod:`shmbus.providers`): importing the module one names registers the kind. A third-party engine
registers itself the same way and declares its module in its own entry points.

A bridge's package stays light (its client library is imported only when a bridge is built or named):
:func:`lazy_engine` is the factory it registers, :func:`lazy_attributes` its module ``__getattr__``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Collection, Mapping
from typing import Any, NamedTuple

from .engines import Engine
from .providers import ENGINES, provided, provider

__all__ = [
    "EngineFactory",
    "engine_from_url",
    "lazy_attributes",
    "lazy_engine",
    "register_engine_kind",
]

#: ``factory(url, relay, options)``: the engine for ``url`` (``options``: the segment's recorded options).
EngineFactory = Callable[[str, bool, Mapping[str, str]], Engine]


class _Kind(NamedTuple):
    schemes: tuple[str, ...]
    factory: EngineFactory


_kinds: dict[str, _Kind] = {}


def register_engine_kind(kind: str, schemes: tuple[str, ...], factory: EngineFactory) -> None:
    """Make ``engine_from_url`` build ``kind`` engines (for URLs with one of ``schemes``) with ``factory``."""
    _kinds[kind] = _Kind(tuple(s.lower() for s in schemes), factory)


def lazy_engine(module: str, engine_class: str, channel_option: str) -> EngineFactory:
    """A factory that imports ``module`` only when it builds its ``engine_class``, passing on the recorded
    ``channel_option`` (the bridge's notify or pub/sub channel keyword)."""

    def factory(url: str, relay: bool, options: Mapping[str, str]) -> Engine:
        build = getattr(importlib.import_module(module), engine_class)
        engine: Engine = build(url, relay=relay, **{channel_option: options.get(channel_option)})
        return engine

    return factory


def lazy_attributes(package: str, module: str, names: Collection[str]) -> Callable[[str], Any]:
    """A package's module ``__getattr__`` that imports ``module`` the first time one of ``names`` is asked for
    (so importing the package, e.g. to register its kind, does not import the client library)."""

    def __getattr__(name: str) -> Any:
        if name in names:
            return getattr(importlib.import_module(module), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__


def _kind(kind: str) -> _Kind | None:
    if kind not in _kinds and kind in provided(ENGINES):
        provider(ENGINES, kind)  # importing it registers the kind (an ImportError names what is missing)
    return _kinds.get(kind)


def _kind_of(scheme: str) -> str | None:
    """The kind whose schemes include ``scheme``: the registered kinds first, then the providers not loaded yet (one
    that cannot be imported is skipped: it cannot be the one)."""
    for name, kind in list(_kinds.items()):
        if scheme in kind.schemes:
            return name
    for name in sorted(provided(ENGINES).keys() - _kinds.keys()):
        try:
            found = _kind(name)
        except ImportError:
            continue
        if found is not None and scheme in found.schemes:
            return name
    return None


def engine_from_url(
    url: str, *, kind: str | None = None, options: Mapping[str, str] | None = None, relay: bool = False
) -> Engine:
    """A bridge engine for a backend URL (``redis://``, ``rediss://``, ``unix://``: Redis; ``postgres://``,
    ``postgresql://`` or a libpq ``key=value`` string: PostgreSQL; ``nats://``: NATS JetStream; or any engine a
    package provides), as a process attaching a bridged bus builds
    it. ``kind``: the segment's recorded kind (else the URL's scheme decides); ``options``: the recorded options
    (the notify or pub/sub channel). ``relay=False``: the process publishes through it and leaves relaying to the
    host's workers. ``ValueError`` for a URL no registered kind takes."""
    scheme = url.split(":", 1)[0].lower() if "://" in url else ""
    if kind is None and "=" in url and not scheme:
        kind = "postgres"  # a libpq key=value string
    if kind is None and scheme:
        kind = _kind_of(scheme)
    found = _kind(kind) if kind is not None else None
    if found is None:
        known = ", ".join(sorted(f"{s}://" for k in _kinds.values() for s in k.schemes))
        raise ValueError(f"no bridge engine for URL scheme {scheme!r} (installed: {known})")
    return found.factory(url, relay, dict(options or {}))
