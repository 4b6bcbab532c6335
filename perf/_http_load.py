"""A minimal asyncio load generator for message_bus HTTP polls (used by perf/bench_http_*.py and tests/web_load).

Why its own: on a 2-core machine the Python client is the bottleneck, so it does as little as possible: raw
sockets through ``asyncio.Protocol`` (no HTTP library), one pre-built request per connection, and counting
deliveries with ``bytes.count`` of a token that appears once per message (``"message_id"``) instead of parsing.
A streaming poll is "parked" once its first chunk (``[]`` + separator) arrived: the server sends it right after
registering the request, so a message published afterwards must reach it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

SEP = b"\r\n|\r\n"
FIRST = b"[]" + SEP
TOKEN = b'"message_id"'


def raise_nofile(want: int) -> int:
    """Raise this process's open-file limit (children inherit it) toward ``want``; return the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(max(want, soft), hard)
    if target > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def server_stack() -> str:
    """What uvicorn picks in the servers we start (same interpreter): httptools/uvloop when installed."""
    import importlib.util

    http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    return f"uvicorn {http} + {loop}"


def exit_on_sigterm() -> None:
    """perf/run stops a benchmark with SIGTERM: exit through ``finally`` blocks so servers (in their own
    sessions, out of reach of a group kill) are stopped and buses destroyed."""
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def poll_request(
    client_id: str, channels: dict[str, str], *, stream: bool = True, dlp: bool = False, seq: int = 1, query: str = ""
) -> bytes:
    """The bytes of one poll as the JS client sends it (form body; ``Dont-Chunk`` when not streaming)."""
    from urllib.parse import quote

    body = "&".join(f"{quote(ch, safe='')}={v}" for ch, v in channels.items()) + f"&__seq={seq}"
    q = "&".join(x for x in ("dlp=t" if dlp else "", query) if x)
    head = (
        f"POST /message-bus/{client_id}/poll{'?' + q if q else ''} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {len(body)}\r\n"
    )
    if not stream:
        head += "Dont-Chunk: true\r\n"
    return (head + "\r\n" + body).encode()


class StreamConn(asyncio.Protocol):
    """One streaming poll: ``parked`` resolves at the first chunk; then ``count`` deliveries are counted.

    ``on_data(conn, data, now_ns)`` (optional) sees every piece received after parking (the latency bench
    parses ids there).
    """

    __slots__ = ("count", "head", "lost", "on_data", "parked", "request", "tail", "transport")

    def __init__(
        self,
        request: bytes,
        parked: asyncio.Future[None] | None,
        on_data: Callable[[StreamConn, bytes, int], None] | None = None,
    ) -> None:
        self.request = request
        self.parked = parked
        self.on_data = on_data
        self.head = b""
        self.tail = b""
        self.count = 0
        self.lost = False
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        if self.parked is not None:
            self.head += data
            i = self.head.find(FIRST)
            if i < 0:
                if len(self.head) > 65536:
                    self._fail(f"no first chunk: {self.head[:300]!r}")
                return
            if not self.parked.done():
                self.parked.set_result(None)
            self.parked = None
            data = self.head[i + len(FIRST) :]
            self.head = b""
            if not data:
                return
        if self.on_data is not None:
            self.on_data(self, data, time.perf_counter_ns())
        buf = self.tail + data
        self.count += buf.count(TOKEN)
        self.tail = buf[-(len(TOKEN) - 1) :]

    def _fail(self, why: str) -> None:
        if self.parked is not None and not self.parked.done():
            self.parked.set_exception(ConnectionError(why))

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._fail(f"connection closed before the first chunk ({exc}); got {self.head[:300]!r}")

    def close(self) -> None:
        if self.transport is not None:
            self.transport.abort()


