"""Presence with real gunicorn workers: the test process reads the union every worker announces.

A polling client is listed (user id and host included), a channel ``subscribe_allowed`` refuses gets no entry, a
client that stops polling leaves once its lease runs out, a reader that starts late learns the present clients
from the workers' snapshots, and a worker killed -9 takes its clients with it long before their leases would
(the waits are bounded, never timed).
"""

from __future__ import annotations

import json
import os
import signal
import socket
from typing import Any

import pytest

from shmbus import Bus
from tests.harness.procs import proc_stats
from tests.harness.wait import wait_for

from . import rawhttp
from .web_servers import start

pytestmark = pytest.mark.slow


@pytest.fixture
def shared_bus(bus_name: str) -> Any:
    b = Bus(bus_name, keepalive_interval=0, create=True)
    b.last_id("/x")  # create the segment before the servers attach
    try:
        yield b
    finally:
        b.destroy()


def present(bus: Bus, channel: str) -> list[str]:
    return [m.client_id for m in bus.presence(channel)]


def dlp_poll(port: int, client_id: str, channels: dict[str, int], user: int) -> Any:
    r = rawhttp.poll(port, client_id, channels, dlp=True, headers={"X-User-Id": str(user)}).read_head()
    assert r.status == 200
    return json.loads(r.read_all())


def workers_of(master: int) -> list[int]:
    return [pid for pid, f in proc_stats() if len(f) > 1 and int(f[1]) == master]


def test_presence_lists_polling_clients_and_drops_them(procs: Any, bus_name: str, shared_bus: Bus) -> None:
    server = start(
        "gunicorn",
        procs,
        bus_name,
        long_polling_interval=1,
        presence=True,
        presence_grace=0.5,
        lookups_from_headers=True,
        refuse_prefix="/secret",
    )
    assert shared_bus.presence("/room") == []  # the view is ready (its first call waits one heartbeat)
    dlp_poll(server.port, "alice", {"/room": -1, "/secret/room": -1}, user=7)
    wait_for(lambda: present(shared_bus, "/room") == ["alice"], 30, "alice present on /room" + server.log())
    (member,) = shared_bus.presence("/room")
    assert (member.user_id, member.host) == (7, socket.gethostname())
    assert shared_bus.presence("/secret/room") == []  # refused: no entry at all
    # alice polls no more: gone once the interval and grace after her poll have passed
    wait_for(lambda: present(shared_bus, "/room") == [], 30, "alice gone after her lease")
    assert shared_bus.presence("/secret/room") == []


def test_presence_drops_the_clients_of_a_worker_killed_9(procs: Any, bus_name: str, shared_bus: Bus) -> None:
    # a lease far longer than the waits below: only the killed workers' silence can remove bob
    server = start("gunicorn", procs, bus_name, long_polling_interval=600, presence=True)
    events: list[Any] = []
    stop = shared_bus.follow_presence(events.append)
    dlp_poll(server.port, "bob", {"/room": -1}, user=0)
    wait_for(lambda: present(shared_bus, "/room") == ["bob"], 30, "bob present")
    assert [(e.kind, e.channel, e.member.client_id) for e in events] == [("join", "/room", "bob")]
    late = Bus(bus_name)  # a reader that starts after the join learns it from the workers' snapshots
    try:
        wait_for(lambda: present(late, "/room") == ["bob"], 30, "bob known to a late reader")
    finally:
        late.close()
    workers = workers_of(server.proc.pid)
    assert workers, server.log()
    for pid in workers:
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: present(shared_bus, "/room") == [], 60, "bob gone with his killed worker")
    wait_for(lambda: len(events) == 2, 10, "the leave event")
    assert (events[1].kind, events[1].member.client_id) == ("leave", "bob")
    stop()
