"""Issue 22 point 8: DistributedCache across hosts whose backend trimmed its history. On PostgreSQL ids are sparse
(the first is never 1): the cache took every history for incomplete, published no snapshot, kept every operation
in memory, and a late starter on another host missed a key set before 3,000 others."""

from __future__ import annotations

import pytest

from shmbus import DistributedCache

from .faults_hosts import Cluster, until

pytestmark = [pytest.mark.faults, pytest.mark.slow]

OPTIONS = {"snapshot_every": 200, "history": 1000}


def test_a_late_starter_on_another_host_sees_a_key_set_before_3000_others(cluster: Cluster) -> None:
    trims = {"max_backlog_size": 1000, "max_global_backlog_size": 1000}  # the backend keeps 1,000 operations
    a = cluster.host("a", **trims)
    cluster.publish_many(a, 50)  # other traffic first: the cache's first operation is not the backend's first id
    writer = DistributedCache("settings", bus=a.bus, **OPTIONS)
    writer["first"] = "kept"
    for i in range(3000):
        writer[f"k{i}"] = i
    assert len(writer) == 3001
    until(lambda: cluster.backend.retained() <= 1100, 30, "the backend trimmed the cache's channel")
    b = cluster.host("b", **trims)  # a host started later, on a fresh segment
    late = DistributedCache("settings", bus=b.bus, **OPTIONS)
    until(lambda: late.get("k2999") == 2999, 60, "the newest key on the late host")
    until(lambda: late.get("first") == "kept", 30, "the key set before 3,000 others, on the late host")
    assert late.hash() == writer.hash()
    late["after"] = 1
    until(lambda: writer.get("after") == 1, 30, "a write of the late starter on the first host")
    writer.close()
    late.close()
