#!/usr/bin/env python3
"""HTTP fan-out: deliveries/s to N streaming message_bus polls on one channel (uvicorn, 2 workers, ASGI).

Also ``server``: the same middleware served by ``shmbus.adapters.server.GunicornWorker`` (2 workers).

N raw-socket streaming polls (perf/_http_load.py) park on one channel; a separate publisher process publishes M
messages (~100 bytes) in bursts (20, or 1) with a 1 ms pause; the figure is N*M deliveries divided by the time from
the first publish to the last delivery counted. The middleware should do one wake per worker per batch and
encode one frame per channel per batch, shared by every recipient, so its cost per delivery is one transport
write per client per batch.

Same-run baseline ("bare"): a bare asyncio server in one process (no HTTP framework, no bus) holding the same N
streams and writing one frame per burst to every client at the same pace: the naive design (no coalescing of
bursts that arrive while the previous write round runs, one process). shmbus beats it because each worker
coalesces whatever arrived since its last wake into one frame, and two workers share the writes. The load
generator is one Python process on the same 2 cores, so every figure is bounded by it. Published figures (not
measured here): the gem 55-65k deliveries/s, Starlette + broadcaster (SSE) 117k deliveries/s.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import time

import _common as c
import _http_load as load

from shmbus import Bus

QUICK_TIMEOUT = 150
FULL_TIMEOUT = 900
CHANNEL = "/bench/fanout"
PAD = "x" * 60


def publisher(bus_name: str, m: int, burst: int, go_fd: int) -> None:
    """Child: wait for the go byte, publish ``m`` messages in bursts of ``burst`` with a 1 ms pause."""
    bus = Bus(bus_name, keepalive_interval=0, create=True)
    bus.publish("/bench/warm", 0)
    os.read(go_fd, 1)
    for k in range(m):
        bus.publish(CHANNEL, {"i": k, "pad": PAD})
        if k % burst == burst - 1:
            time.sleep(0.001)
    bus.close()


def ceiling_server(sock: socket.socket, n: int, m: int, burst: int, go_fd: int) -> None:
    """Child: a bare asyncio server writing the frames the middleware would write, to ``n`` streams."""
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/plain; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n"
        b"7\r\n[]\r\n|\r\n\r\n"
    )

    def frame(k0: int) -> bytes:
        items = b",".join(
            b'{"global_id":%d,"message_id":%d,"channel":"%s","data":{"i":%d,"pad":"%s"}}'
            % (k, k, CHANNEL.encode(), k, PAD.encode())
            for k in range(k0, k0 + burst)
        )
        payload = b"[" + items + b"]\r\n|\r\n"
        return b"%x\r\n%s\r\n" % (len(payload), payload)

    async def main() -> None:
        transports: list[asyncio.Transport] = []

        class P(asyncio.Protocol):
            def connection_made(self, t: asyncio.BaseTransport) -> None:
                self.t = t

            def data_received(self, data: bytes) -> None:
                if b"\r\n\r\n" in data and self.t not in transports:
                    self.t.write(head)  # type: ignore[attr-defined]
                    transports.append(self.t)  # type: ignore[arg-type]

        loop = asyncio.get_running_loop()
        server = await loop.create_server(P, sock=sock, backlog=4096)
        await loop.run_in_executor(None, os.read, go_fd, 1)
        for k0 in range(0, m, burst):
            f = frame(k0)
            for t in transports:
                t.write(f)
            await asyncio.sleep(0.001)
        await asyncio.sleep(3600)
        server.close()

    asyncio.run(main())


def fork(fn: object, *args: object) -> int:
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            fn(*args)  # type: ignore[operator]
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 1
        os._exit(code)
    return pid


def reap(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


async def measure(port: int, n: int, m: int, go_w: int) -> tuple[float, int]:
    conns = await load.open_streams(port, n, CHANNEL, timeout=60)
    try:
        t0 = time.perf_counter()
        os.write(go_w, b"g")
        await load.wait_counts(conns, m, timeout=30)
        elapsed = time.perf_counter() - t0
        got = sum(min(x.count, m) for x in conns)
        dup = sum(max(0, x.count - m) for x in conns)
        if dup:
            raise AssertionError(f"{dup} duplicate deliveries")
        return got / elapsed, n * m - got
    finally:
        load.close_all(conns)


def run_shmbus(n: int, m: int, burst: int, native: bool = False) -> tuple[float, int]:
    """The middleware under uvicorn, or (``native``) served by shmbus.adapters.server.GunicornWorker."""
    bus, server = load.bench_server("bench-http-fanout", n, native)
    name = bus.name
    go_r, go_w = os.pipe()
    pub = fork(publisher, name, m, burst, go_r)
    try:
        return asyncio.run(measure(server.port, n, m, go_w))
    finally:
        reap(pub)
        os.close(go_r)
        os.close(go_w)
        server.stop()
        bus.destroy()


def run_ceiling(n: int, m: int, burst: int) -> tuple[float, int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(4096)
    go_r, go_w = os.pipe()
    pid = fork(ceiling_server, sock, n, m, burst, go_r)
    try:
        return asyncio.run(measure(sock.getsockname()[1], n, m, go_w))
    finally:
        reap(pid)
        sock.close()
        os.close(go_r)
        os.close(go_w)


def main() -> None:
    args = c.parse_args(__doc__)
    load.exit_on_sigterm()
    load.raise_nofile(30000)
    rep = c.Report("bench_http_fanout", "HTTP fan-out to streaming polls, one channel, uvicorn x2 (ASGI)", args)
    # (clients, messages, burst): bursts of 20 every ~1 ms offer more than anything here can take (batches grow:
    # the maximum); burst 1 = one message per ~1 ms, about one batch per message (per-batch cost). M stays below
    # what fits in max_stream_buffer (1 MiB per client, ~110 bytes per message): a longer flat-out run makes this
    # one-process client fall behind by more than that, and the middleware then drops every stream (by design).
    sizes = [(1000, 2000, 20), (1000, 1000, 1)] if args.quick else [(1000, 5000, 20), (1000, 3000, 1), (5000, 2000, 20)]
    repeats = args.repeats or (1 if args.quick else 3)
    rep.published("gem (Puma), deliveries/s", 65_000, "msgs/s", "message_bus gem, 55-65k deliveries/s")
    rep.published("Starlette+broadcaster SSE", 117_000, "msgs/s", "Starlette + broadcaster SSE, 117k/s")
    for n, m, burst in sizes:
        shm, nat, ceil = [], [], []
        lost = lost_nat = 0
        for r in range(repeats):
            rep.log(f"N={n} M={m} burst={burst} repeat {r + 1}/{repeats}")
            v, missing = run_shmbus(n, m, burst)
            shm.append(v)
            lost += missing
            v, missing = run_shmbus(n, m, burst, native=True)
            nat.append(v)
            lost_nat += missing
            ceil.append(run_ceiling(n, m, burst)[0])
        base = f"bare N={n} burst {burst}"
        rep.add(base, ceil, "msgs/s", note="bare asyncio server, 1 process, writes every burst to every client")
        row = f"shmbus N={n} x M={m} burst {burst}"
        rep.add(row, shm, "msgs/s", baselines=[base, "gem (Puma), deliveries/s", "Starlette+broadcaster SSE"])
        rep.add(
            f"server N={n} x M={m} burst {burst}",
            nat,
            "msgs/s",
            baselines=[row, base],
            note="shmbus.adapters.server.GunicornWorker",
        )
        if lost:
            rep.note(f"N={n}: {lost} deliveries missing at the timeout (over all repeats)")
        if lost_nat:
            rep.note(f"server N={n}: {lost_nat} deliveries missing at the timeout (over all repeats)")
        rep.target(f"deliveries/s N={n} burst {burst}", rep.rows[row].median, 200_000, unit=" msgs/s")
    rep.note(
        "one Python load-generator process shares the 2 cores with the 2 uvicorn workers: absolute figures "
        f"are bounded by it; {load.server_stack()} under gunicorn UvicornWorker"
    )
    rep.emit()


if __name__ == "__main__":
    sys.exit(main())
