"""Every folder of ``examples/`` started by the one command its README gives, as a real process: its page is
served, a message published through the app arrives over HTTP (a poll, or the SSE stream), and a person's use of
the page in headless Chromium (type a line or click a vote in one tab, see it in the other).

The command is read from the README's first fenced block (so the documented command is the tested one); the
test adds only a free port (and, for two hosts, a private Redis and bus names).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from shmbus.segment import Segment
from tests.harness import REPO_ROOT
from tests.harness.browser import E2E_DIR, require_browser
from tests.harness.procs import free_port, kill_tree, wait_http

EXAMPLES = REPO_ROOT / "examples"
FENCE = re.compile(r"^```[a-z]*\n(.*?)^```", re.S | re.M)


def readme_command(example: str) -> list[str]:
    """The example's one command (the README's first fenced block, comments dropped), as argv."""
    block = FENCE.search((EXAMPLES / example / "README.md").read_text())
    assert block, f"examples/{example}/README.md has no command block"
    argv = shlex.split(block.group(1), comments=True)
    if argv[0] == "gunicorn":
        return [sys.executable, "-m", "gunicorn", *argv[1:]]
    assert argv[0] == "python", argv
    return [sys.executable, *argv[1:]]


@pytest.fixture
def start(procs: Any, tmp_path: Path) -> Iterator[Callable[..., str]]:
    """``start(argv, port, env)`` -> the base URL once ``/`` answers; the process group is stopped at teardown
    (SIGTERM, as Ctrl-C would)."""
    started: list[subprocess.Popen[Any]] = []
    logs: list[Path] = []

    def run(argv: list[str], port: int, env: dict[str, str]) -> str:
        log = tmp_path / f"server-{len(logs)}.log"
        logs.append(log)
        with log.open("wb") as out:
            proc = procs.spawn(argv, env=env, cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT)
        started.append(proc)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_http(url + "/", timeout=30, proc=proc)
        except (RuntimeError, TimeoutError) as exc:
            raise AssertionError(f"{argv} did not start: {exc}\n{log.read_text(errors='replace')}") from None
        return url

    yield run
    for proc in started:
        kill_tree(proc)


def gunicorn_example(start: Callable[..., str], example: str, bus_name: str) -> Iterator[str]:
    port = free_port()
    argv = readme_command(example)
    argv[-1:-1] = ["--bind", f"127.0.0.1:{port}"]  # before the app spec
    try:
        yield start(argv, port, {"SHMBUS_NAME": bus_name})
    finally:
        Segment.destroy_by_name(bus_name)


def poll_until(url: str, channel: str, want: Callable[[Any], bool], timeout: float = 20.0) -> list[Any]:
    """Poll (``dlp=t``, as a client does between long polls) ``channel`` from id 0 until a message's data
    satisfies ``want``; every data seen."""
    client_id = uuid.uuid4().hex
    deadline = time.monotonic() + timeout
    seen: list[Any] = []
    while time.monotonic() < deadline:
        r = httpx.post(f"{url}/message-bus/{client_id}/poll?dlp=t", data={channel: "0"}, timeout=10, trust_env=False)
        assert r.status_code == 200, r.text
        seen = [m["data"] for m in r.json() if m["channel"] == channel]
        if any(want(d) for d in seen):
            return seen
        time.sleep(0.1)
    raise AssertionError(f"nothing wanted on {channel} within {timeout}s; saw {seen}")


def check_page(url: str) -> str:
    page = httpx.get(url + "/", timeout=10, trust_env=False).text
    for src in re.findall(r'<script src="([^"]+)"', page):
        r = httpx.get(url + src, timeout=10, trust_env=False)
        assert r.status_code == 200 and "javascript" in r.headers["content-type"], (src, r.status_code)
    return page


def user(see: str, say: str, action: str, list_: str, text: str) -> dict[str, Any]:
    """A person in Chromium: on the ``say`` page, type ``text`` into ``action`` (``input=SELECTOR``) or click
    (``click=SELECTOR``); ``text`` must then show in ``list_`` on both pages (tests/e2e/user.mjs)."""
    node = require_browser()
    argv = [node, str(E2E_DIR / "user.mjs"), f"--see={see}", f"--say={say}", f"--{action}"]
    argv += [f"--list={list_}", f"--text={text}", "--timeout=30000"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, f"user.mjs exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    result: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
    return result


def test_flask_chat(start: Callable[..., str], bus_name: str) -> None:
    for url in gunicorn_example(start, "flask_chat", bus_name):
        assert "/message-bus/assets/message-bus.js" in check_page(url)
        r = httpx.post(url + "/say", data={"text": "hello over http"}, timeout=10, trust_env=False)
        assert r.status_code == 200 and r.json()["id"] >= 1, r.text
        poll_until(url, "/chat", lambda d: d["text"] == "hello over http")
        assert httpx.post(url + "/say", data={"text": " "}, timeout=10, trust_env=False).status_code == 400
        seen = user(url + "/", url + "/", "input=#text", "#log", "hello from chromium")
        assert "hello from chromium" in seen["see"]
        check_moderators_only(url)


def check_moderators_only(url: str) -> None:
    """``/moderators``: anyone may write, only a moderator's session reads it (``subscribe_allowed``)."""
    r = httpx.post(url + "/say", data={"text": "for the mods", "to": "moderators"}, timeout=10, trust_env=False)
    assert r.json() == {"sent": True}, r.text  # no id: it would count the moderators' messages
    body = {"/moderators": "0", "/chat": "-1"}
    with httpx.Client(base_url=url, timeout=10, trust_env=False) as anyone:
        r = anyone.post(f"/message-bus/{uuid.uuid4().hex}/poll?dlp=t", data=body)
        assert [(m["channel"], list(m["data"])) for m in r.json()] == [("/__status", ["/chat"])], r.text
        assert r.headers["shmbus-refused-channels"] == "/moderators"
    with httpx.Client(base_url=url, timeout=10, trust_env=False) as moderator:
        assert moderator.get("/moderate").status_code == 302
        r = moderator.post(f"/message-bus/{uuid.uuid4().hex}/poll?dlp=t", data=body)
        assert [m["data"]["text"] for m in r.json() if m["channel"] == "/moderators"] == ["for the mods"]
        assert "shmbus-refused-channels" not in r.headers


