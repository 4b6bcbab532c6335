"""System checks for ``settings.SHMBUS``: ``manage.py check`` reports them, and so does every server start
(:func:`startup_checks`, called by the WSGI and ASGI entry points, since gunicorn and uvicorn run no checks).

IDs: ``shmbus.E001`` malformed setting, ``E002`` bad bus name, ``E003`` bad engine URL, ``E004`` a lookup that
does not import, ``E005`` ``allow_broadcast`` (a CSRF-free publish route), ``E006`` bad ``BUS_OPTIONS``,
``E007`` bad ``MIDDLEWARE`` options, ``E008`` the engine's client library is not installed; ``W001`` a gunicorn
sync worker without long polling, ``W002`` a gthread worker whose thread count the middleware does not know,
``W003`` ``$SHMBUS_REDIS_URL`` names a bridge but ``ENGINE`` is empty, ``W004`` the bus already exists and is
bridged (its segment records the bridge) but ``ENGINE`` is empty or names another kind of bridge. The bus is
only looked at, never created, and one that does not exist yet is no error.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from typing import Any, NamedTuple

from .conf import ENGINE_SCHEMES, LOOKUP_KEYS, BusSettings, SettingError, read_settings

__all__ = ["TAG", "Worker", "check_settings", "gunicorn_worker", "startup_checks"]

TAG = "shmbus"
log = logging.getLogger(__name__)


def _error(msg: str, check_id: str, hint: str | None = None) -> Any:
    from django.core import checks

    return checks.Error(msg, hint=hint, id=check_id)


def _warning(msg: str, check_id: str, hint: str | None = None) -> Any:
    from django.core import checks

    return checks.Warning(msg, hint=hint, id=check_id)


class Worker(NamedTuple):
    """The gunicorn worker loading the app: its class name (``SyncWorker``, ``ThreadWorker``, ...), its threads,
    and whether shmbus's config module (``-c python:shmbus.adapters.integrations.gunicorn``) set its hooks."""

    cls: str | None = None
    threads: int | None = None
    shmbus_hooks: bool = False


def gunicorn_worker() -> Worker:
    """The gunicorn worker loading this app; ``Worker()`` (all None) outside gunicorn.

    gunicorn loads the app from its worker's ``load_wsgi`` (or, with ``preload_app``, from the arbiter), so
    the caller's frames hold that object and its ``cfg``: the effective worker class (``sync`` with
    ``--threads 2`` is gthread) without parsing gunicorn's command line or config file.
    """
    frame = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        cfg = getattr(owner, "cfg", None)
        if cfg is not None and any(k.__module__.startswith("gunicorn.") for k in type(owner).__mro__):
            try:
                hooks = getattr(cfg.post_fork, "__module__", "") == "shmbus.adapters.integrations.gunicorn"
                return Worker(cfg.worker_class.__name__, int(cfg.threads), hooks)
            except Exception:  # not gunicorn's Config after all
                return Worker()
        frame = frame.f_back  # type: ignore[assignment]
    return Worker()


def _settings_messages(conf: BusSettings) -> list[Any]:
    from shmbus import Bus
    from shmbus.adapters.http import Options

    out: list[Any] = []
    try:
        # validates without attaching (a Bus attaches at first use, so nothing is created); without create=True it
        # would raise already here when the bus does not exist yet, which is no settings error before the first start
        Bus(conf.bus, create=True)
    except (TypeError, ValueError) as exc:
        out.append(_error(f"SHMBUS['BUS']: {exc}", "shmbus.E002"))
        return out
    try:
        Bus(conf.bus, **{**conf.bus_options, "create": True})
    except (TypeError, ValueError) as exc:
        out.append(_error(f"SHMBUS['BUS_OPTIONS']: {exc}", "shmbus.E006"))
    try:
        Options.from_kwargs(conf.middleware)
    except (TypeError, ValueError) as exc:
        out.append(_error(f"SHMBUS['MIDDLEWARE']: {exc}", "shmbus.E007"))
    for key in LOOKUP_KEYS:
        try:
            conf.lookup(key)
        except ImportError as exc:
            out.append(_error(f"SHMBUS[{key!r}] = {conf.lookups[key]!r} does not import: {exc}", "shmbus.E004"))
    if conf.engine_scheme:
        _, extra, module = ENGINE_SCHEMES[conf.engine_scheme]
        if importlib.util.find_spec(module) is None:
            out.append(
                _error(
                    f"SHMBUS['ENGINE'] is a {conf.engine_scheme}:// bridge but {module!r} is not installed",
                    "shmbus.E008",
                    hint=f"pip install 'shmbus[{extra},django]'",
                )
            )
    out += _bridged_segment_messages(conf)
    if not conf.engine_scheme and os.environ.get("SHMBUS_REDIS_URL"):
        out.append(
            _warning(
                "$SHMBUS_REDIS_URL is set (a Redis-bridged bus) but SHMBUS['ENGINE'] is None: this app's "
                "publishes would reach this host only",
                "shmbus.W003",
                hint="set SHMBUS['ENGINE'] to the bridge's URL, or unset SHMBUS_REDIS_URL",
            )
        )
    return out


