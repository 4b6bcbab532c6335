"""The app for ``INSTALLED_APPS``: registers the system checks, the ``shmbus`` management command and the
``setting_changed`` reset (``override_settings(SHMBUS=...)`` in tests gets a fresh bus)."""

from __future__ import annotations

from django.apps import AppConfig


class ShmbusConfig(AppConfig):  # type: ignore[misc]  # Django ships no type hints
    name = "shmbus.adapters.integrations.django"
    label = "shmbus"
    verbose_name = "shmbus message bus"

    def ready(self) -> None:
        from django.core import checks

        from .checks import TAG, check_settings
        from .runtime import connect_signals

        checks.register(check_settings, TAG)
        connect_signals()
