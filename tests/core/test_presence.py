"""Presence's sans-IO parts with a fake clock: the local table's leases and batches, the union view's workers,
snapshots and expiry, and the middleware's ``presence`` option."""

from __future__ import annotations

from typing import Any

import pytest

from shmbus.adapters.http.options import Options
from shmbus.presence.table import LocalTable
from shmbus.presence.view import UnionView


def test_a_poll_renews_the_lease_and_expiry_makes_a_leave() -> None:
    t = LocalTable()
    t.touch("c1", 7, ["/a"], lease=10, now=0, wall=100)
    assert t.take_changes() == ([["/a", "c1", 7, 100]], [])
    t.touch("c1", 7, ["/a"], lease=10, now=8, wall=108)  # renewed: no second join, since kept
    t.sweep(12)
    assert t.take_changes() == ([], []) and len(t) == 1
    t.sweep(18)
    assert t.take_changes() == ([], [["/a", "c1"]]) and len(t) == 0


def test_a_join_and_its_leave_in_one_batch_cancel_out_and_mixed_leases_expire_each_on_time() -> None:
    t = LocalTable()
    t.touch("c1", None, ["/a"], lease=1, now=0, wall=0)
    t.touch("c2", None, ["/a"], lease=30, now=0, wall=0)
    t.sweep(2)
    assert t.take_changes() == ([["/a", "c2", None, 0]], [])


def test_the_table_is_bounded_and_odd_user_ids_travel_as_text() -> None:
    t = LocalTable(max_entries=2)
    t.touch("c1", object.__new__(type("U", (), {"__str__": lambda s: "u"})), ["/a", "/b", "/c"], 5, 0, 0)
    assert len(t) == 2 and t.dropped == 1
    assert {e[2] for e in t.snapshot()} == {"u"}


def hb(w: str) -> dict[str, Any]:
    return {"w": w, "h": "host", "t": "hb"}


def test_the_view_is_the_union_and_a_silent_worker_expires_with_its_clients() -> None:
    v = UnionView(expiry=6)
    joins = v.apply({"w": "A", "h": "h1", "t": "d", "j": [["/a", "c1", 1, 50.0]], "l": []}, now=0)
    assert [(e.kind, e.member.client_id) for e in joins] == [("join", "c1")]
    assert v.wants_sync == ["A"]  # an unknown worker is asked for its snapshot
    assert v.apply({"w": "B", "h": "h1", "t": "d", "j": [["/a", "c1", 1, 40.0]], "l": []}, now=1) == []
    assert [(m.client_id, m.since) for m in v.members("/a")] == [("c1", 40.0)]
    v.apply(hb("B"), now=5)
    assert v.expire(now=6.5) == []  # A is silent 6.5 s, but B still serves c1
    assert "A" not in v.workers and len(v.members("/a")) == 1
    (leave,) = v.expire(now=12)
    assert (leave.kind, leave.member.client_id) == ("leave", "c1") and v.members("/a") == [] and v.size == 0


def test_a_snapshot_replaces_what_the_view_held_of_its_worker() -> None:
    v = UnionView()
    v.apply({"w": "A", "h": "h", "t": "d", "j": [["/a", "c1", None, 1], ["/a", "c2", None, 2]], "l": []}, 0)
    v.apply({"w": "A", "h": "h", "t": "s", "m": [["/a", "c2", None, 2]], "first": True, "last": False}, 1)
    events = v.apply({"w": "A", "h": "h", "t": "s", "m": [["/b", "c3", None, 3]], "first": False, "last": True}, 1)
    assert [(e.kind, e.channel, e.member.client_id) for e in events] == [("join", "/b", "c3"), ("leave", "/a", "c1")]
    assert [m.client_id for m in v.members("/a")] == ["c2"]
    bye = v.apply({"w": "A", "t": "bye"}, 2)
    assert sorted(e.kind for e in bye) == ["leave", "leave"] and v.workers == {}


