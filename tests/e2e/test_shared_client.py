"""``message-bus-shared.js`` in real Chromium through gunicorn (2 ``gevent`` workers): one poll per browser.

Each test opens tabs of ``shared_app.py``'s ``/tab`` page in browser contexts of one Chromium (``tabs.mjs``;
a context is a browser profile of its own: cookies, storage, shared workers) and reads the polls from the
server's log (client id, user, when each began and last wrote). Transports: ``worker`` (Chromium's SharedWorker),
``leader`` (``SharedWorker`` hidden: a tab elected by Web Locks polls for all over a BroadcastChannel), ``plain``
(Web Locks hidden too: one poll per tab). Every message is checked by id: each tab's record must be exactly what
it subscribed to, once, in order, ending with a fence published last.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shmbus import Bus
from tests.harness import require_module
from tests.harness.browser import E2E_DIR

from .tabs import Tabs

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

GUNICORN_CONFIG = "python:shmbus.adapters.integrations.gunicorn"
HIDE = {"worker": "", "leader": "no=worker", "plain": "no=worker,leader"}


@pytest.fixture
def bus(bus_name: str) -> Iterator[Bus]:
    b = Bus(bus_name, keepalive_interval=0, create=True)
    try:
        yield b
    finally:
        b.destroy()


class Site:
    """The server, its poll log and the browser."""

    def __init__(self, server: Any, log: Path, tabs: Tabs) -> None:
        self.server, self.log_path, self.tabs = server, log, tabs

    def url(self, transport: str, extra: str = "") -> str:
        q = "&".join(x for x in (HIDE[transport], extra) if x)
        return f"{self.server.url}/tab" + (f"?{q}" if q else "")

    def polls(self) -> list[dict[str, Any]]:
        """The polls that ended (each is logged when it ends)."""
        lines = [json.loads(line) for line in self.log_path.read_text().splitlines() if line.strip()]
        return [e for e in lines if e["kind"] == "poll"]

    def ended(self, timeout: float = 60.0) -> list[dict[str, Any]]:
        """Every poll, once every poll that started has ended (call after closing the tabs)."""
        deadline = time.monotonic() + timeout
        while True:
            lines = [json.loads(line) for line in self.log_path.read_text().splitlines() if line.strip()]
            started = {e["key"] for e in lines if e["kind"] == "start"}
            polls = [e for e in lines if e["kind"] == "poll"]
            if started == {p["key"] for p in polls}:
                return polls
            assert time.monotonic() < deadline, f"polls still open {timeout} s after the tabs closed{self.diag()}"
            time.sleep(0.1)

    def diag(self) -> str:
        return f"\n--- browser ---\n{self.tabs.log()}\n--- server ---\n{self.server.log()[-3000:]}"


@pytest.fixture
def site(bus: Bus, procs: Any, tmp_path: Path) -> Iterator[Site]:
    require_module("gevent")
    log = tmp_path / "polls.jsonl"
    log.touch()
    server = procs.gunicorn_server(
        "shared_app:app",
        workers=2,
        worker_class="gevent",
        config=GUNICORN_CONFIG,
        env={"SHMBUS_TEST_BUS": bus.name, "SHMBUS_E2E_LOG": str(log)},
        app_dir=E2E_DIR,
        health_path="/tab",
    )
    tabs = Tabs()
    try:
        yield Site(server, log, tabs)
    finally:
        tabs.quit()


def max_open(polls: list[dict[str, Any]], since: float, until: float) -> int:
    """The most polls open at one instant of [since, until] (a poll: from its start to its last write)."""
    edges = []
    for p in polls:
        a, b = max(p["t0"], since), min(p["t1"], until)
        if a <= b:
            edges += [(a, 1), (b, -1)]
    most = cur = 0
    for _, d in sorted(edges, key=lambda e: (e[0], -e[1])):
        cur += d
        most = max(most, cur)
    return most


def got(tabs: Tabs, tab: int, ch: str) -> list[list[Any]]:
    return list(tabs.eval(tab, f"T.got[{json.dumps(ch)}] || []"))


def open_tabs(site: Site, ctx: int, n: int, transport: str, extra: str = "") -> list[int]:
    out = [site.tabs.open(ctx, site.url(transport, extra)) for _ in range(n)]
    for t in out:
        want = "plain" if transport == "plain" else transport
        assert site.tabs.eval(t, "MessageBus.transport") == want, site.diag()
    return out


def settle_and_count(site: Site, bus: Bus, tabs_in: list[int], ch: str) -> tuple[float, float]:
    """After the long-poll interval (a poll the browser aborted earlier has ended on the server), a window in
    which messages flow through one more long-poll renewal: its bounds on the host's monotonic clock."""
    time.sleep(4)  # > the app's 3 s long-poll interval: not a verdict, a settling time
    since = time.monotonic()
    for k in range(40):
        bus.publish(ch, {"k": k})
        time.sleep(0.1)
    for t in tabs_in:
        site.tabs.wait_for(t, f"T.n({json.dumps(ch)}) >= 40", what=f"40 messages on {ch}")
    return since, time.monotonic()


@pytest.mark.parametrize("transport", ["worker", "leader"])
def test_ten_tabs_hold_one_poll_and_each_gets_its_channels(transport: str, site: Site, bus: Bus) -> None:
    tabs = site.tabs
    ctx = tabs.context()
    ids = open_tabs(site, ctx, 10, transport)
    mine = {t: ["/ten/all", f"/ten/{i % 3}"] for i, t in enumerate(ids)}
    for t, chs in mine.items():
        for ch in chs:
            tabs.eval(t, f"T.sub({json.dumps(ch)}, 0)")
    sent: dict[str, list[list[Any]]] = {}
    for k in range(20):
        for ch in ("/ten/all", "/ten/0", "/ten/1", "/ten/2", "/ten/none"):
            mid = bus.publish(ch, {"k": k})
            sent.setdefault(ch, []).append([mid, {"k": k}])
    for ch in ("/ten/all", "/ten/0", "/ten/1", "/ten/2"):  # the fence: published last, so nothing may follow
        mid = bus.publish(ch, "fence")
        sent[ch].append([mid, "fence"])
    for t, chs in mine.items():
        for ch in chs:
            tabs.wait_for(t, f"T.n({json.dumps(ch)}) >= {len(sent[ch])}", what=f"{ch} complete")
        assert set(tabs.eval(t, "Object.keys(T.got)")) == set(chs)
        for ch in chs:
            assert got(tabs, t, ch) == sent[ch], f"tab {t} {ch}{site.diag()}"
    since, until = settle_and_count(site, bus, ids, "/ten/all")
    client_id = tabs.eval(ids[0], "MessageBus.clientId")
    assert {tabs.eval(t, "MessageBus.clientId") for t in ids} == {client_id}
    if transport == "leader":
        assert sum(bool(tabs.eval(t, "MessageBus.leading")) for t in ids) == 1
    for t in ids:
        tabs.close(t)
    polls = site.ended()
    assert {p["cid"] for p in polls} == {client_id}, f"a tab polled on its own: {polls}{site.diag()}"
    assert max_open(polls, since, until) == 1, f"not one poll at a time: {polls}"