async def open_streams(
    port: int,
    n: int,
    channel: str,
    *,
    prefix: str = "c",
    concurrency: int = 256,
    timeout: float = 120.0,
    on_data: Callable[[StreamConn, bytes, int], None] | None = None,
    host: str = "127.0.0.1",
    query: str = "",
) -> list[StreamConn]:
    """Open ``n`` streaming polls on ``channel`` ("from now") and wait until every one is parked."""
    loop = asyncio.get_running_loop()
    sem = asyncio.Semaphore(concurrency)
    conns: list[StreamConn] = []

    async def one(i: int) -> None:
        async with sem:
            fut: asyncio.Future[None] = loop.create_future()
            req = poll_request(f"{prefix}{i}", {channel: ""}, query=query)
            for attempt in range(5):
                try:
                    _, proto = await loop.create_connection(lambda: StreamConn(req, fut, on_data), host, port)
                    break
                except OSError:
                    if attempt == 4:
                        raise
                    await asyncio.sleep(0.05 * (attempt + 1))
            conns.append(proto)
            await fut

    await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(n))), timeout)
    return conns


async def wait_counts(conns: Sequence[StreamConn], want: int, timeout: float) -> float:
    """Wait until every connection counted ``want`` deliveries (or timeout); return the seconds waited."""
    t0 = time.perf_counter()
    deadline = t0 + timeout
    while time.perf_counter() < deadline:
        if all(c.count >= want for c in conns):
            break
        await asyncio.sleep(0.005)
    return time.perf_counter() - t0


def close_all(conns: Sequence[StreamConn]) -> None:
    for c in conns:
        c.close()


