"""Fixtures for the web adapter tests.

``bus``            a fresh Bus on ``bus_name`` (destroyed at teardown)
``driver``         factory ``driver(kind, **options) -> Driver`` for kind "wsgi" or "asgi": runs requests against
                   the real middleware in-process (WSGI: one thread per request, like a threaded server; ASGI: one
                   event loop thread) and exposes status, headers and body pieces as they are produced.
``wsgi_driver_class`` the WSGI driver class, for a test that wraps a middleware of its own
``web_apps_dir``   directory holding ``webapps.py`` (apps served by real gunicorn/uvicorn in the smoke tests)
Raw HTTP helpers for real servers live in ``rawhttp.py``.
"""

from __future__ import annotations

import asyncio
import io
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from shmbus import Bus
from shmbus.adapters.asgi import MessageBusMiddleware as AsgiMiddleware
from shmbus.adapters.wsgi import MessageBusMiddleware as WsgiMiddleware

from .rawhttp import split_stream

WEB_DIR = Path(__file__).resolve().parent
END = object()


@pytest.fixture
def bus(bus_name: str) -> Iterator[Bus]:
    b = Bus(bus_name, keepalive_interval=0, ring_size=1 << 20, max_channels=256, create=True)
    try:
        yield b
    finally:
        b.destroy()


@pytest.fixture
def web_apps_dir() -> Path:
    return WEB_DIR


class Call:
    """One in-flight request: ``status``/``headers`` once started, body pieces in arrival order."""

    def __init__(self) -> None:
        self._status: int | None = None
        self.headers: list[tuple[str, str]] = []
        self.started = threading.Event()
        self.pieces: queue.Queue[Any] = queue.Queue()
        self.received: list[bytes] = []
        self.finished = threading.Event()
        self.error: BaseException | None = None
        self.disconnect: Callable[[], None] = lambda: None

    @property
    def status(self) -> int | None:
        """The status code (waits up to 10 s for the response to start)."""
        self.started.wait(10)
        return self._status

    @status.setter
    def status(self, value: int | None) -> None:
        self._status = value

    def header(self, name: str) -> str | None:
        for k, v in self.headers:
            if k.lower() == name.lower():
                return v
        return None

    def wait_started(self, timeout: float = 10.0) -> Call:
        if not self.started.wait(timeout):
            raise AssertionError("response did not start")
        if self.error is not None:
            raise self.error
        return self

    def next_piece(self, timeout: float = 10.0) -> bytes | None:
        """Next body write (None at the end)."""
        try:
            p = self.pieces.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no body data within {timeout}s") from None
        if p is END:
            if self.error is not None:
                raise self.error
            return None
        self.received.append(p)
        return p  # type: ignore[no-any-return]

    def body(self, timeout: float = 15.0) -> bytes:
        """Everything until the end of the response."""
        deadline = time.monotonic() + timeout
        while True:
            p = self.next_piece(max(deadline - time.monotonic(), 0.01))
            if p is None:
                return b"".join(self.received)

    def json_pieces(self, timeout: float = 15.0) -> list[bytes]:
        """Streamed body split on the separator (complete pieces only)."""
        return split_stream(self.body(timeout))

    def is_finished(self) -> bool:
        return self.finished.is_set()


class Driver:
    kind = ""
    mw: Any
    calls: list[Call]  # every request made, in order

    def request(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        version: str = "1.1",
        *,
        form: dict[str, Any] | None = None,
        json_body: Any = None,
        extra_env: dict[str, Any] | None = None,
    ) -> Call:
        raise NotImplementedError

    def poll(
        self,
        client_id: str,
        channels: dict[str, Any],
        *,
        seq: int | None = None,
        dlp: bool = False,
        chunk: bool = False,
        json: bool = False,
        version: str = "1.1",
        headers: dict[str, str] | None = None,
        extra_env: dict[str, Any] | None = None,
    ) -> Call:
        """A poll like the JS client's (form body) or, with ``json=True``, like the Ruby client's."""
        from urllib.parse import urlencode

        h = dict(headers or {})
        if not chunk:
            h["Dont-Chunk"] = "true"
        data = dict(channels)
        if seq is not None:
            data["__seq"] = seq
        path = f"{self.prefix}message-bus/{client_id}/poll" + ("?dlp=t" if dlp else "")
        if json:
            import json as _json

            h["Content-Type"] = "application/json"
            return self.request("POST", path, _json.dumps(data).encode(), h, version, extra_env=extra_env)
        h["Content-Type"] = "application/x-www-form-urlencoded"
        return self.request(
            "POST",
            path,
            urlencode({k: "" if v is None else v for k, v in data.items()}).encode(),
            h,
            version,
            extra_env=extra_env,
        )

    prefix = "/"

    @property
    def protocol(self) -> Any:
        raise NotImplementedError

    def parked(self) -> int:
        return int(self.protocol.registry.parked)

    def close(self) -> None:
        pass

    def hang_up(self) -> None:
        """Disconnect every request still in flight, as its client going away: a test's parked poll ends now
        instead of at the end of its long-poll interval (up to 5 s a test in teardown)."""
        for call in self.calls:
            if not call.is_finished():
                call.disconnect()


