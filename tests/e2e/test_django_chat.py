"""``examples/django_chat`` end to end: ``run.py`` migrates and serves the project with gunicorn (2 gthread
workers); two Chromium browsers join under two names through the join form (CSRF token, session cookie);
one posts through the chat's view, which saves the row and publishes it on commit; the other, subscribed with
the npm client, receives every message, published by both workers, and lists both in the room (presence, from
its view channel /__presence/chat). Then SIGTERM to ``run.py`` stops gunicorn
and removes the bus, leaving no process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests import harness
from tests.harness import REPO_ROOT
from tests.harness.browser import run_page
from tests.harness.procs import free_port, group_alive, wait_http
from tests.harness.shm import files_for_bus

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RUN = REPO_ROOT / "examples" / "django_chat" / "run.py"
COUNT = 12


def test_two_browsers_chat_across_workers(bus_name: str, procs: Any, tmp_path: Path) -> None:
    harness.require_module("django", "pip install -e '.[all,test]' (the django extra), or run scripts/test")
    port = free_port()
    # --keep-alive 0: each post opens its own connection, so the kernel spreads the posts over both workers
    proc = procs.spawn(
        [
            sys.executable,
            str(RUN),
            "--port",
            str(port),
            "--bus",
            bus_name,
            "--sqlite",
            str(tmp_path / "db"),
            "--keep-alive",
            "0",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    assert wait_http(url + "/", timeout=60, proc=proc) == 200
    assert proc.stdout.readline().startswith(f"django_chat: {url}/"), "run.py announced no URL"
    with ThreadPoolExecutor(2) as runner:
        listener = runner.submit(run_page, f"{url}/?as=bob&report={COUNT}", 90)
        time.sleep(3)  # bob joins and subscribes (messages after his page's bus position arrive anyway)
        sender = runner.submit(run_page, f"{url}/?as=alice&send={COUNT}", 60)
        sent, heard = sender.result(timeout=120), listener.result(timeout=120)
    assert sent.done, f"alice's page did not post: {sent.messages} {sent.stderr[-2000:]}"
    assert heard.done, f"bob's page did not hear {COUNT} messages: {heard.messages} {heard.stderr[-2000:]}"
    *heard_messages, room = heard.messages
    assert room == {"room": ["alice", "bob"]}, "the room's presence list (by user name) lacks someone"
    heard.messages = heard_messages
    posted = [m["id"] for m in sent.messages]
    assert [m["id"] for m in heard.messages] == posted, "lost, duplicated or out of order"
    assert all(m["user"] == "alice" and m["text"].startswith("hello ") for m in heard.messages)
    pids = {m["pid"] for m in heard.messages}
    assert len(pids) == 2, f"the posts were not served by both workers: {sent.messages}"

    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    deadline = time.monotonic() + 10
    while group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not group_alive(proc.pid), "a gunicorn process outlived run.py"
    assert not files_for_bus(bus_name), "run.py left its bus behind"
