"""The demo's "notify me" where no push service is reachable, end to end.

``scripts/demo --push-dev URL`` with the development push service (``shmbus push-dev``, a process of its own): a
device registers as the page's fallback does, a chat message is pushed to it and arrives there decrypted; once
the service is gone, the push the sender gives up on is said on the demo's status channel, naming that device.
And in Chromium offline (no host name resolves, so its own push service cannot be reached and its
``pushManager.subscribe()`` never settles): the page says so within its wait and how to use the development push
service; started with ``--push-dev``, it registers through that service instead, which then takes the chat's push.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
from typing import Any

import httpx
import pytest

from shmbus import Bus
from tests.harness.browser import E2E_DIR, require_browser
from tests.harness.wait import wait_for

from .test_demo import assert_stopped_cleanly, post_chat, start_demo

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

STATUS = "/demo/push-status"  # examples/demo/notify.py's


def start_push_dev(procs: Any) -> tuple[subprocess.Popen[str], str]:
    """``shmbus push-dev`` on a free port: ``(process, its URL)`` (the first line it prints)."""
    proc = procs.spawn([sys.executable, "-m", "shmbus.cli", "push-dev", "--port", "0", "--quiet"],
                       stdout=subprocess.PIPE, text=True)  # fmt: skip
    url = proc.stdout.readline().strip()
    assert url.startswith("http://127.0.0.1:"), f"shmbus push-dev printed {url!r} (exit {proc.poll()})"
    return proc, url


def wait_sender(url: str) -> None:
    """Until the demo's push sender is elected (its first term starts at the bus's head: a chat published before
    would not be pushed)."""
    up = re.compile(r"^shmbus_push_sender_up\{[^}]*\} 1(\.0)?$", re.M)
    wait_for(lambda: up.search(httpx.get(f"{url}/metrics", timeout=10, trust_env=False).text), timeout=60,
             what="the demo's push sender")  # fmt: skip


def pushed(dev_url: str, endpoint: str) -> list[dict[str, Any]]:
    answer = httpx.get(f"{dev_url}/deliveries", params={"endpoint": endpoint}, timeout=10, trust_env=False)
    deliveries: list[dict[str, Any]] = answer.json()["deliveries"]
    return deliveries


def click_notify(url: str, text: str) -> str:
    """A person in Chromium, offline, who allows notifications and clicks "Notify me": the status once it shows
    ``text`` (tests/e2e/user.mjs)."""
    node = require_browser()
    argv = [node, str(E2E_DIR / "user.mjs"), f"--say={url}/", "--click=#notify", "--list=#notify-status",
            f"--text={text}", "--grant=notifications", "--offline=1", "--timeout=60000"]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=200)
    assert proc.returncode == 0, f"user.mjs exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    status: str = json.loads(proc.stdout.splitlines()[-1])["say"]
    return status


def test_the_demo_pushes_to_the_dev_push_service(bus_name: str, procs: Any) -> None:
    dev, dev_url = start_push_dev(procs)
    proc, _port, url = start_demo(bus_name, procs, "--push-dev", dev_url)
    demo = httpx.Client(base_url=url, timeout=10, trust_env=False)
    assert demo.get("/push-dev").json() == {"url": dev_url}
    sub = demo.post("/push-dev", json={}).json()  # what the page's fallback registers as its own
    body = {"subscription": sub, "topics": ["/chat"]}
    registered = demo.post("/push/subscriptions", headers={"x-demo-user": "ann"}, json=body)
    assert registered.status_code == 201, registered.text
    wait_sender(url)

    posted = post_chat(url, "hello ann")
    (got,) = wait_for(lambda: pushed(dev_url, sub["endpoint"]), timeout=60, what="the push at the dev service")
    payload = got["payload"]  # decrypted there, with the keys of the subscription it handed out
    assert (payload["channel"], payload["message_id"]) == ("/chat", posted["id"])
    assert payload["data"]["text"] == "hello ann" and payload["data"]["pid"] == posted["pid"]

    dev.send_signal(signal.SIGTERM)  # no push service reachable any more
    assert dev.wait(timeout=30) == 0
    watcher = Bus(bus_name, create=False, keepalive_interval=0)
    try:
        post_chat(url, "are you there?")
        (status,) = wait_for(lambda: [m.data for m in watcher.backlog(STATUS, 0)], timeout=60, what="a status")
    finally:
        watcher.close()
    assert status["device"] == hashlib.sha256(sub["endpoint"].encode()).hexdigest()[:16]
    assert status["outcome"] == "failed" and "Connection refused" in status["why"], status
    demo.close()
    os.killpg(proc.pid, signal.SIGINT)
    assert_stopped_cleanly(proc, bus_name)


def test_notify_me_offline_says_no_push_service_is_reachable(bus_name: str, procs: Any) -> None:
    require_browser()
    proc, _port, url = start_demo(bus_name, procs)
    status = click_notify(url, "No push service reachable")
    # Chromium here never settles subscribe() (the page's own 10 s wait ends it); a build whose GCM fails fast
    # rejects it with an AbortError ("Registration failed - push service error"): both are "not reachable"
    assert re.search(r"this browser's push service (did not answer within 10 s|refused: )", status), status
    assert ".venv/bin/shmbus push-dev" in status and "scripts/demo --push-dev http://127.0.0.1:8030" in status
    os.killpg(proc.pid, signal.SIGINT)
    assert_stopped_cleanly(proc, bus_name)


def test_notify_me_offline_falls_back_to_the_dev_push_service(bus_name: str, procs: Any) -> None:
    require_browser()
    _dev, dev_url = start_push_dev(procs)
    proc, _port, url = start_demo(bus_name, procs, "--push-dev", dev_url)
    status = click_notify(url, "notifications on for new chat messages")
    assert "through the development push service: it takes the pushes in this browser's place" in status, status
    assert f"read them at {dev_url}/" in status
    wait_sender(url)
    posted = post_chat(url, "to the dev service")
    (got,) = wait_for(lambda: pushed(dev_url, ""), timeout=60, what="the push of the device the page registered")
    assert got["payload"]["message_id"] == posted["id"] and got["payload"]["data"]["text"] == "to the dev service"
    os.killpg(proc.pid, signal.SIGINT)
    assert_stopped_cleanly(proc, bus_name)
