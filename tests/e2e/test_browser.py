"""The real npm ``message-bus-client`` in headless Chromium, through gunicorn with 2 workers.

For each client mode (chunked streaming, ``enableChunkedEncoding = false``, ``enableLongPolling = false``, a
hidden tab) and each server shell (ASGI under ``uvicorn.workers.UvicornWorker``, WSGI under ``gevent``, shmbus's
own server ``shmbus.adapters.server.GunicornWorker``), the page
(``page.html``) subscribes from id 0 and publishes at least K messages through an HTTP route, one connection each,
until both workers have published; every message must arrive once, in order. The mode is checked twice: from the
page's own record of its requests (``?dlp=t``, ``Dont-Chunk``, response type, progress events) and from the
server's request log (``e2e_app.py``), which also shows that messages published by one worker were delivered by
the other one's poll, and (streaming, long polling) that they were pushed to a request that was already waiting.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shmbus import Bus
from tests import harness
from tests.harness import skip_or_fail
from tests.harness.browser import E2E_DIR, require_browser, run_page

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

K = 30
CHANNEL = "/e2e/chat"
GUNICORN_CONFIG = "python:shmbus.adapters.integrations.gunicorn"
NPM_CLIENT = E2E_DIR / "node_modules" / "message-bus-client"
VENDORED = E2E_DIR.parent.parent / "adapters" / "http" / "static"
MODES = ["stream", "nochunk", "poll", "background"]
SHELLS = {
    "asgi-uvicornworker": ("e2e_app:asgi_app", "uvicorn.workers.UvicornWorker"),
    "wsgi-gevent": ("e2e_app:wsgi_app", "gevent"),
    # shmbus's own server: bus routes served natively (tests/server/e2e_native.py logs them)
    "shmbus-server": ("e2e_native:app", "shmbus.adapters.server.GunicornWorker"),
}
SERVER_DIR = E2E_DIR.parent / "server"


def require_client() -> None:
    __tracebackhide__ = True
    require_browser()
    if not (NPM_CLIENT / "assets" / "message-bus.js").exists():
        skip_or_fail(f"message-bus-client not installed in {E2E_DIR} (run scripts/test, or npm ci there)")


@pytest.fixture
def bus(bus_name: str) -> Iterator[Bus]:
    b = Bus(bus_name, keepalive_interval=0, create=True)
    try:
        yield b
    finally:
        b.destroy()


def read_log(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return ([e for e in entries if e["kind"] == "poll"], [e for e in entries if e["kind"] == "publish"])


def start_server(procs: Any, bus_name: str, shell: str, log_path: Path) -> Any:
    spec, worker_class = SHELLS[shell]
    env = {"SHMBUS_TEST_BUS": bus_name, "SHMBUS_E2E_LOG": str(log_path)}
    if shell == "shmbus-server":
        return procs.gunicorn_server(
            spec, workers=2, worker_class=worker_class, env=env, app_dir=SERVER_DIR, health_path="/page"
        )
    harness.require_module("uvicorn" if worker_class.startswith("uvicorn") else worker_class)
    return procs.gunicorn_server(
        spec,
        workers=2,
        worker_class=worker_class,
        config=GUNICORN_CONFIG,
        env=env,
        app_dir=E2E_DIR,
        health_path="/page",
    )


def check_delivery(res: dict[str, Any], server_log: str) -> None:
    """Every published message once, in publish order; both workers published."""
    published, received = res["published"], res["received"]
    assert len(published) >= K
    assert len({p["pid"] for p in published}) == 2, f"only one worker published: {published}"
    assert [p["id"] for p in published] == list(range(1, len(published) + 1)), "ids are not 1..n"
    got = [(r["i"], r["id"]) for r in received]
    want = [(p["i"], p["id"]) for p in published]
    assert got == want, (
        f"lost/duplicated/reordered: want {len(want)} got {len(got)}\n"
        f"missing {sorted(set(want) - set(got))}\nreceived {got}{server_log}"
    )
    assert [(r["pid"], r["gid"]) for r in received] == [(p["pid"], p["gid"]) for p in published]


def check_mode(mode: str, res: dict[str, Any], polls: list[dict[str, Any]], pubs: list[dict[str, Any]]) -> None:
    """The client really used ``mode``: from the page's XHR record and from the server's request log."""
    xhrs = [x for x in res["xhrs"] if "/message-bus/" in x["url"]]
    assert xhrs and polls
    # the request in flight when the page stopped the client was aborted: it may have no response at all
    answered = [p for p in polls if p["status"] is not None]
    assert len(answered) >= len(polls) - 1 and all(p["status"] == 200 for p in answered), polls
    polls = answered
    assert res["hidden"] is (mode == "background")
    pub_by_gid = {p["gid"]: p for p in pubs}
    delivered = {g: p for p in polls for g in p["gids"]}
    # cross-worker: some message published by one worker reached the browser through the other worker's poll
    assert any(pub_by_gid[g]["pid"] != p["pid"] for g, p in delivered.items() if g in pub_by_gid), polls
    # pushed live: published while the request that carried it was already waiting
    pushed = [p for p in polls if any(pub_by_gid[g]["t"] > p["t0"] for g in p["gids"] if g in pub_by_gid)]
    if mode == "stream":
        assert all("dlp=t" not in x["url"] and not x["dontChunk"] for x in xhrs), xhrs
        assert all("dlp=t" not in p["query"] and not p["dont_chunk"] for p in polls), polls
        assert all(p["ctype"].startswith("text/plain") for p in polls), polls
        assert any(x["ctype"].startswith("text/plain") and x["progress"] >= 2 for x in xhrs), xhrs
        # one streamed response carried several live messages in separate writes
        assert any(p["writes"] >= 3 and len(p["gids"]) >= 2 for p in pushed), polls
        assert len(polls) < len(res["published"]), "streaming should need far fewer requests than messages"
    elif mode == "nochunk":
        assert all("dlp=t" not in x["url"] and x["dontChunk"] for x in xhrs), xhrs
        assert all("dlp=t" not in p["query"] and p["dont_chunk"] for p in polls), polls
        assert all(p["ctype"].startswith("application/json") for p in polls), polls
        assert pushed, f"no long poll was parked and then answered with a live message: {polls}"
    else:  # poll, background: ?dlp=t, answered at once (never parked)
        assert all("dlp=t" in x["url"] and x["dontChunk"] for x in xhrs), xhrs
        assert all("dlp=t" in p["query"] and p["dont_chunk"] for p in polls), polls
        assert all(p["ctype"].startswith("application/json") for p in polls), polls
        assert len(polls) >= 3, polls


@pytest.mark.parametrize("shell", list(SHELLS))
@pytest.mark.parametrize("mode", MODES)
def test_npm_client_modes(mode: str, shell: str, bus: Bus, procs: Any, tmp_path: Path) -> None:
    require_client()
    for attempt in range(3):
        # The kernel decides which worker accepts each publish. Under load it may hand one worker all of them,
        # and then nothing crossed workers: run the page again (a fresh server, log and channel), at most twice.
        log_path = tmp_path / f"requests-{attempt}.jsonl"
        log_path.touch()
        server = start_server(procs, bus.name, shell, log_path)
        run = run_page(f"{server.url}/page?mode={mode}&ch={CHANNEL}{attempt}&k={K}", timeout=60)
        server_log = f"\n--- driver stderr ---\n{run.stderr[-3000:]}\n--- server log ---\n{server.log()[-3000:]}"
        assert run.done, f"page did not finish (rc={run.returncode}){server_log}"
        assert len(run.messages) == 1 and "error" not in run.messages[0], f"{run.messages}{server_log}"
        res = run.messages[0]
        if attempt < 2 and len({p["pid"] for p in res["published"]}) < 2:
            server.stop()
            continue
        break
    check_delivery(res, server_log)
    # a poll is logged when it ends: wait until the server has seen the end of every request the page made
    n_xhrs = sum("/message-bus/" in x["url"] for x in res["xhrs"])
    deadline = time.monotonic() + 30
    while len(read_log(log_path)[0]) < n_xhrs and time.monotonic() < deadline:
        time.sleep(0.1)
    polls, pubs = read_log(log_path)
    assert len(polls) == n_xhrs, f"server logged {len(polls)} polls, the page made {n_xhrs}{server_log}"
    assert len(pubs) == len(res["published"])
    check_mode(mode, res, polls, pubs)


def test_vendored_client_is_the_npm_package() -> None:
    """The vendored message-bus.js (served at /message-bus/assets/) is byte-identical to the npm package the
    browser tests use."""
    require_client()
    version = json.loads((NPM_CLIENT / "package.json").read_text())["version"]
    assert (VENDORED / "message-bus.js").read_bytes() == (NPM_CLIENT / "assets" / "message-bus.js").read_bytes(), (
        f"adapters/http/static/message-bus.js differs from message-bus-client {version}"
    )
    assert (VENDORED / "LICENSE.message-bus-client").read_bytes() == (NPM_CLIENT / "LICENSE").read_bytes()
    assert version in (VENDORED / "README.md").read_text()
