"""System checks catch a missing or wrong ``SHMBUS`` setting, at ``manage.py check`` and at server start."""

from __future__ import annotations

import os
from typing import Any

import pytest

from shmbus.adapters.integrations.django.checks import Worker, check_settings, startup_checks

from .dj_util import run_django

GOOD = {"BUS": "djchecks"}


NO_WORKER = Worker()


def ids(setting: Any, worker: Worker = NO_WORKER) -> list[str]:
    from django.test import override_settings

    with override_settings(SHMBUS=setting):
        return [m.id for m in check_settings(worker=worker)]


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        (GOOD, []),
        (None, ["shmbus.E001"]),
        ("djchecks", ["shmbus.E001"]),
        ({"BUS": "x", "ENGNE": "redis://h"}, ["shmbus.E001"]),  # a typo in a key is not ignored
        ({"BUS": ""}, ["shmbus.E002"]),
        ({"BUS": "a/b"}, ["shmbus.E002"]),
        ({"BUS": "x", "ENGINE": "amqp://h"}, ["shmbus.E003"]),
        ({"BUS": "x", "ENGINE": 5}, ["shmbus.E003"]),
        ({"BUS": "x", "USER_ID_LOOKUP": "no.such.module.fn"}, ["shmbus.E004"]),
        ({"BUS": "x", "GROUP_IDS_LOOKUP": 3}, ["shmbus.E004"]),
        ({"BUS": "x", "MIDDLEWARE": {"allow_broadcast": True}}, ["shmbus.E005"]),
        ({"BUS": "x", "BUS_OPTIONS": {"ring_size": 5}}, ["shmbus.E006"]),
        ({"BUS": "x", "BUS_OPTIONS": {"name": "y"}}, ["shmbus.E001"]),
        ({"BUS": "x", "MIDDLEWARE": {"long_polling_interval": 0}}, ["shmbus.E007"]),
        ({"BUS": "x", "MIDDLEWARE": {"no_such_option": 1}}, ["shmbus.E007"]),
        ({"BUS": "x", "MIDDLEWARE": {"user_id_lookup": "a.b"}}, ["shmbus.E001"]),
    ],
)
def test_setting_errors(djsettings: Any, setting: Any, expected: list[str]) -> None:
    assert ids(setting) == expected


def test_lookups_that_import_pass_and_none_turns_one_off(djsettings: Any) -> None:
    setting = {"BUS": "x", "USER_ID_LOOKUP": "tests.django.djtest.urls.whoami", "GROUP_IDS_LOOKUP": None}
    assert ids(setting) == []


def test_missing_engine_library_is_an_error(djsettings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "redis" else real(name, *a))
    assert ids({"BUS": "x", "ENGINE": "redis://127.0.0.1:6379/0"}) == ["shmbus.E008"]
    assert ids({"BUS": "x", "ENGINE": "postgresql://u@h/db"}) == []  # psycopg is installed


def test_bridged_environment_without_engine_warns(djsettings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHMBUS_REDIS_URL", "redis://127.0.0.1:6379/0")
    assert ids(GOOD) == ["shmbus.W003"]
    assert ids({**GOOD, "ENGINE": "redis://127.0.0.1:6379/0"}) == []


def test_a_bridged_bus_without_its_engine_warns(djsettings: Any, bus_name: str) -> None:
    """The segment records its bridge: a bus that exists and is bridged needs that bridge in ``ENGINE``."""
    from shmbus.segment import BridgeRecord, Segment, segment_path

    setting = {"BUS": bus_name}
    assert ids(setting) == [] and not os.path.exists(segment_path(bus_name))  # not there yet: fine, not created
    seg = Segment.open(bus_name, ring_size=1 << 16, max_channels=16)
    try:
        assert ids(setting) == []  # a bus of this host only
        seg.mark_bridged(BridgeRecord("redis", "redis://127.0.0.1:6379/0", False, {}))
        assert ids(setting) == ["shmbus.W004"]
        assert ids({**setting, "ENGINE": "postgresql://u@h/db"}) == ["shmbus.W004"]  # another kind of bridge
        assert ids({**setting, "ENGINE": "redis://127.0.0.1:6379/0"}) == []
        assert ids({**setting, "ENGINE": "rediss://127.0.0.1:6380/0"}) == []
    finally:
        seg.close()
        Segment.destroy_by_name(bus_name)


def test_sync_worker_without_long_polling_warns(djsettings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    assert ids(GOOD, Worker("SyncWorker", 1)) == ["shmbus.W001"]
    assert ids({**GOOD, "MIDDLEWARE": {"long_polling_on_sync_workers": True}}, Worker("SyncWorker", 1)) == []
    assert ids({**GOOD, "MIDDLEWARE": {"long_polling_enabled": False}}, Worker("SyncWorker", 1)) == []
    assert ids(GOOD, Worker("GeventWorker", 1)) == []
    assert ids(GOOD, Worker("UvicornWorker", 1)) == []
    monkeypatch.delenv("SHMBUS_WSGI_THREADS", raising=False)
    assert ids(GOOD, Worker("ThreadWorker", 8)) == ["shmbus.W002"]  # the thread count is unknown to the middleware
    assert ids(GOOD, Worker("ThreadWorker", 8, shmbus_hooks=True)) == []  # its post_fork tells the middleware
    monkeypatch.setenv("SHMBUS_WSGI_THREADS", "8")
    assert ids(GOOD, Worker("ThreadWorker", 8)) == []


def test_startup_checks_raise_on_errors_and_honour_silencing(djsettings: Any, caplog: Any) -> None:
    from django.core.exceptions import ImproperlyConfigured
    from django.test import override_settings

    with override_settings(SHMBUS={"BUS": "a/b"}), pytest.raises(ImproperlyConfigured, match=r"shmbus\.E002"):
        startup_checks(Worker())
    with override_settings(SHMBUS=GOOD):
        startup_checks(Worker("SyncWorker", 1))
    assert "shmbus.W001" in caplog.text
    caplog.clear()
    with override_settings(SHMBUS=GOOD, SILENCED_SYSTEM_CHECKS=["shmbus.W001"]):
        startup_checks(Worker("SyncWorker", 1))
    assert "shmbus.W001" not in caplog.text


def test_manage_py_check_reports_a_bad_bus_name(django_env: dict[str, str]) -> None:
    with pytest.raises(AssertionError, match=r"shmbus\.E002"):
        run_django({**django_env, "SHMBUS_TEST_BUS": "bad/name"}, "check")
