"""The demo's details a newcomer met: the workers table counts streams (the npm client's default) and not only
parked long polls; the page's Spark command names the bus the demo runs on; ``/favicon.ico`` is served; the URL
is printed only once the demo's own workers answer on the port (a port in use used to print a URL anyway)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from typing import Any

import pytest

from shmbus import Bus
from tests.harness import REPO_ROOT
from tests.harness.procs import free_port, wait_http

from .test_demo import assert_stopped_cleanly

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
DEMO = str(REPO_ROOT / "scripts" / "demo")


def _get(url: str) -> tuple[int, str, bytes]:
    with _OPENER.open(url, timeout=10) as resp:
        return resp.status, resp.headers.get("content-type", ""), resp.read()


def test_streams_are_counted_the_bus_is_named_and_a_favicon_is_served(bus_name: str, procs: Any) -> None:
    port = free_port()
    proc = procs.spawn(
        [DEMO, "--port", str(port), "--bus", bus_name],
        env={"SHMBUS_SKIP_INSTALL": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    assert wait_http(url + "/whoami", timeout=60, proc=proc) == 200
    _, _, page = _get(url + "/")
    assert f"--bus {bus_name} --checkpoint".encode() in page and b"--bus demo" not in page
    status, ctype, icon = _get(url + "/favicon.ico")
    assert status == 200 and ctype.startswith("image/") and icon.startswith(b"<svg")

    s = socket.create_connection(("127.0.0.1", port), timeout=20)  # a streaming poll, as the npm client holds
    body = b"%2Fchat=0&__seq=1"
    s.sendall(
        b"POST /message-bus/streamer/poll HTTP/1.1\r\nHost: x\r\nContent-Type: "
        b"application/x-www-form-urlencoded\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    assert b"200" in s.recv(65536).split(b"\r\n", 1)[0]
    watcher = Bus(bus_name, create=False, keepalive_interval=0)
    try:
        deadline = time.monotonic() + 30
        held = 0
        while time.monotonic() < deadline and not held:
            reports = [m.data for m in watcher.backlog("/dashboard/workers", 0)[-4:]]
            held = max((r.get("streams", 0) for r in reports), default=0)
            time.sleep(0.5)
        assert held == 1, f"the workers table never counted the open stream: {reports}"
    finally:
        watcher.close()
        s.close()
    os.killpg(proc.pid, signal.SIGINT)
    assert_stopped_cleanly(proc, bus_name)


def test_a_port_in_use_prints_no_url_and_says_why(bus_name: str, procs: Any) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(8)  # someone else's server: it accepts connections
    port = taken.getsockname()[1]
    try:
        proc = procs.spawn(
            [DEMO, "--port", str(port), "--bus", bus_name],
            env={"SHMBUS_SKIP_INSTALL": "1"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        _, err = proc.communicate(timeout=120)
    finally:
        taken.close()
    text = err.decode(errors="replace")
    assert proc.returncode != 0, text
    assert "open http://" not in text, text
    assert f"could not start on 127.0.0.1:{port}" in text and "port in use" in text
