"""Clients and helpers for the transport tests: an httpx SSE client, an ASGI send recorder, ``wait_for``."""

from __future__ import annotations

import asyncio
import json
import queue
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass
class Event:
    id: str | None = None
    event: str | None = None
    data: str = ""
    comments: list[str] = field(default_factory=list)

    def json(self) -> Any:
        return json.loads(self.data)


class SSEClient:
    """A real streaming HTTP client (httpx) reading an SSE response on a thread."""

    def __init__(self, url: str, params: Any = None, headers: dict[str, str] | None = None) -> None:
        self.client = httpx.Client(timeout=httpx.Timeout(60.0, connect=10.0), trust_env=False)
        self.events: queue.Queue[Event | BaseException | None] = queue.Queue()
        self.comments: list[str] = []
        self.status: int | None = None
        self.headers: httpx.Headers | None = None
        self.body = b""
        self._started = threading.Event()
        self._closing = False
        self._sock: socket.socket | None = None
        self._thread = threading.Thread(target=self._run, args=(url, params, headers or {}), daemon=True)
        self._thread.start()
        if not self._started.wait(15):
            raise AssertionError("SSE response did not start")

    def _run(self, url: str, params: Any, headers: dict[str, str]) -> None:
        try:
            with self.client.stream("GET", url, params=params, headers=headers) as resp:
                self.status = resp.status_code
                stream = resp.extensions.get("network_stream")
                self._sock = stream.get_extra_info("socket") if stream is not None else None
                self.headers = resp.headers
                self._started.set()
                if resp.status_code != 200:
                    self.body = resp.read()
                    return
                ev = Event()
                for line in resp.iter_lines():
                    if line == "":
                        if ev.data or ev.event or ev.id:
                            self.events.put(ev)
                        ev = Event()
                        continue
                    name, _, value = line.partition(":")
                    value = value[1:] if value.startswith(" ") else value
                    if name == "":
                        self.comments.append(value)
                    elif name == "data":
                        ev.data = value if not ev.data else ev.data + "\n" + value
                    elif name == "id":
                        ev.id = value
                    elif name == "event":
                        ev.event = value
        except BaseException as exc:
            if not self._closing:
                self.events.put(exc)
        finally:
            self._started.set()
            self.events.put(None)

    def next(self, timeout: float = 20.0) -> Event:
        try:
            item = self.events.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no SSE event within {timeout}s") from None
        if item is None:
            raise AssertionError("SSE stream ended")
        if isinstance(item, BaseException):
            raise AssertionError(f"SSE stream failed: {item!r}")
        return item

    def messages_until(self, channel: str, timeout: float = 30.0) -> list[Event]:
        """Every event up to and including the first one on ``channel`` (a sentinel)."""
        out = []
        deadline = time.monotonic() + timeout
        while True:
            ev = self.next(max(deadline - time.monotonic(), 0.1))
            out.append(ev)
            if ev.event == channel:
                return out

    def ended(self, timeout: float = 20.0) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def close(self) -> None:
        self._closing = True
        sock = self._sock
        if sock is not None:  # unblock the reader thread's recv (closing the client alone does not)
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._thread.join(10)
        self.client.close()


class Recorder:
    """An ASGI ``send`` that records messages; ``block_after`` makes body sends hang (a client that stops reading)."""

    def __init__(self, block_after: int | None = None) -> None:
        self.messages: list[dict[str, Any]] = []
        self.block_after = block_after
        self.blocked = False
        self.body_sends = 0

    async def __call__(self, message: dict[str, Any]) -> None:
        if message["type"] in ("http.response.body", "websocket.send"):
            self.body_sends += 1
            if self.block_after is not None and self.body_sends > self.block_after:
                self.blocked = True
                await asyncio.Event().wait()  # never returns: flow control of a client that does not read
        self.messages.append(message)

    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.messages if m["type"] == "http.response.body")

    def start(self) -> dict[str, Any]:
        return next(m for m in self.messages if m["type"] == "http.response.start")


def http_scope(
    path: str, query: bytes = b"", method: str = "GET", headers: list[tuple[bytes, bytes]] | None = None
) -> dict[str, Any]:
    return {
        "type": "http",
        "method": method,
        "path": path,
        "root_path": "",
        "query_string": query,
        "headers": headers or [],
        "http_version": "1.1",
        "asgi": {"version": "3.0"},
    }


def drive(
    app: Any,
    path: str,
    frames: list[str],
    until: Callable[[list[str]], bool],
    headers: list[tuple[bytes, bytes]] | None = None,
    between: Callable[[list[str]], None] | None = None,
) -> list[str]:
    """Connect a WebSocket to ``app`` in-process, send ``frames`` (text), wait until ``until(received)``;
    ``between(received)`` runs while waiting (e.g. to publish once a subscription is confirmed)."""
    rec = Recorder()

    def received() -> list[str]:
        return [m["text"] for m in rec.messages if m["type"] == "websocket.send"]

    async def main() -> None:
        inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        await inbox.put({"type": "websocket.connect"})
        for f in frames:
            await inbox.put({"type": "websocket.receive", "text": f})

        async def receive() -> dict[str, Any]:
            return await inbox.get()

        scope = {"type": "websocket", "path": path, "root_path": "", "query_string": b"", "headers": headers or []}
        task = asyncio.ensure_future(app(scope, receive, rec))
        deadline = time.monotonic() + 20
        while not until(received()):
            if between is not None:
                between(received())
            assert not task.done(), ("the connection ended", received())
            assert time.monotonic() < deadline, ("timed out", received())
            await asyncio.sleep(0.005)
        await inbox.put({"type": "websocket.disconnect", "code": 1000})
        await asyncio.wait_for(task, 20)

    asyncio.run(main())
    return received()
