"""Presence seen by the real npm ``message-bus-client`` in headless Chromium, through gunicorn ``gevent`` workers.

A watcher page subscribes to the presence view ``/__presence/e2e/room`` as to any channel (and to the view of a
channel the server's ``subscribe_allowed`` refuses); a member page subscribes to ``/e2e/room`` and ends once it
sees itself listed, which closes its tab. The watcher must see the member listed and then leave: by its lease
(the long-polling interval and the grace after its last poll), and, on a server whose lease is 600 s, because its
worker was killed -9 (the watcher's own server, on the same bus, publishes the leave once the killed worker's
announcements stop). Nothing of the refused view reaches the watcher. The waits are bounded, never timed.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import pytest

from shmbus import Bus
from tests.harness.browser import E2E_DIR, PageRun, run_page
from tests.harness.procs import proc_stats
from tests.harness.wait import wait_for

from .test_browser import bus, require_client

__all__ = ["bus"]

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOM = "/e2e/room"


def start(procs: Any, bus_name: str, lpi: float) -> Any:
    env = {"SHMBUS_TEST_BUS": bus_name, "SHMBUS_E2E_LPI": str(lpi)}
    return procs.gunicorn_server(
        "presence_app:app", workers=2, worker_class="gevent", env=env, app_dir=E2E_DIR, health_path="/presence-page"
    )


def names(bus: Bus, channel: str) -> list[str]:
    return [m.client_id for m in bus.presence(channel)]


def watch(url: str) -> tuple[threading.Thread, list[PageRun]]:
    out: list[PageRun] = []
    thread = threading.Thread(target=lambda: out.append(run_page(f"{url}/presence-page?role=watcher&ch={ROOM}", 120)))
    thread.start()
    return thread, out


def member_joined_then_left(watcher: PageRun, member: str) -> None:
    views = [m for m in watcher.messages if isinstance(m, dict) and "view" in m]
    assert views and all(m["view"] == "/__presence" + ROOM for m in views), "the refused view sent something"
    listed = left = None
    for i, m in enumerate(views):
        data = m["data"]
        assert data["channel"] == ROOM
        if data["type"] == "snapshot" and member in [x[0] for x in data["members"]]:
            listed = i if listed is None else listed
        if data["type"] == "change":
            if member in [x[0] for x in data["join"]]:
                listed = i if listed is None else listed
            if member in [x[0] for x in data["leave"]]:
                left = i
    assert listed is not None and left is not None and listed <= left, views


def run_member(url: str) -> str:
    run = run_page(f"{url}/presence-page?role=member&ch={ROOM}", 60)
    assert run.done and run.messages and "clientId" in run.messages[0], (run.messages, run.stderr[-2000:])
    return str(run.messages[0]["clientId"])


def test_a_closed_tab_leaves_the_presence_view(bus: Bus, procs: Any) -> None:
    require_client()
    server = start(procs, bus.name, lpi=2)
    thread, out = watch(server.url)
    try:
        wait_for(lambda: len(names(bus, "/e2e/watchers")) == 1, 90, "the watcher page polling" + server.log())
        member = run_member(server.url)  # its tab is closed when this returns
        assert member in names(bus, ROOM)
        wait_for(lambda: member not in names(bus, ROOM), 60, "the member gone after its lease")
    finally:
        thread.join(180)
    (watcher,) = out
    assert watcher.done, (watcher.messages, watcher.stderr[-2000:], server.log()[-2000:])
    member_joined_then_left(watcher, member)


def test_the_tab_of_a_worker_killed_9_leaves_the_presence_view(bus: Bus, procs: Any) -> None:
    require_client()
    member_server = start(procs, bus.name, lpi=600)  # a lease of 600 s: only the kill can end it in time
    watcher_server = start(procs, bus.name, lpi=2)
    thread, out = watch(watcher_server.url)
    try:
        wait_for(lambda: len(names(bus, "/e2e/watchers")) == 1, 90, "the watcher page polling")
        member = run_member(member_server.url)
        assert member in names(bus, ROOM)
        workers = [pid for pid, f in proc_stats() if len(f) > 1 and int(f[1]) == member_server.proc.pid]
        assert workers
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
        wait_for(lambda: member not in names(bus, ROOM), 60, "the member gone with its killed worker")
    finally:
        thread.join(180)
    (watcher,) = out
    assert watcher.done, (watcher.messages, watcher.stderr[-2000:], watcher_server.log()[-2000:])
    member_joined_then_left(watcher, member)
