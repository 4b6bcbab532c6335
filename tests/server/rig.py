"""The in-process rig of the lean server's tests: one connection on a fresh :class:`Server`, a fake transport and
a fake clock (:mod:`mock_transport`), and an ASGI app that echoes, gates or streams."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, cast

from shmbus.adapters.asgi import MessageBusMiddleware
from shmbus.adapters.server import Limits, Server
from shmbus.adapters.server.connection import HttpConnection
from shmbus.adapters.server.serve import connection_factory

from .mock_transport import FakeLoop, FakeTransport, Response, responses

LIMITS = Limits(header_timeout=5, body_timeout=7, max_pipeline_bytes=4096, linger=2, max_body_size=1000)
LONG_POLL = 30.0  # the middleware's long_polling_interval here


class EchoApp:
    """``/gate``: waits until :meth:`open`; ``/chunks?n=N``: N 1 KiB pieces, no length; else echoes
    ``METHOD path body``."""

    def __init__(self) -> None:
        self.gate: asyncio.Event | None = None
        self.seen: list[str] = []

    def open(self) -> None:
        assert self.gate is not None, "no request waits at the gate"
        self.gate.set()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope["path"]
        self.seen.append(path)
        if path == "/gate":
            self.gate = self.gate or asyncio.Event()
            await self.gate.wait()
        body, more = b"", True
        while more:  # to the end of the body (or a disconnect)
            msg = await receive()
            body, more = body + msg.get("body", b""), bool(msg.get("more_body"))
        if path == "/chunks":
            n = int(scope["query_string"].decode().partition("=")[2])
            await send({"type": "http.response.start", "status": 200, "headers": []})
            for i in range(n):
                await send({"type": "http.response.body", "body": b"%04d" % i + b"x" * 1020, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            return
        out = b"%s %s %s" % (scope["method"].encode(), path.encode(), body)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(out))]})
        await send({"type": "http.response.body", "body": out})


@dataclass
class Rig:
    loop: FakeLoop
    srv: Server
    t: FakeTransport
    conn: HttpConnection
    app: EchoApp

    def send(self, data: bytes) -> None:
        self.t.receive(data)

    async def settle(self) -> None:
        await self.loop.settle()

    def answers(self) -> list[Response]:
        return responses(self.t.take())


def make_rig(
    mw: MessageBusMiddleware | None = None, limits: Limits = LIMITS, with_app: bool = True, **transport: Any
) -> Rig:
    """A connection on a fresh server: ``mw`` for the bus routes, ``with_app=False`` for none (every other
    request gets 404 synchronously, so a test needs no running loop)."""
    loop = FakeLoop()
    app = mw.app if mw is not None else EchoApp()
    assert isinstance(app, EchoApp)
    root = mw if mw is not None else (app if with_app else None)
    srv = Server(root, cast(asyncio.AbstractEventLoop, loop), limits=limits)
    t = FakeTransport(loop, **transport)
    conn = t.connect(connection_factory(srv)())
    return Rig(loop, srv, t, conn, app)


def in_loop(fn: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async test on a fresh real loop (for ASGI tasks and the bus tap); 60 s bound against hangs."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(asyncio.wait_for(fn(*args, **kwargs), 60))

    return run


def echo(method: str, path: str, body: bytes = b"") -> bytes:
    return b"%s %s %s" % (method.encode(), path.encode(), body)


async def delivered(check: Callable[[], bool]) -> None:
    """Wait (bounded, never timed) until ``check()``: the bus's listener thread hands batches to the real loop."""
    for _ in range(1000):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the published message never reached the connection")