def rss_kb(pid: int) -> int:
    """Resident set size of ``pid`` in KiB (from /proc)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (server workers)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        rest = stat[stat.rfind(b")") + 2 :].split()
        if len(rest) > 1 and int(rest[1]) == pid:
            out.append(int(entry))
    return sorted(out)


def exec_with_nofile(argv: Sequence[str], nofile: int) -> None:
    """Wrapper entry point: raise RLIMIT_NOFILE, then exec ``argv`` (servers inherit nothing else from us)."""
    raise_nofile(nofile)
    os.execvp(argv[0], list(argv))


# ---------------------------------------------------------------------------------------------- servers
class Uvicorn:
    """An ASGI server with ``workers`` uvicorn workers on a free port, in its own process group (:meth:`stop`).

    By default gunicorn with ``uvicorn.workers.UvicornWorker``. ``uvicorn --workers N`` (``plain=True``) binds
    the listening socket itself with ``socket.socket(family)`` (protocol field 0), and asyncio sets
    ``TCP_NODELAY`` only on sockets whose protocol is ``IPPROTO_TCP``. So no accepted connection gets it, and
    h11's two writes per response (head, body) then wait for the client's delayed ACK: ~40 ms per keep-alive
    request (measured: 23 polls/s per connection instead of ~7,600). gunicorn sets ``TCP_NODELAY`` on its
    listening socket, which accepted sockets inherit.
    """

    def __init__(
        self,
        app: str,
        *,
        workers: int = 2,
        env: dict[str, str] | None = None,
        nofile: int = 30000,
        extra: Sequence[str] = (),
        plain: bool = False,
    ) -> None:
        import socket
        import subprocess

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        perf = os.path.dirname(os.path.abspath(__file__))
        full_env = dict(os.environ, **(env or {}))
        full_env["PYTHONPATH"] = os.pathsep.join([perf, os.path.dirname(perf), full_env.get("PYTHONPATH", "")])
        wrap = [sys.executable, os.path.abspath(__file__), str(nofile), sys.executable, "-m"]
        if plain:
            argv = [
                *wrap,
                "uvicorn",
                app,
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--workers",
                str(workers),
                "--log-level",
                "warning",
                "--backlog",
                "4096",
                "--timeout-graceful-shutdown",
                "2",
            ]
        else:
            argv = [
                *wrap,
                "gunicorn",
                "-k",
                "uvicorn.workers.UvicornWorker",
                "-w",
                str(workers),
                "-b",
                f"127.0.0.1:{self.port}",
                "--backlog",
                "4096",
                "--graceful-timeout",
                "2",
                "--log-level",
                "warning",
                "--timeout",
                "300",
                app,
            ]
        argv += list(extra)
        self.proc = subprocess.Popen(argv, env=full_env, start_new_session=True, stdin=subprocess.DEVNULL)
        self.workers = workers
        self._wait()

    def _wait(self, timeout: float = 30.0) -> None:
        import socket

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"uvicorn exited with {self.proc.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    pass
                if len(children(self.proc.pid)) >= (self.workers if self.workers > 1 else 0):
                    time.sleep(0.3 if self.workers > 1 else 0)  # let every worker start accepting
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("uvicorn did not start")

    def worker_pids(self) -> list[int]:
        kids = children(self.proc.pid)
        return kids if kids else [self.proc.pid]

    def stop(self) -> None:
        import signal
        import subprocess

        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            self.proc.wait(5)


def gem_dir() -> str | None:
    """The message_bus gem's checkout (``MESSAGE_BUS_GEM_DIR``) when it and Debian's ruby and puma can run it,
    else None; :func:`gem_problem` says why."""
    return None if gem_problem() else os.environ["MESSAGE_BUS_GEM_DIR"]


def gem_problem() -> str:
    import shutil

    d = os.environ.get("MESSAGE_BUS_GEM_DIR", "")
    if not d or not os.path.isfile(os.path.join(d, "lib", "message_bus.rb")):
        return "MESSAGE_BUS_GEM_DIR does not name a checkout of the message_bus gem"
    if shutil.which("ruby") is None or shutil.which("puma") is None:
        return "ruby or puma is not installed (Debian: apt-get install ruby puma ruby-rack)"
    return ""


class Puma:
    """The gem (``perf/gem_app.ru``: the ordinary app, memory backend) under puma in single mode (one process:
    the memory backend is per process) on a free port, in its own session; same interface as :class:`Uvicorn`."""

    def __init__(self, *, threads: int = 8, max_active: int = 20000, nofile: int = 30000, broadcast: bool = False):
        import socket
        import subprocess

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        perf = os.path.dirname(os.path.abspath(__file__))
        env = dict(os.environ, MB_MAX_ACTIVE=str(max_active), MB_BROADCAST="1" if broadcast else "0")
        argv = [sys.executable, os.path.abspath(__file__), str(nofile), "puma", "--quiet", "-e", "production"]
        argv += ["-t", f"{threads}:{threads}", "-b", f"tcp://127.0.0.1:{self.port}?backlog=4096"]
        argv += [os.path.join(perf, "gem_app.ru")]
        self.proc = subprocess.Popen(
            argv, env=env, start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL
        )
        self.workers = 1
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"puma exited with {self.proc.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("puma did not start")

    def worker_pids(self) -> list[int]:
        return [self.proc.pid]

    def stop(self) -> None:
        Uvicorn.stop(self)  # type: ignore[arg-type]


if __name__ == "__main__":  # python perf/_http_load.py NOFILE cmd args...: exec with a raised fd limit
    exec_with_nofile(sys.argv[2:], int(sys.argv[1]))


def bench_server(prefix: str, clients: int, native: bool = False) -> tuple[Any, Uvicorn]:
    """A fresh bus and a 2-worker server holding ``clients`` streams on it: the middleware under uvicorn, or
    (``native``) shmbus.adapters.server.GunicornWorker. The caller stops the server and destroys the bus."""
    import json

    import _common as c
    import _http_apps as apps

    from shmbus import Bus

    name = c.unique_name(prefix)
    bus = Bus(name, keepalive_interval=0, create=True)
    bus.publish("/bench/warm", 0)
    opts = {"max_active_clients": clients + 1000, "long_polling_interval": 300}
    env = {"SHMBUS_LOAD_BUS": name, "SHMBUS_LOAD_OPTS": json.dumps(opts)}
    server = (
        Uvicorn("_http_apps:native_app", env=env, extra=["-k", apps.SERVER_WORKER])
        if native
        else Uvicorn("_http_apps:asgi_app", env=env)
    )
    return bus, server
