"""Presence across two hosts bridged by PostgreSQL (tests/harness/presence_hosts.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from shmbus import Bus
from tests.harness.presence_hosts import check_presence_across_hosts

pytestmark = pytest.mark.postgres


def test_two_hosts_see_one_presence_and_a_killed_host_leaves_no_ghost(
    make_host: Callable[..., Bus], pg: dict[str, str], bus_name: str
) -> None:
    a = make_host("a")
    options = {"election_interval": 0.05, "notify_channel": pg["channel"]}
    check_presence_across_hosts(a, f"{bus_name}b", "postgres", pg["dsn"], options)
