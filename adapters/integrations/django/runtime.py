"""This process's bus and settings, made from ``settings.SHMBUS`` on first use and forgotten when a test changes
the setting (``override_settings(SHMBUS=...)``)."""

from __future__ import annotations

import threading
from typing import Any

from shmbus.bus import Bus

from .conf import BusSettings, SettingError, read_settings

__all__ = ["bus_settings", "get_bus", "reset"]

_lock = threading.Lock()
_settings: BusSettings | None = None
_bus: Bus | None = None


def bus_settings() -> BusSettings:
    """``settings.SHMBUS``, read once; ``ImproperlyConfigured`` says what is wrong with it."""
    global _settings
    current = _settings
    if current is None:
        from django.conf import settings
        from django.core.exceptions import ImproperlyConfigured

        try:
            current = read_settings(getattr(settings, "SHMBUS", None))
        except SettingError as exc:
            hint = f" ({exc.hint})" if exc.hint else ""
            raise ImproperlyConfigured(f"{exc}{hint}") from None
        _settings = current
    return current


def get_bus() -> Bus:
    """The bus named by ``SHMBUS['BUS']`` (with its engine), one per process; attached on first use."""
    global _bus
    bus = _bus
    if bus is None:
        with _lock:
            if _bus is None:
                conf = bus_settings()
                # the app's own bus (the first start makes it), unless BUS_OPTIONS says create=False
                _bus = Bus(conf.bus, engine=conf.make_engine(), **{"create": True, **conf.bus_options})
            bus = _bus
    return bus


def reset() -> None:
    """Forget the settings and close this process's bus (its segment stays for the other processes)."""
    global _settings, _bus
    with _lock:
        old, _bus, _settings = _bus, None, None
    if old is not None:
        old.close()


def _on_setting_changed(*, setting: str, **_: Any) -> None:
    if setting == "SHMBUS":
        reset()


def connect_signals() -> None:
    """Reset on ``setting_changed`` for ``SHMBUS`` (the app's ``ready()`` calls this)."""
    from django.core.signals import setting_changed

    setting_changed.connect(_on_setting_changed, dispatch_uid="shmbus.django.reset")