def test_falcon_votes(start: Callable[..., str], bus_name: str) -> None:
    for url in gunicorn_example(start, "falcon_votes", bus_name):
        assert "/message-bus/assets/message-bus-ajax.js" in check_page(url)
        for choice in ("tabs", "spaces", "tabs"):
            r = httpx.post(url + "/vote", params={"choice": choice}, timeout=10, trust_env=False)
            assert r.status_code == 200, r.text
        seen = poll_until(url, "/votes", lambda d: True)
        assert sorted(d["choice"] for d in seen) == ["spaces", "tabs", "tabs"]
        assert httpx.post(url + "/vote", params={"choice": "emacs"}, timeout=10, trust_env=False).status_code == 400
        # a fourth vote, clicked: both pages count the three earlier ones (the backlog) and this one (live)
        seen = user(url + "/", url + "/", "click=button[data-choice=spaces]", "body", "spaces: 2")
        assert "tabs: 2" in seen["see"] and "spaces: 2" in seen["say"]


def test_fastapi_sse(start: Callable[..., str], bus_name: str) -> None:
    for url in gunicorn_example(start, "fastapi_sse", bus_name):
        page = check_page(url)
        assert 'new EventSource("/sse?prefix=/news&events=message")' in page
        sse_url = url + "/sse?prefix=/news&events=message"
        with httpx.Client(timeout=20, trust_env=False) as client, client.stream("GET", sse_url) as stream:
            assert stream.status_code == 200
            r = client.post(url + "/news/weather", json={"text": "sunny"})
            assert r.status_code == 200, r.text
            event: dict[str, str] = {}
            for line in stream.iter_lines():
                if line.startswith(("event:", "data:")):
                    key, _, value = line.partition(": ")
                    event[key] = value
                elif line == "" and "data" in event:
                    break
        assert "event" not in event, event  # unnamed: EventSource.onmessage receives it
        assert json.loads(event["data"])["channel"] == "/news/weather"
        assert json.loads(event["data"])["data"]["text"] == "sunny"
        assert httpx.post(url + "/news/Bad!", json={"text": "x"}, trust_env=False).status_code == 400
        seen = user(url + "/", url + "/", "input=#text", "#news", "rain at noon")
        assert "rain at noon" in seen["see"]


def test_two_hosts_on_redis(start: Callable[..., str], bus_name: str, redis_server: Any) -> None:
    port_a, port_b = free_port(), free_port()
    argv = readme_command("two_hosts")
    argv += ["--redis", redis_server.url, "--port-a", str(port_a), "--port-b", str(port_b)]
    argv += ["--bus-prefix", f"{bus_name}-"]
    try:
        url_a = start(argv, port_a, {})
        url_b = f"http://127.0.0.1:{port_b}"
        wait_http(url_b + "/", timeout=30)
        assert "Connected to host b" in check_page(url_b)
        r = httpx.post(url_a + "/say", json={"text": "from a"}, timeout=10, trust_env=False)
        assert httpx.post(url_a + "/say", json=["no"], timeout=10, trust_env=False).status_code == 400
        assert r.status_code == 200, r.text
        seen = poll_until(url_b, "/hosts/chat", lambda d: d["text"] == "from a")
        assert seen[-1]["host"] == "a"
        result = user(url_a + "/", url_b + "/", "input=#text", "#log", "said on b")
        assert "host bsaid on b" in result["see"]  # page a shows the line said on host b, from host b
    finally:
        for host in ("a", "b"):
            Segment.destroy_by_name(f"{bus_name}-{host}")
