"""Presence across two hosts bridged by Redis (tests/harness/presence_hosts.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from shmbus import Bus
from tests.harness.presence_hosts import check_presence_across_hosts

pytestmark = pytest.mark.redis


def test_two_hosts_see_one_presence_and_a_killed_host_leaves_no_ghost(
    redis_server: Any, make_host: Callable[..., Bus], bus_name: str
) -> None:
    a = make_host("a", redis_server.url)
    check_presence_across_hosts(a, f"{bus_name}b", "redis", redis_server.url, {"election_interval": 0.1})
