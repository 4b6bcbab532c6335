"""NATS JetStream's own fault: the stream purged under load. A purge keeps the stream's history (its ids go on), so
no host resets: what a host had not read yet is lost and must be reported (``relay_lost``, ``gap=True``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from .faults_hosts import Cluster
from .faults_nats import NatsBackend

pytestmark = [pytest.mark.faults, pytest.mark.slow]


@pytest.mark.parametrize("backend", ["nats"], indirect=True)
def test_purged_under_load(cluster: Cluster, backend: NatsBackend, judge: Callable[[], Any]) -> None:
    a, b = cluster.host("a"), cluster.host("b")
    with cluster.load(a, b, interval=0.001):
        cluster.wait_for_acks(300)
        for _ in range(3):
            backend.purge()
            cluster.wait_for_acks(100)
    verdict = judge()
    assert all(h.resets == 0 for h in verdict.hosts), verdict.row()
