"""The browser client served by the middleware (``/message-bus/assets/``), through every server shell.

Raw HTTP first: the three files (the npm client, its adapter, the shared client), byte for byte, with a
JavaScript content type; HEAD, a wrong method, an unknown name, and a client whose id is ``assets`` still polls.
Then headless Chromium: a page whose only scripts are the npm client and its adapter receives a message published
by the server (and the adapter set ``MessageBus.baseUrl`` from its own URL).
"""

from __future__ import annotations

import http.client
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shmbus import Bus
from tests.harness.browser import run_page

from .test_browser import SHELLS, VENDORED, require_client, start_server

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ASSETS = ("message-bus.js", "message-bus-ajax.js", "message-bus-shared.js")


@pytest.fixture
def bus(bus_name: str) -> Iterator[Bus]:
    b = Bus(bus_name, keepalive_interval=0, create=True)
    try:
        yield b
    finally:
        b.destroy()


def request(url: str, method: str, path: str, body: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=15)
    try:
        headers = {"content-type": "application/x-www-form-urlencoded"} if body is not None else {}
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


@pytest.mark.parametrize("shell", list(SHELLS))
def test_every_shell_serves_the_client_and_its_adapter(shell: str, bus: Bus, procs: Any, tmp_path: Path) -> None:
    log_path = tmp_path / "requests.jsonl"
    log_path.touch()
    server = start_server(procs, bus.name, shell, log_path)
    for name in ASSETS:
        status, headers, body = request(server.url, "GET", f"/message-bus/assets/{name}")
        assert status == 200 and body == (VENDORED / name).read_bytes(), (name, status, body[:200])
        assert headers["content-type"].startswith("text/javascript")
        status, headers, body = request(server.url, "HEAD", f"/message-bus/assets/{name}")
        assert status == 200 and body == b""
    status, _, body = request(server.url, "POST", "/message-bus/assets/message-bus.js", b"")
    assert status == 405 and b"GET" in body
    status, _, body = request(server.url, "GET", "/message-bus/assets/jquery.js")
    assert status == 404 and b"message-bus-ajax.js" in body
    status, headers, body = request(server.url, "POST", "/message-bus/assets/poll?dlp=t", b"%2Fx=-1")
    assert status == 200 and headers["content-type"].startswith("application/json"), body


def test_a_page_loading_only_the_served_assets_receives_a_message(bus: Bus, procs: Any, tmp_path: Path) -> None:
    require_client()
    log_path = tmp_path / "requests.jsonl"
    log_path.touch()
    server = start_server(procs, bus.name, "asgi-uvicornworker", log_path)
    run = run_page(f"{server.url}/assets-page?ch=/assets/page", timeout=40)
    assert run.done, f"page did not finish (rc={run.returncode})\n{run.stderr[-3000:]}\n{server.log()[-3000:]}"
    [res] = run.messages
    assert "error" not in res, res
    assert [r["id"] for r in res["received"]] == [res["sent"]["id"]] == [1]
    assert res["received"][0]["data"]["i"] == 1
    assert res["baseUrl"] == res["origin"] + "/"
