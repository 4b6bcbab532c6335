"""``scripts/demo`` end to end: the command starts, serves the page and the vendored client, chat messages
published by both workers reach a streaming poll (the npm client's default mode) held by one of them, and
Ctrl-C (SIGINT to the process group, as a terminal sends it) stops everything and destroys the bus."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from harness import REPO_ROOT
from harness.procs import free_port, group_alive, wait_http
from harness.shm import files_for_bus

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def post_chat(url: str, text: str) -> dict[str, Any]:
    req = urllib.request.Request(f"{url}/chat", data=json.dumps({"user": "t", "text": text}).encode(),
                                 headers={"content-type": "application/json"}, method="POST")
    with _OPENER.open(req, timeout=10) as resp:
        return dict(json.loads(resp.read()))


def test_scripts_demo(bus_name: str, procs: Any) -> None:
    port = free_port()
    proc = procs.spawn([str(REPO_ROOT / "scripts" / "demo"), "--port", str(port), "--bus", bus_name],
                       env={"SHMBUS_SKIP_INSTALL": "1"}, stdout=subprocess.DEVNULL, stderr=None)
    url = f"http://127.0.0.1:{port}"
    assert wait_http(url + "/whoami", timeout=60, proc=proc) == 200
    with _OPENER.open(url + "/", timeout=10) as resp:
        assert b"message-bus.js" in resp.read()
    with _OPENER.open(url + "/static/message-bus.js", timeout=10) as resp:
        assert b"MessageBus" in resp.read()

    # a streaming poll (what the npm client does by default), then chats until both workers published
    s = socket.create_connection(("127.0.0.1", port), timeout=20)
    body = b"%2Fchat=0&__seq=1"
    s.sendall(b"POST /message-bus/demotest/poll HTTP/1.1\r\nHost: x\r\nContent-Type: "
              b"application/x-www-form-urlencoded\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    data = b""
    while b"[]\r\n|\r\n" not in data:
        chunk = s.recv(65536)
        assert chunk, data
        data += chunk
    assert b"text/plain" in data
    # 8 posts at a time, each on its own connection (the app closes it), until both workers have published
    pids: dict[int, int] = {}
    with ThreadPoolExecutor(8) as pool:
        for i in range(0, 800, 8):
            for r in pool.map(lambda k: post_chat(url, f"hello {k}"), range(i, i + 8)):
                pids[r["pid"]] = max(pids.get(r["pid"], 0), r["id"])
            if len(pids) == 2 and i >= 16:
                break
    assert len(pids) == 2, f"only one worker published: {pids}"
    last = max(pids.values())
    deadline = time.monotonic() + 20
    while data.count(b'"channel":"/chat"') < last and time.monotonic() < deadline:
        chunk = s.recv(65536)
        assert chunk
        data += chunk
    s.close()
    for pid in pids:
        assert f'"pid":{pid}'.encode() in data, "a worker's messages did not reach the stream"
    assert data.count(b'"channel":"/chat"') == last

    # Ctrl-C: SIGINT to the whole process group, as a terminal does
    os.killpg(proc.pid, signal.SIGINT)
    proc.wait(timeout=30)
    assert proc.returncode == 0
    deadline = time.monotonic() + 10
    while group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not group_alive(proc.pid)
    assert not files_for_bus(bus_name), "scripts/demo left its bus behind"