class WsgiDriver(Driver):
    kind = "wsgi"

    def __init__(self, mw: WsgiMiddleware, multithread: bool = True) -> None:
        self.mw = mw
        self.multithread = multithread
        self.threads: list[threading.Thread] = []
        self.calls: list[Call] = []

    @property
    def protocol(self) -> Any:
        return self.mw.protocol

    def request(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        version: str = "1.1",
        *,
        form: dict[str, Any] | None = None,
        json_body: Any = None,
        extra_env: dict[str, Any] | None = None,
    ) -> Call:
        path, _, query = path.partition("?")
        env: dict[str, Any] = {
            "REQUEST_METHOD": method,
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "SCRIPT_NAME": "",
            "SERVER_PROTOCOL": f"HTTP/{version}",
            "SERVER_NAME": "test",
            "SERVER_PORT": "80",
            "wsgi.input": io.BytesIO(body),
            "wsgi.multithread": self.multithread,
            "wsgi.multiprocess": False,
            "wsgi.url_scheme": "http",
            "wsgi.errors": io.StringIO(),
            "wsgi.version": (1, 0),
            "wsgi.run_once": False,
        }
        if body:
            env["CONTENT_LENGTH"] = str(len(body))
        for k, v in (headers or {}).items():
            key = k.upper().replace("-", "_")
            if key in ("CONTENT_TYPE", "CONTENT_LENGTH"):
                env[key] = v
            else:
                env["HTTP_" + key] = v
        env.update(extra_env or {})
        call = Call()
        self.calls.append(call)
        # a stand-in for the server's client socket (gunicorn.socket): closing the peer end is a disconnect
        server_end, client_end = socket.socketpair()
        env["gunicorn.socket"] = server_end
        call.disconnect = client_end.close

        def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            call.status = int(status.split()[0])
            call.headers = list(headers)
            call.started.set()
            return lambda data: call.pieces.put(data)

        def run() -> None:
            try:
                result = self.mw(env, start_response)
                try:
                    for piece in result:
                        if piece:
                            call.pieces.put(piece)
                finally:
                    close = getattr(result, "close", None)
                    if close is not None:
                        close()
            except BaseException as exc:
                call.error = exc
                call.started.set()
            finally:
                call.pieces.put(END)
                call.finished.set()
                server_end.close()
                client_end.close()

        t = threading.Thread(target=run, daemon=True)
        t.start()
        self.threads.append(t)
        return call

    def close(self) -> None:
        self.hang_up()
        for t in self.threads:
            t.join(30)
        self.mw.close()


class AsgiDriver(Driver):
    kind = "asgi"

    def __init__(self, mw: AsgiMiddleware) -> None:
        self.mw = mw
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.futures: list[Any] = []
        self.calls: list[Call] = []

    @property
    def protocol(self) -> Any:
        return asyncio.run_coroutine_threadsafe(self._proto(), self.loop).result(10)

    async def _proto(self) -> Any:
        return self.mw.protocol()

    def request(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        version: str = "1.1",
        *,
        form: dict[str, Any] | None = None,
        json_body: Any = None,
        extra_env: dict[str, Any] | None = None,
    ) -> Call:
        path, _, query = path.partition("?")
        hdrs = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
        if body:
            hdrs.append((b"content-length", str(len(body)).encode()))
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": version,
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": query.encode(),
            "root_path": "",
            "headers": hdrs,
            "client": ("127.0.0.1", 1),
            "server": ("test", 80),
        }
        scope.update(extra_env or {})
        call = Call()
        self.calls.append(call)
        loop = self.loop

        async def go() -> None:
            gone = asyncio.Event()
            call.disconnect = lambda: loop.call_soon_threadsafe(gone.set)
            sent_body = [False]

            async def receive() -> dict[str, Any]:
                if not sent_body[0]:
                    sent_body[0] = True
                    return {"type": "http.request", "body": body, "more_body": False}
                await gone.wait()
                return {"type": "http.disconnect"}

            async def send(message: dict[str, Any]) -> None:
                if message["type"] == "http.response.start":
                    call.status = message["status"]
                    call.headers = [(k.decode(), v.decode()) for k, v in message.get("headers", [])]
                    call.started.set()
                elif message["type"] == "http.response.body" and message.get("body"):
                    call.pieces.put(message["body"])

            try:
                await self.mw(scope, receive, send)
            except BaseException as exc:
                call.error = exc
                call.started.set()
            finally:
                call.pieces.put(END)
                call.finished.set()

        self.futures.append(asyncio.run_coroutine_threadsafe(go(), loop))
        return call

    def close(self) -> None:
        self.hang_up()
        for f in self.futures:
            try:
                f.result(30)
            except Exception:
                pass
        self.mw.close()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def wsgi_driver_class() -> type[WsgiDriver]:
    """The WSGI driver class, for a test that wraps its own middleware (test modules cannot import it: several
    directories have a ``conftest`` module)."""
    return WsgiDriver


@pytest.fixture
def driver(bus: Bus) -> Iterator[Callable[..., Driver]]:
    made: list[Driver] = []

    def make(kind: str, *, multithread: bool = True, **options: Any) -> Driver:
        d: Driver
        if kind == "wsgi":
            d = WsgiDriver(WsgiMiddleware(bus=bus, **options), multithread=multithread)
        else:
            d = AsgiDriver(AsgiMiddleware(bus=bus, **options))
        base = options.get("base_route")
        if base:
            from shmbus.adapters.http import normalize_base_route

            d.prefix = normalize_base_route(base)
        made.append(d)
        return d

    try:
        yield make
    finally:
        for d in made:
            d.close()


@pytest.fixture(params=["wsgi", "asgi"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)
