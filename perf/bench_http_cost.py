#!/usr/bin/env python3
"""Server CPU per million deliveries: what fan-out to real message_bus clients costs the server.

The figure is the CPU time of every server process (gunicorn master and workers, from /proc) between the moment
every client is parked and the moment every client counted every message, divided by the deliveries
(clients x messages), per 1M deliveries. Lower is better. Scenarios:

* ``burst A``: 1000 chunked long-poll clients on one channel, 200 messages posted over HTTP as fast as possible;
* ``burst B``: 100 clients, 1000 messages;
* ``paced``: 1000 clients, 20 messages/s for a few seconds; also the publish-to-delivery latency (p50/p99).

Clients speak the JS client's protocol (``message-bus-client``): each subscribes at ``-1``, takes the
``/__status`` answer as its position, keeps reading the chunked stream, and re-polls with its last id and the
next ``__seq`` when a response ends. Messages are posted to ``/message-bus/broadcast`` by separate publisher
processes over keep-alive connections. The load generator is several processes of raw asyncio sockets that count
frames (``bytes.count`` of the message token) instead of decoding JSON; its own CPU is printed beside the
server's, and every client must get every message exactly once (checked: count and last id).

Servers: the lean worker (``shmbus.adapters.server.GunicornWorker``), ``UvicornWorker`` (uvicorn with the ASGI
middleware) and gunicorn ``gthread`` (the WSGI middleware, a thread per parked poll), each with 2 workers.
Baselines: the same deliveries' client-side CPU (the load generator, measured here) and the gem's published
per-delivery cost (issue 15: puma, memory backend, 27.1 s / 37.6 s per 1M deliveries; not measured here).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import _common as c
import _http_load as load

from shmbus import Bus

QUICK_TIMEOUT = 180
FULL_TIMEOUT = 1500
CHANNEL = "/bench/cost"
PAD = "x" * 60
TOKEN = b'"message_id":'
STATUS = b'"message_id":-1,'
SEP = b"\r\n|\r\n"
STAMP = re.compile(rb'"data":"\d+:(\d+):')
TICKS = os.sysconf("SC_CLK_TCK")
#: message-bus-client's ``minPollInterval``: after a response with data it polls again this much later (seconds)
MIN_POLL_INTERVAL = 0.1
GEM_BURST_A, GEM_BURST_B = 27.1, 37.6  # s per 1M deliveries, issue 15 (measured there, not here)

SERVERS = {
    "lean": ("_http_apps:native_app", ["-k", "shmbus.adapters.server.GunicornWorker"]),
    "uvicorn": ("_http_apps:asgi_app", ["-k", "shmbus.adapters.server.uvicorn_worker.UvicornWorker"]),
    "gthread": (
        "_http_apps:wsgi_app",
        ["-k", "gthread", "--threads", "1100", "-c", "python:shmbus.adapters.integrations.gunicorn"],
    ),
}


# ---------------------------------------------------------------------------------------------- CPU
def cpu_seconds(pids: Sequence[int]) -> float:
    """utime + stime of ``pids`` (and their reaped children), from /proc."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return total / TICKS


# ---------------------------------------------------------------------------------------------- clients
def poll_bytes(client_id: str, last_id: int, seq: int, chunked: bool) -> bytes:
    body = f"{CHANNEL.replace('/', '%2F')}={last_id}&__seq={seq}"
    return (
        f"POST /message-bus/{client_id}/poll HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {len(body)}\r\n"
        f"{'' if chunked else 'Dont-Chunk: true' + chr(13) + chr(10)}\r\n{body}"
    ).encode()