@pytest.mark.parametrize("bad", [None, [], {"t": "d"}, {"w": "A", "t": "d", "j": [["/a"]], "l": [[1, 2]]}])
def test_the_view_ignores_malformed_messages(bad: Any) -> None:
    v = UnionView()
    assert v.apply(bad, 0) == [] and v.size == 0


def test_the_presence_option() -> None:
    assert Options().presence_of(["/a"]) == []
    assert Options(presence=True).presence_of(["/a", "/b"]) == ["/a", "/b"]
    assert Options(presence=["/chat/"]).presence_of(["/a", "/chat/1"]) == ["/chat/1"]
    with pytest.raises(TypeError):
        Options(presence="/chat/")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Options(presence_grace=-1)


def test_a_held_key_outlives_any_lease_until_its_last_connection_lets_go() -> None:
    t = LocalTable()
    assert t.hold("c1", None, ["/a"], now=0, wall=0) == ["/a"]
    t.hold("c1", None, ["/a"], now=1, wall=1)  # a second connection of the same client
    t.touch("c1", None, ["/a"], lease=1, now=2, wall=2)  # a poll does not shorten a hold
    t.sweep(1000)
    assert len(t) == 1
    t.release("c1", ["/a"], grace=5, now=1000)
    t.sweep(2000)
    assert len(t) == 1  # one connection still holds it
    t.release("c1", ["/a"], grace=5, now=2000)
    t.sweep(2004)
    assert len(t) == 1
    t.sweep(2005)
    assert len(t) == 0 and t.take_changes() == ([], [])  # joined and left within one batch
    t.release("c1", ["/a"], grace=5, now=2006)  # releasing what is not held is harmless


def test_view_publishing_is_bounded_and_survives_a_record_too_large() -> None:
    from shmbus.errors import PayloadTooLarge
    from shmbus.presence import publisher as pub
    from shmbus.presence.view import Member, PresenceEvent

    class Small:
        """A bus whose records hold at most 3 members."""

        def __init__(self) -> None:
            self.sent: list[tuple[str, Any, Any]] = []

        def publish(self, channel: str, data: Any, client_ids: Any = None, max_backlog_size: int = 0) -> int:
            if len(data.get("members", [])) + len(data.get("join", [])) + len(data.get("leave", [])) > 3:
                raise PayloadTooLarge("too large")
            if data.get("join") and data["join"][0][1] == "bad":
                raise TypeError("unencodable")
            self.sent.append((channel, data, client_ids))
            return 1

    small = Small()
    p = pub.ViewPublisher(small)
    members = [Member(f"c{i}", None, float(i), "h") for i in range(10)]
    for i in range(pub.MAX_PENDING + 5):
        p.ask("/a", f"c{i % (pub.MAX_PENDING + 2)}")
    assert len(p.pending) == pub.MAX_PENDING and p.dropped == 2  # repeats kept once; past the cap dropped
    p.snapshots(lambda ch: members)
    assert len(p.pending) == pub.MAX_PENDING - pub.MEMBERS_PER_TICK // 10  # one tick's budget of members
    channel, snap, to = small.sent[0]
    assert channel == "/__presence/a" and to == ["c0"]
    assert [m[0] for m in snap["members"]] == ["c0", "c1"] and snap["truncated"] == 8
    small.sent.clear()
    events = [PresenceEvent("join", "/a", m) for m in members[:5]] + [PresenceEvent("leave", "/a", members[9])]
    p.changes(events)
    joined = [m[0] for _, d, _ in small.sent for m in d["join"]]
    left = [m[0] for _, d, _ in small.sent for m in d["leave"]]
    assert joined == [f"c{i}" for i in range(5)] and left == ["c9"]
    p.changes([PresenceEvent("join", "/a", Member("x", "bad", 0.0, "h"))])
    assert p.failed == 1  # logged and dropped: the presence thread goes on
