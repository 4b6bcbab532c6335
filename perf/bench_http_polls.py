#!/usr/bin/env python3
"""Immediate polls/s (``?dlp=t``) and memory per held (parked) poll, 2 workers: uvicorn (ASGI) and shmbus's server.

Polls/s: 32 keep-alive connections from one raw-socket asyncio client, each sending the JS client's request
(form body, one channel, ``Dont-Chunk``) as soon as the previous ``[]`` answer arrived, for a few seconds.
Memory: the workers' summed RSS before and after parking H streaming polls (the first ``[]`` chunk received),
divided by H.

Same-run baseline: ``_http_apps.bare_asgi`` under the same uvicorn: it reads the body and answers ``[]`` with
the same headers (polls/s), or holds the request after the first chunk (memory): the cost of uvicorn itself,
so ``shmbus - bare`` is what the middleware adds. ``server``: the same middleware served by
``shmbus.adapters.server.GunicornWorker`` (bus routes answered natively from ``asyncio.Protocol`` callbacks, no
task per request). Published figures (not measured here): the gem ~3,300
polls/s and 6.6 KB per held poll; Starlette + broadcaster SSE 28 KB per connection.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import time

import _common as c
import _http_apps as apps
import _http_load as load

from shmbus import Bus

QUICK_TIMEOUT = 150
FULL_TIMEOUT = 900
CHANNEL = "/bench/polls"
ANSWER = b"\r\n\r\n[]"


class Poller(asyncio.Protocol):
    """Keep-alive connection: one request in flight; the next is sent when the ``[]`` answer arrived."""

    def __init__(self, request: bytes, state: dict[str, float]) -> None:
        self.request = request
        self.state = state
        self.tail = b""
        self.done = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:  # no Nagle delay on the next request
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transport.write(self.request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        buf = self.tail + data
        k = buf.count(ANSWER)
        self.tail = buf[-(len(ANSWER) - 1) :]
        if k:
            self.done += k
            if time.perf_counter() < self.state["stop"]:
                self.transport.write(self.request * k)  # type: ignore[attr-defined]


async def polls_per_second(port: int, seconds: float, conns: int = 32) -> float:
    loop = asyncio.get_running_loop()
    req = load.poll_request("pollbench", {CHANNEL: ""}, stream=False, dlp=True)
    state = {"stop": time.perf_counter() + 0.5}  # warm-up
    ps = [(await loop.create_connection(lambda: Poller(req, state), "127.0.0.1", port))[1] for _ in range(conns)]
    await asyncio.sleep(0.6)
    start_counts = sum(p.done for p in ps)
    t0 = time.perf_counter()
    state["stop"] = t0 + seconds
    for p in ps:
        p.transport.write(req)  # type: ignore[attr-defined]
    await asyncio.sleep(seconds)
    n = sum(p.done for p in ps) - start_counts
    elapsed = time.perf_counter() - t0
    for p in ps:
        p.transport.close()  # type: ignore[attr-defined]
    return n / elapsed


async def held_poll_kb(server: load.Uvicorn, n: int, query: str) -> float:
    warm = await load.open_streams(server.port, 50, CHANNEL, prefix="warm", query=query)  # touch the code paths
    await asyncio.sleep(0.5)
    before = sum(load.rss_kb(p) for p in server.worker_pids())
    conns = await load.open_streams(server.port, n, CHANNEL, query=query, timeout=120)
    await asyncio.sleep(1.0)
    after = sum(load.rss_kb(p) for p in server.worker_pids())
    load.close_all(conns)
    load.close_all(warm)
    return (after - before) * 1024 / n / 1000  # KB (10^3 bytes) per held poll


APPS = ("shmbus", "server", "bare")


def serve(app: str, n: int, bus: Bus | None = None) -> tuple[load.Uvicorn, Bus | None]:
    """Start the server for ``app`` ("shmbus": middleware on uvicorn; "server": shmbus's own; "bare")."""
    if app == "bare":
        return load.Uvicorn("_http_apps:bare_asgi"), None
    if bus is None:
        bus = Bus(c.unique_name("bench-http-polls"), keepalive_interval=0, create=True)
        bus.publish("/bench/warm", 0)
    opts = {"max_active_clients": n + 1000, "long_polling_interval": 300}
    env = {"SHMBUS_LOAD_BUS": bus.name, "SHMBUS_LOAD_OPTS": json.dumps(opts)}
    if app == "server":
        return load.Uvicorn("_http_apps:native_app", env=env, extra=["-k", apps.SERVER_WORKER]), bus
    return load.Uvicorn("_http_apps:asgi_app", env=env), bus


def _server_parser() -> str:
    import importlib.util

    return "httptools" if importlib.util.find_spec("httptools") else "built-in"


def main() -> None:
    args = c.parse_args(__doc__)
    load.exit_on_sigterm()
    load.raise_nofile(30000)
    rep = c.Report("bench_http_polls", "immediate polls/s (dlp=t) and memory per held poll, uvicorn x2", args)
    seconds = 3.0 if args.quick else 8.0
    held = 2000 if args.quick else 5000
    repeats = args.repeats or (1 if args.quick else 3)
    rates: dict[str, list[float]] = {a: [] for a in APPS}
    mem: dict[str, list[float]] = {a: [] for a in APPS}
    for r in range(repeats):
        for app in APPS:  # interleaved: one repeat of each, then the next
            rep.log(f"{app}: repeat {r + 1}/{repeats}")
            server, bus = serve(app, held)
            try:
                rates[app].append(asyncio.run(polls_per_second(server.port, seconds)))
            finally:
                server.stop()
            try:
                server, _ = serve(app, held, bus)
                try:
                    mem[app].append(asyncio.run(held_poll_kb(server, held, "hold=1" if app == "bare" else "")))
                finally:
                    server.stop()
            finally:
                if bus is not None:
                    bus.destroy()
    rep.published("gem polls/s", 3300, "ops/s", "message_bus gem (Puma), ~3,300 dlp=t polls/s")
    rep.add("bare uvicorn polls/s", rates["bare"], "ops/s", note="answers [] with the same headers, no bus")
    rep.add("shmbus polls/s", rates["shmbus"], "ops/s", baselines=["bare uvicorn polls/s", "gem polls/s"])
    rep.target("immediate polls/s", rep.rows["shmbus polls/s"].median, 6600, unit="/s")
    rep.add(
        "server polls/s",
        rates["server"],
        "ops/s",
        baselines=["bare uvicorn polls/s", "shmbus polls/s"],
        note="shmbus.adapters.server.GunicornWorker",
    )
    rep.target(
        "server polls/s > bare uvicorn",
        rep.rows["server polls/s"].median,
        rep.rows["bare uvicorn polls/s"].median,
        unit="/s",
    )
    rep.published("gem KB/held poll", 6.6, "KB", "message_bus gem, 6.6 KB per held poll")
    rep.published("Starlette+broadcaster KB/conn", 28.0, "KB", "Starlette + broadcaster SSE, 28 KB per connection")
    for name in ("gem KB/held poll", "Starlette+broadcaster KB/conn"):
        rep.rows[name].higher_is_better = False
    rep.add(
        "bare uvicorn KB/held request",
        mem["bare"],
        "KB",
        higher_is_better=False,
        note="uvicorn's own cost of an open streaming request",
    )
    rep.add(
        "shmbus KB/held poll",
        mem["shmbus"],
        "KB",
        higher_is_better=False,
        baselines=["bare uvicorn KB/held request", "gem KB/held poll", "Starlette+broadcaster KB/conn"],
    )
    shm_only = [a - b for a, b in zip(mem["shmbus"], mem["bare"], strict=True)]
    rep.add(
        "shmbus minus bare, KB/poll",
        shm_only,
        "KB",
        higher_is_better=False,
        note="what the middleware adds on top of uvicorn",
    )
    rep.target("memory per held poll", rep.rows["shmbus KB/held poll"].median, 5.0, at_least=False, unit=" KB")
    rep.add(
        "server KB/held poll",
        mem["server"],
        "KB",
        higher_is_better=False,
        baselines=["shmbus KB/held poll", "bare uvicorn KB/held request", "gem KB/held poll"],
        note="shmbus.adapters.server.GunicornWorker: the whole cost, server included",
    )
    rep.target("server memory per held poll", rep.rows["server KB/held poll"].median, 5.0, at_least=False, unit=" KB")
    rep.note(
        f"polls/s: 32 keep-alive connections, {seconds:g} s; memory: {held} held polls, RSS of both workers "
        f"(KB = 1000 bytes); {load.server_stack()} under gunicorn UvicornWorker; server: "
        f"{_server_parser()} parser + asyncio"
    )
    rep.emit()


if __name__ == "__main__":
    sys.exit(main())