class JsClient(asyncio.Protocol):
    """One message-bus-client: subscribe at -1, read the stream, re-poll with its last id when a response ends.

    Counting is done on complete frames (up to the last separator received), so a token split across two reads
    is never missed or counted twice; the last message id is read from the last frame only.
    """

    def __init__(
        self,
        client_id: str,
        parked: asyncio.Future[None],
        latencies: list[int] | None,
        chunked: bool = True,
        repoll_after: float = MIN_POLL_INTERVAL,
    ) -> None:
        self.client_id = client_id
        self.chunked = chunked
        self.repoll_after = repoll_after
        self.port = 0
        self.keep_alive = True  # False once the server said "connection: close" (gthread without keep-alive)
        self.connecting: asyncio.Task[Any] | None = None
        self.length = -1
        self.parked: asyncio.Future[None] | None = parked
        self.latencies = latencies
        self.last_id = -1
        self.seq = 1
        self.count = 0
        self.chunks = 0  # message-bearing pieces received (a chunk on a stream, a response on a long poll)
        self.buf = b""
        self.in_body = False
        self.transport: Any = None
        self.closed = False

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.port = transport.get_extra_info("peername")[1]
        self.keep_alive = True
        self._poll()

    def _poll(self) -> None:
        self.in_body = False
        self.buf = b""
        self.transport.write(poll_bytes(self.client_id, self.last_id, self.seq, self.chunked))
        self.seq += 1

    def _next_poll(self) -> None:
        """After a response with data the JS client polls again ``minPollInterval`` (100 ms) later, on a new
        connection when the server closes this one."""
        self.in_body = False
        self.buf = b""
        then = self._poll if self.keep_alive else self._reconnect
        if self.repoll_after > 0:
            asyncio.get_running_loop().call_later(self.repoll_after, then)
        else:
            then()

    def _reconnect(self) -> None:
        old, self.transport = self.transport, None
        if old is not None:
            old.abort()
        loop = asyncio.get_running_loop()
        self.connecting = loop.create_task(loop.create_connection(lambda: self, "127.0.0.1", self.port))

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data
        if not self.in_body:
            i = buf.find(b"\r\n\r\n")
            if i < 0:
                self.buf = buf
                return
            if not buf.startswith(b"HTTP/1.1 200"):
                raise ConnectionError(f"{self.client_id}: {buf[:200]!r}")
            self.in_body = True
            self.keep_alive = b"connection: close" not in buf[:i].lower()
            if not self.chunked:  # a long poll (Dont-Chunk): one JSON array with a content-length
                head = buf[:i].lower()
                j = head.find(b"content-length: ") + 16
                self.length = int(head[j : head.find(b"\r\n", j) if head.find(b"\r\n", j) > 0 else None])
            buf = buf[i + 4 :]
        if not self.chunked:
            if len(buf) < self.length:
                self.buf = buf
                return
            self._frames(buf[: self.length])
            self._next_poll()
            return
        end = buf.rfind(SEP)
        if end < 0:
            self.buf = buf
            return
        frames, rest = buf[:end], buf[end + len(SEP) :]
        self._frames(frames)
        if rest.endswith(b"0\r\n\r\n") and rest.lstrip(b"\r\n").startswith(b"0\r\n"):  # the response ended
            self._next_poll()
            return
        self.buf = rest

    def _frames(self, frames: bytes) -> None:
        statuses = frames.count(STATUS)
        messages = frames.count(TOKEN) - statuses
        self.count += messages
        if messages:
            self.chunks += frames.count(SEP) + 1 if self.chunked else 1
        i = frames.rfind(TOKEN)
        if i < 0:  # an empty answer ([]): nothing new
            pass
        elif frames.startswith(STATUS, i):  # the newest entry is a status: its data is the channel's position
            j = frames.find(b'":', frames.find(b'"data":{', i) + 8)
            k = j + 2
            while frames[k : k + 1].isdigit():
                k += 1
            self.last_id = int(frames[j + 2 : k])
        else:
            j = i + len(TOKEN)
            k = frames.find(b",", j)
            self.last_id = int(frames[j:k])
        if self.latencies is not None and self.count:
            now = time.time_ns()
            self.latencies.extend(now - int(t) for t in STAMP.findall(frames))
        if self.parked is not None:
            self.parked.set_result(None)
            self.parked = None

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is None:  # we closed it to poll on a new connection
            return
        self.closed = True
        if self.parked is not None and not self.parked.done():
            self.parked.set_exception(ConnectionError(f"{self.client_id}: closed ({exc})"))


