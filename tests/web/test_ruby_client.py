"""The gem's Ruby ``MessageBus::HTTPClient`` request pattern through real servers.

Reproduced: ``POST /message-bus/<hex>/poll`` with a JSON body ``{channel: last_id}`` and no ``__seq``,
``Content-Type: application/json``, ``X-Silence-logger: true``, ``Dont-Chunk: true`` when long polling or chunking
is disabled, never ``?dlp=t``; the streamed body is buffered and split on ``\\r\\n|\\r\\n`` (no un-escaping);
``/__status`` updates the stored ids; the loop polls again after each response.
"""

from __future__ import annotations

import http.client
import json
import os
import secrets
import subprocess
import time
from typing import Any

import pytest

from shmbus import Bus
from tests import harness

from .web_servers import WEB_DIR, start

pytestmark = pytest.mark.slow
SEP = b"\r\n|\r\n"


class RubyLikeClient:
    def __init__(
        self,
        port: int,
        *,
        enable_long_polling: bool = True,
        enable_chunked_encoding: bool = True,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.port = port
        self.long_polling = enable_long_polling
        self.chunked = enable_chunked_encoding
        self.headers = headers or {}
        self.client_id = secrets.token_hex(16)
        self.channels: dict[str, int] = {}
        self.received: list[tuple[str, Any, int, int]] = []
        self.requests: list[dict[str, Any]] = []

    def subscribe(self, channel: str, last_message_id: Any = None) -> None:
        assert channel.startswith("/")
        self.channels[channel] = last_message_id if isinstance(last_message_id, int) else -1

    def _handle(self, messages: list[dict[str, Any]]) -> None:
        for m in messages:
            if m["channel"] == "/__status":
                for ch, last in m["data"].items():
                    if ch in self.channels:
                        self.channels[ch] = last
                continue
            if m["channel"] in self.channels:
                self.channels[m["channel"]] = m["message_id"]
                self.received.append((m["channel"], m["data"], m["message_id"], m["global_id"]))

    def poll_once(self) -> None:
        headers = {"Content-Type": "application/json", "X-Silence-logger": "true", **self.headers}
        if not self.long_polling or not self.chunked:
            headers["Dont-Chunk"] = "true"
        body = json.dumps(self.channels)
        self.requests.append({"headers": dict(headers), "body": json.loads(body)})
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            conn.request("POST", f"/message-bus/{self.client_id}/poll", body=body, headers=headers)
            resp = conn.getresponse()
            assert resp.status == 200
            if resp.getheader("Content-Type") == "application/json; charset=utf-8":
                self._handle(json.loads(resp.read()))
                return
            buf = b""
            while True:
                data = resp.read1(65536)
                if not data:
                    break
                buf += data
                while SEP in buf:
                    piece, buf = buf.split(SEP, 1)
                    self._handle(json.loads(piece))
        finally:
            conn.close()


@pytest.fixture
def shared_bus(bus_name: str) -> Any:
    b = Bus(bus_name, keepalive_interval=0, create=True)
    b.last_id("/x")
    try:
        yield b
    finally:
        b.destroy()


PUBLISH = (
    "import sys, time; from shmbus import Bus; b = Bus(sys.argv[1], keepalive_interval=0, create=True)\n"
    "time.sleep(float(sys.argv[2]))\n"
    "b.publish('/test', {'hello': 'world'}); b.publish('/test2', {'hello': 'world'})"
)


@pytest.mark.parametrize("server_kind", ["gunicorn", "uvicorn"])
@pytest.mark.parametrize("mode", ["streaming", "no-chunk", "no-long-poll", "user-dont-chunk"])
def test_ruby_http_client_pattern(procs: Any, bus_name: str, shared_bus: Bus, server_kind: str, mode: str) -> None:
    server = start(server_kind, procs, bus_name, long_polling_interval=1.0)
    client = RubyLikeClient(
        server.port,
        enable_chunked_encoding=mode != "no-chunk",
        enable_long_polling=mode != "no-long-poll",
        headers={"Dont-Chunk": "true"} if mode == "user-dont-chunk" else None,
    )
    client.subscribe("/test")
    client.subscribe("/test2")
    client.poll_once()  # -1 -> status: ids learnt
    assert client.channels == {"/test": 0, "/test2": 0}
    pub = procs.spawn_python(PUBLISH, bus_name, "0.3")
    deadline = time.monotonic() + 30
    while len(client.received) < 2 and time.monotonic() < deadline:
        client.poll_once()
    pub.communicate(timeout=30)
    assert sorted(client.received) == [("/test", {"hello": "world"}, 1, 1), ("/test2", {"hello": "world"}, 1, 2)]
    assert client.channels == {"/test": 1, "/test2": 1}
    for r in client.requests:
        assert "__seq" not in r["body"]
        assert ("Dont-Chunk" in r["headers"]) == (mode != "streaming")
    # nothing is delivered twice on the following polls
    client.poll_once()
    assert len(client.received) == 2


@pytest.mark.parametrize("server_kind", ["gunicorn", "uvicorn"])
@pytest.mark.parametrize("mode", ["streaming", "no-chunk", "no-long-poll"])
def test_the_gems_http_client(procs: Any, bus_name: str, shared_bus: Bus, server_kind: str, mode: str) -> None:
    """The gem's own ``MessageBus::HTTPClient`` (Ruby) against our servers: a backlog from id 0, live messages,
    a channel joined at -1 (the ``/__status`` reply), a targeted message it must not get; nothing twice."""
    gem_dir = harness.message_bus_gem("test_ruby_http_client_pattern (the client's requests, reproduced)")
    server = start(server_kind, procs, bus_name, long_polling_interval=1.0)
    backlog = [shared_bus.publish("/ruby", {"n": i}) for i in range(3)]
    ruby = subprocess.Popen(
        [
            "ruby",
            str(WEB_DIR / "gem_http_client.rb"),
            server.url,
            "0" if mode == "no-long-poll" else "1",
            "1" if mode == "streaming" else "0",
            "9",
        ],
        stdout=subprocess.PIPE,
        env=dict(os.environ, MESSAGE_BUS_GEM_DIR=str(gem_dir)),
        text=True,
    )
    try:
        lines: list[Any] = []

        def read(n: int) -> None:
            while len(lines) < n:
                line = ruby.stdout.readline()  # type: ignore[union-attr]
                assert line, f"the gem's client exited early: {lines}"
                lines.append(json.loads(line))

        read(3)
        live = [shared_bus.publish("/ruby", {"n": 10 + i}) for i in range(3)]
        read(6)  # by now the client has the status of /ruby2 too (it came with the first reply)
        later = [shared_bus.publish("/ruby2", "a"), shared_bus.publish("/ruby2", "b")]
        shared_bus.publish("/ruby2", "for user 99 only", user_ids=[99])
        marker = shared_bus.publish("/ruby2", "last")
        read(9)
        assert ruby.wait(30) == 0
    finally:
        if ruby.poll() is None:
            ruby.kill()
            ruby.wait()
    gids = [m.global_id for m in shared_bus.backlog("/ruby")] + [m.global_id for m in shared_bus.backlog("/ruby2")]
    assert lines == [
        ["/ruby", {"n": 0}, gids[0], backlog[0]],
        ["/ruby", {"n": 1}, gids[1], backlog[1]],
        ["/ruby", {"n": 2}, gids[2], backlog[2]],
        ["/ruby", {"n": 10}, gids[3], live[0]],
        ["/ruby", {"n": 11}, gids[4], live[1]],
        ["/ruby", {"n": 12}, gids[5], live[2]],
        ["/ruby2", "a", gids[6], later[0]],
        ["/ruby2", "b", gids[7], later[1]],
        ["/ruby2", "last", gids[9], marker],  # the targeted message (gids[8]) never reached it
    ]
