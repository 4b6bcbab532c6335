"""Presence views (``/__presence/<channel>``) on the poll protocol, through both shells in-process: a poll with
``-1`` gets its ``/__status`` and then a snapshot addressed to its client alone; the view of a channel
``subscribe_allowed`` refuses delivers nothing (no message, no backlog, no ``/__status`` entry) and the hook is
asked about the watched channel; a poll naming the view is never counted as present; a client cannot publish on a
view nor read a view of a reserved channel. With the npm client in Chromium: tests/e2e/test_presence_browser.py."""

from __future__ import annotations

import json
from typing import Any

from shmbus import Bus
from shmbus.adapters.http import REFUSED_HEADER, RequestInfo
from shmbus.presence import hub_for
from tests.harness.wait import wait_for

OPEN, SECRET = "/__presence/open", "/__presence/private/board"


def test_a_view_brings_a_snapshot_to_its_client_and_a_refused_view_nothing(bus: Bus, driver: Any, kind: str) -> None:
    asked: list[str] = []

    def gate(info: RequestInfo, channel: str) -> bool:
        asked.append(channel)
        return not channel.startswith("/private")

    hub = hub_for(bus)
    hub.touch("alice", 7, ["/open"], lease=60)
    hub.touch("mallory", 9, ["/private/board"], lease=60)
    wait_for(lambda: [m.client_id for m in bus.presence("/open")] == ["alice"], 20, "alice present")
    d = driver(kind, subscribe_allowed=gate, presence=True)
    r = d.poll("c1", {OPEN: -1, SECRET: -1}, dlp=True)
    status = json.loads(r.body())
    assert status == [
        {"global_id": -1, "message_id": -1, "channel": "/__status", "data": {OPEN: status[0]["data"][OPEN]}}
    ]
    assert r.header(REFUSED_HEADER) == SECRET
    assert asked == ["/open", "/private/board"], "the hook is asked about the watched channels"
    position = status[0]["data"][OPEN]

    def snapshot() -> Any:
        got = json.loads(d.poll("c1", {OPEN: position, SECRET: 0}, dlp=True).body())
        return [m for m in got if m["channel"] == OPEN and m["data"]["type"] == "snapshot"]

    (snap,) = wait_for(snapshot, 20, "c1's snapshot")
    assert [(m[0], m[1]) for m in snap["data"]["members"]] == [("alice", 7)]
    other = json.loads(d.poll("c2", {OPEN: position, SECRET: 0}, dlp=True).body())
    assert all(m["data"]["type"] != "snapshot" for m in other if m["channel"] == OPEN), "a snapshot reached c2"
    for body in (d.poll("c1", {SECRET: 0}, dlp=True).body(), d.poll("c3", {SECRET: -1}, dlp=True).body()):
        assert json.loads(body) == [], "the refused view told something"
    assert [m.client_id for m in bus.presence("/open")] == ["alice"], "a view's poll counted as present"
    assert "c1" not in {m.client_id for m in bus.presence(OPEN)}


def test_no_view_of_a_reserved_channel_and_no_publishing_on_a_view(bus: Bus, driver: Any, kind: str) -> None:
    d = driver(kind)
    for name in ("/__presence", "/__presence/__status", "/__presence//x", "/__presence/"):
        r = d.poll("c1", {name: -1}, dlp=True)
        assert r.status == 400, name
    r = d.request("POST", "/message-bus/broadcast", form={"channel": OPEN, "data": "x"})
    assert r.status in (400, 403, 404)
    assert bus.last_id(OPEN) == 0
