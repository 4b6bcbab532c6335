"""``manage.py shmbus stats|tail|publish``: the CLI on the bus of ``settings.SHMBUS``."""

from __future__ import annotations

import json
from typing import Any

import pytest

from shmbus import Bus
from shmbus.adapters.integrations.django import get_bus

from .dj_util import run_django


def test_publish_stats_tail_on_the_configured_bus(shmbus_setting: Any, capsys: Any) -> None:
    from django.core.management import call_command

    get_bus().publish("/chat", "first")  # the bus exists: the CLI attaches to it by the setting's name
    call_command("shmbus", "publish", "/chat", '{"text": "hi"}', "--json-data", "--user-id", "7", "--json")
    assert json.loads(capsys.readouterr().out) == {"channel": "/chat", "message_id": 2}
    last = get_bus().backlog("/chat", 1)[0]
    assert last.data == {"text": "hi"} and last.user_ids == [7]
    call_command("shmbus", "stats", "--json")
    stats = json.loads(capsys.readouterr().out)
    assert shmbus_setting["BUS"] in json.dumps(stats) and "/chat" in json.dumps(stats)
    call_command("shmbus", "tail", "/chat", "--last", "2", "--timeout", "0.2")
    out = capsys.readouterr().out
    assert "first" in out and "hi" in out


def test_refusals_are_command_errors(shmbus_setting: Any) -> None:
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match="no bus named"):  # not created: a typo must not make a bus
        call_command("shmbus", "publish", "/chat", "x")
    with pytest.raises(CommandError):
        call_command("shmbus", "destroy")  # not one of the wrapped subcommands


def test_manage_py_publish_in_a_child_process(django_env: dict[str, str], bus_name: str) -> None:
    out = run_django(django_env, "shmbus", "publish", "/news", "hello", "--create")
    bus = Bus(bus_name, create=False)
    try:
        assert "published #1" in out and bus.backlog("/news", 0)[0].data == "hello"
    finally:
        bus.destroy()
