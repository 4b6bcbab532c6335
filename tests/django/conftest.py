"""Fixtures for the Django integration tests.

``djsettings``   (session) Django configured in this process from ``djtest.settings`` (SQLite in memory,
                 migrated once); tests change ``SHMBUS`` with ``override_settings``
``shmbus_setting`` (function) ``override_settings(SHMBUS={"BUS": bus_name, ...})`` for this test; the test's
                 bus is destroyed afterwards
``django_env``   (function) environment for a child process serving ``djtest`` on this test's bus and an
                 SQLite file in ``tmp_path`` (migrated), plus ``DJTEST_DIR`` for ``app_dir``
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import harness

from .dj_util import run_django

harness.require_module("django", "pip install -e '.[all,test]' (the django extra), or run scripts/test")


@pytest.fixture(scope="session")
def djsettings() -> Any:
    import django
    from django.conf import settings

    if not settings.configured:
        from .djtest import settings as module

        settings.configure(**{k: getattr(module, k) for k in dir(module) if k.isupper()})
        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
    return settings


@pytest.fixture
def shmbus_setting(djsettings: Any, bus_name: str) -> Iterator[dict[str, Any]]:
    from django.test import override_settings

    from shmbus.adapters.integrations.django import get_bus

    value = {"BUS": bus_name, "BUS_OPTIONS": {"ring_size": 1 << 20, "max_channels": 256, "keepalive_interval": 0}}
    with override_settings(SHMBUS=value):
        try:
            yield value
        finally:
            get_bus().destroy()


@pytest.fixture
def django_env(bus_name: str, tmp_path: Path) -> dict[str, str]:
    env = {
        "DJANGO_SETTINGS_MODULE": "djtest.settings",
        "SHMBUS_TEST_BUS": bus_name,
        "SHMBUS_TEST_SQLITE": str(tmp_path / "db.sqlite3"),
    }
    run_django(env, "migrate", "-v0")
    return env