#: ``ENGINE`` URL scheme -> the bridge kind a segment records (``BridgeRecord.kind``).
_KIND_OF_SCHEME = {"redis": "redis", "rediss": "redis", "postgres": "postgres", "postgresql": "postgres"}


def _bridged_segment_messages(conf: BusSettings) -> list[Any]:
    """W004: the existing segment of ``BUS`` is bridged, and ``ENGINE`` does not name that kind of bridge."""
    from shmbus.errors import ShmbusError
    from shmbus.segment import Segment

    try:
        seg = Segment.open(conf.bus, path=conf.bus_options.get("path"), create=False)
    except (ShmbusError, OSError, ValueError):  # not there yet (fine), or refused: the bus says why at first use
        return []
    try:
        rec = seg.bridge() if seg.bridged else None
    finally:
        seg.close()
    want = _KIND_OF_SCHEME.get(conf.engine_scheme or "")
    if rec is None or rec.kind == want:
        return []
    have = f"SHMBUS['ENGINE'] is a {conf.engine_scheme}:// bridge" if want else "SHMBUS['ENGINE'] is None"
    return [
        _warning(
            f"bus {conf.bus!r} is bridged ({rec.kind}, {rec.url}) but {have}: these workers do not relay that "
            "bridge's messages into the bus, and their publishes go through it only when its URL needs no "
            "password (or $SHMBUS_ENGINE_URL is set), else they raise BusBridged",
            "shmbus.W004",
            hint=f"set SHMBUS['ENGINE'] to the bridge's URL ({rec.url}), or destroy the bus (shmbus destroy) if it "
            "should no longer be bridged",
        )
    ]


def _server_messages(conf: BusSettings, worker: Worker) -> list[Any]:
    from shmbus.adapters.wsgi import server_threads

    opts = conf.middleware
    if (
        worker.cls == "SyncWorker"
        and opts.get("long_polling_enabled", True)
        and not opts.get("long_polling_on_sync_workers")
    ):
        return [
            _warning(
                "gunicorn's sync worker serves one request at a time, so polls are answered at once and the "
                "browser hears of a message on its next poll (up to about 15 s later)",
                "shmbus.W001",
                hint="run gunicorn with -c python:shmbus.adapters.integrations.gunicorn (gthread), -k gevent, or "
                "the uvicorn worker on the ASGI entry point (docs/django.md)",
            )
        ]
    if worker.cls == "ThreadWorker" and not worker.shmbus_hooks and server_threads() is None:
        return [
            _warning(
                f"gunicorn gthread worker ({worker.threads} threads) without shmbus's config module: the middleware "
                "does not know the thread count, so parked long polls may take every thread",
                "shmbus.W002",
                hint="add -c python:shmbus.adapters.integrations.gunicorn (or set SHMBUS_WSGI_THREADS)",
            )
        ]
    return []


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """The registered check: the setting, and the gunicorn worker when one is loading the app."""
    try:
        conf = read_settings(_raw_setting())
    except SettingError as exc:
        return [_error(str(exc), exc.check_id, exc.hint)]
    worker = kwargs.get("worker") or gunicorn_worker()
    return _settings_messages(conf) + _server_messages(conf, worker)


def _raw_setting() -> Any:
    from django.conf import settings

    return getattr(settings, "SHMBUS", None)


def startup_checks(worker: Worker) -> None:
    """Run :func:`check_settings` at a server start: raise ``ImproperlyConfigured`` on errors, log warnings
    (both minus ``SILENCED_SYSTEM_CHECKS``)."""
    from django.core.exceptions import ImproperlyConfigured

    messages = [m for m in check_settings(worker=worker) if not m.is_silenced()]
    errors = [m for m in messages if m.is_serious()]
    for m in messages:
        if m not in errors:
            log.warning("%s", m)
    if errors:
        raise ImproperlyConfigured("settings.SHMBUS: " + "; ".join(str(m) for m in errors))