async def run_clients(
    port: int,
    ids: Sequence[str],
    want: int,
    sample_every: int,
    ready_fd: int,
    go_fd: int,
    timeout: float,
    chunked: bool,
    repoll_after: float,
) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    latencies: list[int] = []
    conns: list[JsClient] = []
    sem = asyncio.Semaphore(200)

    async def one(k: int, cid: str) -> None:
        async with sem:
            fut: asyncio.Future[None] = loop.create_future()
            sample = latencies if k % sample_every == 0 else None
            _, proto = await loop.create_connection(
                lambda: JsClient(cid, fut, sample, chunked, repoll_after), "127.0.0.1", port
            )
            conns.append(proto)
            await fut

    await asyncio.wait_for(asyncio.gather(*(one(k, cid) for k, cid in enumerate(ids))), 120)
    before = os.times()
    os.write(ready_fd, b"r")
    await loop.run_in_executor(None, os.read, go_fd, 1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(x.count < want for x in conns):
        await asyncio.sleep(0.005)
    after = os.times()
    counts = [x.count for x in conns]
    result = {
        "clients": len(conns),
        "deliveries": sum(counts),
        "chunks": sum(x.chunks for x in conns),
        "short": sum(1 for n in counts if n < want),
        "extra": sum(1 for n in counts if n > want),
        "wrong_last_id": sum(1 for x in conns if x.count == want and x.last_id != want),
        "closed": sum(1 for x in conns if x.closed),
        "cpu": (after.user + after.system) - (before.user + before.system),
        "latencies": latencies,
    }
    for x in conns:
        if x.transport is not None:
            x.transport.abort()
    return result


def client_process(
    port: int,
    ids: list[str],
    want: int,
    sample_every: int,
    ready_fd: int,
    go_fd: int,
    out_fd: int,
    timeout: float,
    chunked: bool,
    repoll_after: float,
) -> None:
    try:
        res = asyncio.run(run_clients(port, ids, want, sample_every, ready_fd, go_fd, timeout, chunked, repoll_after))
    except BaseException as exc:  # report, so the parent fails with the reason instead of hanging
        res = {"error": repr(exc)}
    os.write(out_fd, json.dumps(res).encode())
    os._exit(0)


# ---------------------------------------------------------------------------------------------- publishers
def publisher_process(
    port: int, first: int, count: int, step: int, rate: float, go_fd: int, ready_fd: int, path: str, extra: str
) -> None:
    """Post messages ``first, first+step, ...`` (``count`` of them) to ``path`` (the broadcast route, or the
    ordinary app's ``/publish``), each after the previous answer, on a keep-alive connection (a new one when the
    server closes it: gthread without keep-alive); ``rate`` > 0 paces them (messages per second)."""

    def connect() -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    os.write(ready_fd, b"p")
    os.read(go_fd, 1)
    sock = connect()  # after "go": an idle connection opened earlier may pass the server's keep-alive timeout
    t0 = time.monotonic()
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\n".encode()
    for n in range(count):
        if rate > 0:
            delay = t0 + n / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        body = f"channel={CHANNEL.replace('/', '%2F')}&data={first + n * step}:{time.time_ns()}:{PAD}{extra}".encode()
        sock.sendall(b"%sContent-Length: %d\r\n\r\n%s" % (head, len(body), body))
        got = b""
        while not got.endswith(b"sent"):
            chunk = sock.recv(4096)
            if not chunk:
                os._exit(3)
            got += chunk
        if b"connection: close" in got.lower():
            sock.close()
            sock = connect()
    sock.close()
    os._exit(0)


def direct_publisher_process(
    bus_name: str, first: int, count: int, step: int, rate: float, go_fd: int, ready_fd: int, group: int | None
) -> None:
    """Publish straight into the bus from another process (a job, a worker of another app), as the ordinary app's
    route would: same site, same targeting."""
    import _http_apps as apps

    bus = Bus(bus_name, keepalive_interval=0, create=True)
    targeting: dict[str, Any] = {"site_id": apps.SITE}
    if group is not None:
        targeting["group_ids"] = [group]
    os.write(ready_fd, b"p")
    os.read(go_fd, 1)
    t0 = time.monotonic()
    for n in range(count):
        if rate > 0:
            delay = t0 + n / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        bus.publish(CHANNEL, f"{first + n * step}:{time.time_ns()}:{PAD}", **targeting)  # type: ignore[arg-type]
    bus.close()
    os._exit(0)


# ---------------------------------------------------------------------------------------------- a scenario
def scenario(
    server_kind: str,
    clients: int,
    messages: int,
    rate: float,
    loaders: int,
    publishers: int,
    sample_every: int,
    chunked: bool = True,
    repoll_after: float = MIN_POLL_INTERVAL,
    batch_window: float | None = None,
    strace: str = "",
    app_kind: str = "bus",
    publish: str = "broadcast",
    group: int | None = None,
) -> dict[str, Any]:
    """One run: ``app_kind`` "bus" (the middleware alone) or "ordinary" (the middleware wrapping an app with all
    four lookups, :mod:`_http_apps`); ``publish`` "broadcast" (``/message-bus/broadcast``), "route" (the
    ordinary app's ``POST /publish``) or "direct" (``bus.publish`` in other processes); ``group``: publish to
    that group (every client of the ordinary app is in group 0)."""
    name = c.unique_name(f"cost-{server_kind}")
    bus = Bus(name, keepalive_interval=0, create=True)
    bus.publish("/bench/warm", 0)
    opts: dict[str, Any] = {"max_active_clients": clients + 1000, "long_polling_interval": 120}
    if publish == "broadcast":
        opts["allow_broadcast"] = True
    if batch_window is not None:
        opts["batch_window"] = batch_window
    env = {"SHMBUS_LOAD_BUS": name, "SHMBUS_LOAD_OPTS": json.dumps(opts), "SHMBUS_THREADS": "1100"}
    if strace.startswith("cprofile:"):
        env["SHMBUS_BENCH_CPROFILE"] = strace[9:]
    server: Any
    if server_kind == "gem":
        server = load.Puma(max_active=clients + 1000, nofile=clients * 2 + 1000, broadcast=publish == "broadcast")
    else:
        app, extra = SERVERS[server_kind]
        if app_kind == "ordinary":
            app = "_http_apps:ordinary_app" if server_kind != "gthread" else app
        server = load.Uvicorn(app, env=env, extra=extra, nofile=clients * 2 + 1000)
    path = "/publish" if publish == "route" else "/message-bus/broadcast"
    extra_form = "" if group is None or publish == "broadcast" else f"&group={group}"
    kids: list[int] = []
    try:
        ready_r, ready_w = os.pipe()
        go_r, go_w = os.pipe()
        outs = []
        per = -(-clients // loaders)
        for k in range(loaders):
            ids = [f"c{k}x{i}" for i in range(k * per, min(clients, (k + 1) * per))]
            out_r, out_w = os.pipe()
            kids.append(
                c.fork(
                    client_process,
                    server.port,
                    ids,
                    messages,
                    sample_every,
                    ready_w,
                    go_r,
                    out_w,
                    60.0 + messages / (rate or 1000),
                    chunked,
                    repoll_after,
                )
            )
            outs.append(out_r)
            os.close(out_w)
        pub_go_r, pub_go_w = os.pipe()
        for k in range(publishers):
            share = len(range(k + 1, messages + 1, publishers))
            pace = rate / publishers if rate else 0.0
            if publish == "direct":
                kids.append(
                    c.fork(direct_publisher_process, name, k + 1, share, publishers, pace, pub_go_r, ready_w, group)
                )
            else:
                kids.append(
                    c.fork(
                        publisher_process,
                        server.port,
                        k + 1,
                        share,
                        publishers,
                        pace,
                        pub_go_r,
                        ready_w,
                        path,
                        extra_form,
                    )
                )
        for _ in range(loaders + publishers):
            if not os.read(ready_r, 1):
                raise RuntimeError("a client or publisher process died before it was ready")
        server_pids = sorted({server.proc.pid, *server.worker_pids()})  # puma: one process, both
        tracers: list[Any] = []
        if strace.startswith("cprofile:"):  # the ordinary app's workers profile themselves between two SIGUSR2
            for pid in server.worker_pids():
                os.kill(pid, signal.SIGUSR2)
        elif strace.startswith("py-spy:"):  # sample each worker's Python stacks: PREFIX.<pid> (raw, for flamegraphs)
            import subprocess

            for pid in server.worker_pids():
                out = f"{strace[7:]}.{pid}"
                spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
                argv = [
                    spy if os.path.exists(spy) else "py-spy",
                    "record",
                    "-p",
                    str(pid),
                    "-r",
                    "250",
                    "-f",
                    "raw",
                    "--nonblocking",
                    "-o",
                    out,
                ]
                tracers.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            time.sleep(1.0)
        elif strace:  # count the workers' system calls while the messages flow (a profile of the write pattern)
            import subprocess

            pid_args = [a for pid in server.worker_pids() for a in ("-p", str(pid))]
            tracers.append(subprocess.Popen(["strace", "-c", "-f", "-o", strace, *pid_args], stderr=subprocess.DEVNULL))
            time.sleep(1.0)
        cpu0 = cpu_seconds(server_pids)
        pub_cpu0 = cpu_seconds(kids[loaders:])
        t0 = time.perf_counter()
        os.write(go_w, b"g" * loaders)
        os.write(pub_go_w, b"g" * publishers)
        results = []
        for fd in outs:
            data = b""
            while chunk := os.read(fd, 1 << 20):
                data += chunk
            results.append(json.loads(data))
        wall = time.perf_counter() - t0
        cpu1 = cpu_seconds(server_pids)
        if strace.startswith("cprofile:"):
            for pid in server.worker_pids():
                os.kill(pid, signal.SIGUSR2)
            time.sleep(1.0)
        for tracer in tracers:
            tracer.send_signal(signal.SIGINT)
            tracer.wait(10)
        pub_cpu1 = cpu_seconds(kids[loaders:])
        for pid in kids[loaders:]:  # a publisher that failed (exit status != 0) explains missing deliveries
            with contextlib.suppress(ChildProcessError):
                done, status = os.waitpid(pid, os.WNOHANG)
                if done and os.waitstatus_to_exitcode(status) != 0:
                    raise RuntimeError(f"a publisher exited with {os.waitstatus_to_exitcode(status)}")
        for r in results:
            if "error" in r:
                raise RuntimeError(f"load generator failed: {r['error']}")
        lat = sorted(x for r in results for x in r["latencies"])
        deliveries = sum(r["deliveries"] for r in results)
        chunks = sum(r["chunks"] for r in results)
        return {
            "server_cpu": cpu1 - cpu0,
            "client_cpu": sum(r["cpu"] for r in results),
            "publisher_cpu": pub_cpu1 - pub_cpu0,
            "deliveries": deliveries,
            "per_chunk": deliveries / max(chunks, 1),
            "expected": clients * messages,
            "short": sum(r["short"] for r in results),
            "extra": sum(r["extra"] for r in results),
            "wrong_last_id": sum(r["wrong_last_id"] for r in results),
            "wall": wall,
            "p50_ms": c.percentile(lat, 50) / 1e6 if lat else float("nan"),
            "p99_ms": c.percentile(lat, 99) / 1e6 if lat else float("nan"),
        }
    finally:
        for pid in kids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        server.stop()
        bus.destroy()


# ---------------------------------------------------------------------------------------------- main
def main(argv: Sequence[str] | None = None) -> int:
    def extra(p: Any) -> None:
        p.add_argument("--servers", default="lean,uvicorn,gthread", help="comma-separated: lean, uvicorn, gthread")
        p.add_argument(
            "--scenarios",
            default="",
            help="comma-separated: burstA, burstB, paced (default: all); --app ordinary also small, large (the "
            "marginal cost)",
        )
        p.add_argument(
            "--app",
            default="bus",
            help="bus: the middleware alone, messages posted to /message-bus/broadcast (issue 15's case); ordinary: "
            "the middleware wrapping an app with all four lookups, messages published by its POST /publish route and "
            "by other processes straight into the bus, the gem side by side (issue 27's case)",
        )
        p.add_argument("--publish", default="route,direct", help="--app ordinary: comma-separated: route, direct")
        p.add_argument(
            "--group",
            default="0",
            help="--app ordinary: publish to this group (every client is in 0); none: untargeted",
        )
        p.add_argument("--batch-window", type=float, default=None, help="the middleware's batch_window (seconds)")
        p.add_argument(
            "--strace",
            default="",
            help="write the workers' system call counts (strace -c) to this path, or with py-spy:PREFIX their sampled "
            "Python stacks to PREFIX.<pid>, or with cprofile:PREFIX (--app ordinary) the workers' cProfile there; "
            "CPU figures then include tracing",
        )
        p.add_argument(
            "--modes",
            default="",
            help="comma-separated: stream (chunked, the JS "
            "client's default), long (Dont-Chunk long polls, its fallback behind buffering proxies, "
            "re-polling 100 ms after data as it does), eager (long polls re-polled at once: a stress case "
            "no message-bus-client produces); default: all, --quick: stream",
        )

    args = c.parse_args(__doc__.split("\n")[0], argv, extra)
    load.exit_on_sigterm()
    load.raise_nofile(20000)
    report = c.Report("bench_http_cost", "server CPU-seconds per 1M deliveries (lower is better)", args)
    if args.app == "ordinary":
        return ordinary_main(args, report)
    quick = args.quick
    sizes = {
        "burstA": (300, 100, 0.0) if quick else (1000, 200, 0.0),
        "burstB": (100, 300, 0.0) if quick else (100, 1000, 0.0),
        "paced": (300, 40, 20.0) if quick else (1000, 100, 20.0),
    }
    servers = [s for s in args.servers.split(",") if s]
    scenarios = [s for s in (args.scenarios or "burstA,burstB,paced").split(",") if s]
    repeats = args.repeats or 1
    report.published(
        "gem burst A, s/1M deliveries",
        GEM_BURST_A,
        "s",
        "issue 15: the gem, puma, memory backend, 1000 clients x 200 msgs",
    )
    report.published("gem burst B, s/1M deliveries", GEM_BURST_B, "s", "issue 15: the gem, 100 clients x 1000 msgs")
    failures = 0
    modes = [x for x in (args.modes or ("stream" if quick else "stream,long,eager")).split(",") if x]
    for sc, mode, kind in ((sc, mode, kind) for sc in scenarios for mode in modes for kind in servers):
        n, m, rate = sizes[sc]
        label = f"{kind} {mode} {sc} ({n} clients x {m} msgs{f' at {rate:g}/s' if rate else ''})"
        cpus, loads_, lats = [], [], []
        for _ in range(repeats):
            r = scenario(
                kind,
                n,
                m,
                rate,
                loaders=2,
                publishers=2 if not rate else 1,
                sample_every=10 if rate else 1000000,
                chunked=mode == "stream",
                repoll_after=0.0 if mode == "eager" else MIN_POLL_INTERVAL,
                batch_window=args.batch_window,
                strace=args.strace,
            )
            ok = r["deliveries"] == r["expected"] and not r["short"] and not r["extra"] and not r["wrong_last_id"]
            report.log(
                f"{label}: server {r['server_cpu']:.2f} s CPU, load generator {r['client_cpu']:.2f} s, "
                f"publishers {r['publisher_cpu']:.2f} s, {r['deliveries']:,}/{r['expected']:,} deliveries in "
                f"{r['wall']:.2f} s, {r['per_chunk']:.1f} messages per chunk"
                + (f", p50 {r['p50_ms']:.1f} ms p99 {r['p99_ms']:.1f} ms" if rate else "")
                + ("" if ok else f"  LOST/DUPLICATED: {r}")
            )
            if not ok:
                failures += 1
            per_m = 1e6 / max(r["deliveries"], 1)
            cpus.append(r["server_cpu"] * per_m)
            loads_.append(r["client_cpu"] * per_m)
            lats.append(r["p99_ms"])
        gem = {"burstA": "gem burst A, s/1M deliveries", "burstB": "gem burst B, s/1M deliveries"}.get(sc)
        report.add(
            f"{label} server",
            cpus,
            "s",
            higher_is_better=False,
            baselines=[f"{label} load generator", *([gem] if gem else [])],
        )
        report.add(f"{label} load generator", loads_, "s", higher_is_better=False)
        if rate:
            report.add(f"{label} p99 latency", lats, "ms", higher_is_better=False)
        # the targets are for the JS client's default (chunked streams) on the two asyncio servers
        if not quick and mode == "stream" and kind in ("lean", "uvicorn"):
            if sc != "paced":
                goal = 5.0 if kind == "lean" else 8.0
                report.target(
                    f"{kind} {sc} server s/1M deliveries", statistics.median(cpus), goal, at_least=False, unit=" s"
                )
            else:
                report.target(f"{kind} paced p99 latency", statistics.median(lats), 25.0, at_least=False, unit=" ms")
    report.note(
        "server = every gunicorn process (master and 2 workers) between 'all parked' and 'all delivered'; "
        "the load generator is 2 processes on the same 2 cores"
    )
    report.emit()
    return 1 if failures else 0


# ---------------------------------------------------------------------------------------------- the ordinary app
ORDINARY_SIZES = {  # (clients, messages, rate), full and --quick
    "burstA": ((1000, 200, 0.0), (300, 100, 0.0)),
    "burstB": ((100, 1000, 0.0), (100, 300, 0.0)),
    "small": ((1000, 50, 0.0), (300, 25, 0.0)),  # the marginal cost: large minus small, per extra delivery
    "large": ((1000, 400, 0.0), (300, 100, 0.0)),
    "paced": ((1000, 100, 20.0), (300, 40, 20.0)),
}


def ordinary_main(args: Any, report: c.Report) -> int:
    """Issue 27's case: the ordinary app on the lean worker (and uvicorn if asked) and on the gem, same run.

    Rows: server CPU per 1M deliveries for each scenario and way of publishing, with the gem's as the baseline
    (the gem has no "direct" row: its memory backend lives in the puma process); the marginal cost per 1M extra
    deliveries between the ``small`` and ``large`` runs of the same repeat; paced p50/p99 latency."""
    servers = [s for s in (args.servers if args.servers != "lean,uvicorn,gthread" else "lean,gem").split(",") if s]
    if "gthread" in servers:
        raise SystemExit("--app ordinary runs on lean, uvicorn and gem")
    if "gem" in servers and load.gem_problem():
        report.log(f"LOUD SKIP of the gem: {load.gem_problem()}")
        report.note(f"the gem was not measured: {load.gem_problem()}")
        servers.remove("gem")
    publishes = [p for p in args.publish.split(",") if p]
    default_sc = "burstA,burstB,small,large,paced"
    scenarios = [x for x in (args.scenarios or default_sc).split(",") if x]
    group = None if args.group == "none" else int(args.group)
    repeats = args.repeats or 1
    cpu: dict[str, list[float]] = {}
    raw: dict[str, list[float]] = {}
    lat: dict[str, list[float]] = {}
    failures = 0
    for _ in range(repeats):
        for sc in scenarios:
            n, m, rate = ORDINARY_SIZES[sc][1 if args.quick else 0]
            for pub in publishes:
                for kind in servers:
                    if kind == "gem" and pub == "direct":
                        continue  # the gem's memory backend is inside puma: nothing else can publish into it
                    label = f"{kind} {pub} {sc} ({n} x {m}{f' at {rate:g}/s' if rate else ''})"
                    r = scenario(
                        kind,
                        n,
                        m,
                        rate,
                        loaders=2,
                        publishers=1 if rate else 4,
                        sample_every=10 if rate else 1000000,
                        batch_window=args.batch_window,
                        strace=args.strace if kind != "gem" else "",
                        app_kind="ordinary",
                        publish=pub,
                        group=group,
                    )
                    ok = not (r["deliveries"] != r["expected"] or r["short"] or r["extra"] or r["wrong_last_id"])
                    failures += not ok
                    report.log(
                        f"{label}: server {r['server_cpu']:.2f} s CPU, load generator {r['client_cpu']:.2f} s, "
                        f"{r['deliveries']:,}/{r['expected']:,} deliveries in {r['wall']:.2f} s, "
                        f"{r['per_chunk']:.1f} messages per chunk"
                        + (f", p50 {r['p50_ms']:.1f} ms p99 {r['p99_ms']:.1f} ms" if rate else "")
                        + ("" if ok else f"  LOST/DUPLICATED: {r}")
                    )
                    cpu.setdefault(label, []).append(r["server_cpu"] * 1e6 / max(r["deliveries"], 1))
                    raw.setdefault(f"{kind} {pub} {sc}", []).append(r["server_cpu"])
                    if rate:
                        lat.setdefault(label, []).append(r["p99_ms"])
    for label, values in cpu.items():
        kind, pub, rest = label.split(" ", 2)
        gem = f"gem route {rest}"
        report.add(
            f"{label} server",
            values,
            "s",
            higher_is_better=False,
            baselines=[f"{gem} server"] if kind != "gem" and gem in cpu else [],
        )
    for label, values in lat.items():
        report.add(f"{label} p99 latency", values, "ms", higher_is_better=False)
    if "small" in scenarios and "large" in scenarios:
        (n, m_small, _), (_, m_large, _) = (ORDINARY_SIZES[x][1 if args.quick else 0] for x in ("small", "large"))
        extra_deliveries = n * (m_large - m_small)
        for pub in publishes:
            for kind in servers:
                small, large = raw.get(f"{kind} {pub} small"), raw.get(f"{kind} {pub} large")
                if not small or not large:
                    continue
                marg = [(b - a) * 1e6 / extra_deliveries for a, b in zip(small, large, strict=True)]
                gem_label = f"gem route marginal ({n} x {m_small} -> {m_large}) server"
                report.add(
                    f"{kind} {pub} marginal ({n} x {m_small} -> {m_large}) server",
                    marg,
                    "s",
                    higher_is_better=False,
                    baselines=[gem_label] if kind != "gem" and "gem" in servers else [],
                )
    if not args.quick and "lean" in servers and "gem" in servers:
        for sc in ("burstA", "burstB"):
            n, m, _ = ORDINARY_SIZES[sc][0]
            for pub in publishes:
                lean = cpu.get(f"lean {pub} {sc} ({n} x {m})")
                gem = cpu.get(f"gem route {sc} ({n} x {m})")
                if lean and gem:
                    report.target(
                        f"lean {pub} {sc}: gem / lean server CPU per delivery",
                        statistics.median(gem) / statistics.median(lean),
                        5.0,
                        unit="x",
                    )
    report.note(
        "ordinary app: MessageBusMiddleware wrapping an ASGI app (POST /publish calls bus.publish) with user, group, "
        "site and extra-header lookups; the gem runs perf/gem_app.ru (the same app) under puma, memory backend; "
        f"messages {'to group ' + str(group) if group is not None else 'untargeted'}, site s1; 4 publishers in bursts"
    )
    report.note(
        "server = every server process (gunicorn master and 2 workers, or the puma process) between 'all parked' and "
        "'all delivered'; the load generator (2 processes) and the publishers share the same 2 cores"
    )
    report.emit()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
