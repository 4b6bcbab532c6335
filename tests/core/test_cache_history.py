"""DistributedCache's history (issue 22 point 8): complete from the backlog's start, not from "the first id is 1";
incomplete ones keep a bounded number of operations and complete from a covering snapshot."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import shmbus
from shmbus.message import Message
from tests.harness.wait import wait_for

CHANNEL = "/__shmbus_cache/c"


def _op(key: str, value: Any, prev: int = 0) -> dict[str, Any]:
    return {"op": "set", "key": key, "value": value, "site": "default", "origin": "elsewhere", "prev": prev}


def test_a_history_starting_at_the_channels_start_is_complete_even_when_ids_do_not(
    make_bus: Callable[..., shmbus.Bus],
) -> None:
    bus = make_bus()
    for i in range(5):
        bus.publish("/other", i)  # the cache's first operation gets global id 6 on a bridge with sparse ids
    writer = shmbus.DistributedCache("c", bus=bus, snapshot_every=10, history=20)
    writer["k"] = 1
    late = shmbus.DistributedCache("c", bus=bus, snapshot_every=10, history=20)
    assert late._complete and late.get("k") == 1


def test_an_operation_whose_predecessor_is_gone_makes_the_history_incomplete_and_memory_stays_bounded(
    make_bus: Callable[..., shmbus.Bus],
) -> None:
    bus = make_bus(max_backlog_size=1000)
    first = bus.publish(CHANNEL, _op("first", 1))
    bus.publish(CHANNEL, _op("second", 2, prev=first or 0), max_backlog_size=1)  # the channel keeps only this one
    late = shmbus.DistributedCache("c", bus=bus, snapshot_every=10, history=20)
    assert not late._complete and late.get("first") is None
    for i in range(100):  # operations, and no snapshot: at most `history` of them are kept
        bus.publish(CHANNEL, _op(f"k{i}", i, prev=1))
    wait_for(lambda: late.get("k99") == 99, what="the late cache applied every operation")
    assert len(late._recent) <= late.history
    newest = bus.last_id(CHANNEL)
    snapshot = {"op": "snapshot", "as_of": newest, "prev": newest, "origin": "elsewhere", "data": {"default": {}}}
    snapshot["data"]["default"] = {"first": 1, "second": 2, **{f"k{i}": i for i in range(100)}}
    bus.publish(CHANNEL, snapshot)
    wait_for(lambda: late._complete, what="completed by a snapshot covering what it missed")
    assert late.get("first") == 1 and late.get("k99") == 99
    late.close()


def test_a_cache_that_started_before_its_hosts_history_arrived_completes_from_a_snapshot(
    make_bus: Callable[..., shmbus.Bus],
) -> None:
    """Issue 36 (the fault suite's late starter on RabbitMQ): a process on a new host starts its cache while the
    host's relay has stored nothing yet (an empty channel: nothing missing), then the relay stores what the
    backend still holds: an operation whose writer had applied one this process never received. It was taken as
    complete for good, snapshots ignored, the older keys missing without a word; the operation now says what was
    missed, and a snapshot covering it completes the cache."""
    bus = make_bus()
    late = shmbus.DistributedCache("c", bus=bus, snapshot_every=10, history=20)
    assert late._complete  # an empty channel

    def stored(mid: int, op: dict[str, Any]) -> None:  # as the relay stores the backend's entry of id ``mid``
        late._on_message(Message(mid, mid, CHANNEL, bus.codec.encode(op), bus.codec))

    stored(3000, _op("k2999", 2999, prev=2990))  # its writer had applied 2990, trimmed before the relay read it
    assert late.get("k2999") == 2999 and not late._complete
    data = {"default": {"first": "kept", "k2999": 2999}}
    stored(3001, {"op": "snapshot", "as_of": 3000, "prev": 3000, "origin": "elsewhere", "data": data})
    assert late._complete and late.get("first") == "kept" and late.get("k2999") == 2999
    late.close()
