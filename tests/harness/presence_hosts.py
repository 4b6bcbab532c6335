"""Presence across two bridged hosts (tests/redis and tests/postgres share it): host a is the test's own bridged
bus, host b a child process with its own segment bridged to the same backend, killed -9 to kill the host.

Each side announces one present client (alice on a, bob on b). Both hosts must list both (a read through a's bus,
b's through a plain reader of b's segment), a's view channel ``/__presence/room`` must carry both joins, and once
host b is killed its client must leave a's list and a's view channel (by the silence of b's announcer, with no
goodbye)."""

from __future__ import annotations

import json
import os
import signal
from typing import Any

from shmbus import Bus
from shmbus.presence import hub_for

from .procs import spawn_python
from .wait import wait_for

__all__ = ["check_presence_across_hosts"]

_HOST_B = """
import json, sys, time
from shmbus import Bus
from shmbus.presence import hub_for
kind, name, target, options = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
if kind == "redis":
    from shmbus.adapters.redis import RedisBridge as Engine
else:
    from shmbus.adapters.postgres import PostgresBridge as Engine
bus = Bus(name, keepalive_interval=0, engine=Engine(target, **options), create=True)
hub_for(bus).touch("bob", 2, ["/room"], lease=600)
print("ready", flush=True)
time.sleep(600)
"""


def ids(bus: Bus, channel: str = "/room") -> list[str]:
    return sorted(m.client_id for m in bus.presence(channel))


def view_changes(bus: Bus) -> list[tuple[str, str]]:
    """(kind, client id) of every change on ``bus``'s view channel of /room, in order."""
    out = []
    for m in bus.backlog("/__presence/room", 0):
        if isinstance(m.data, dict) and m.data.get("type") == "change":
            out += [("join", x[0]) for x in m.data["join"]]
            out += [("leave", x[0]) for x in m.data["leave"]]
    return out


def check_presence_across_hosts(a: Bus, b_name: str, kind: str, target: str, options: dict[str, Any]) -> None:
    hub_for(a).touch("alice", 1, ["/room"], lease=600)
    child = spawn_python(_HOST_B, kind, b_name, target, json.dumps(options))
    reader: Bus | None = None
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.strip() == "ready", (line, child.stderr.read() if child.poll() is not None else "")
        reader = Bus(b_name, keepalive_interval=0)
        wait_for(lambda: ids(a) == ["alice", "bob"], 60, "host a lists both")
        wait_for(lambda: ids(reader) == ["alice", "bob"], 60, "host b lists both")
        wait_for(lambda: {("join", "alice"), ("join", "bob")} <= set(view_changes(a)), 30, "both joins on a's view")
        os.kill(child.pid, signal.SIGKILL)
        child.wait(30)
        wait_for(lambda: ids(a) == ["alice"], 60, "host b's client gone from host a after b's expiry")
        wait_for(lambda: ("leave", "bob") in view_changes(a), 30, "its leave on a's view channel")
        assert ("leave", "alice") not in view_changes(a)
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
            child.wait(30)
        if reader is not None:
            reader.destroy()
