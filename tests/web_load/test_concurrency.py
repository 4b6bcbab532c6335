"""Many concurrent streaming polls on a 2-core machine, one published message delivered to every one of them.

* ASGI under uvicorn (2 workers): 10,000 parked polls.
* WSGI under gunicorn with gevent workers (2 workers): 2,000 parked polls.

The client is ``perf/_http_load.py`` (raw asyncio sockets; a poll is parked once its first ``[]`` chunk
arrived, which the server sends after registering it). ``max_active_clients`` is raised above the count (it is
per process: above it polls are answered at once instead of parking, and the first-chunk wait would fail), the
long-poll interval is raised so no stream ends while the others connect, and the open-file limit is raised here
(the servers inherit it).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from shmbus import Bus
from tests import harness
from tests.harness import REPO_ROOT, skip_or_fail

PERF = REPO_ROOT / "perf"
load = harness.import_file(PERF / "_http_load.py")

pytestmark = pytest.mark.slow
CHANNEL = "/load/all"


@pytest.fixture
def bus(bus_name: str) -> Any:
    b = Bus(bus_name, keepalive_interval=0, create=True)
    try:
        yield b
    finally:
        b.destroy()


def env_for(bus: Bus, n: int) -> dict[str, str]:
    opts = {"max_active_clients": n + 1000, "long_polling_interval": 300}
    return {"SHMBUS_LOAD_BUS": bus.name, "SHMBUS_LOAD_OPTS": json.dumps(opts)}


def need_fds(n: int) -> None:
    """Client and server each hold ``n`` sockets: skip when the hard limit makes that impossible."""
    __tracebackhide__ = True
    got = load.raise_nofile(n + 1000)
    if got < n + 500:
        skip_or_fail(f"RLIMIT_NOFILE hard limit {got} < {n + 500} (raise it: ulimit -Hn, /etc/security/limits.conf)")


def fan_out(port: int, bus: Bus, n: int, server: Any) -> None:
    async def run() -> None:
        conns: list[load.StreamConn] = []
        try:
            conns = await load.open_streams(port, n, CHANNEL, timeout=45)
            assert len(conns) == n
            assert not any(c.lost for c in conns)
            bus.publish(CHANNEL, {"hello": "everyone"})
            await load.wait_counts(conns, 1, timeout=30)
            got = sum(1 for c in conns if c.count == 1)
            extra = sum(1 for c in conns if c.count > 1)
            assert (got, extra) == (n, 0), (
                f"{got}/{n} clients got the message, {extra} more than once\n--- server log ---\n{server.log()[-3000:]}"
            )
        finally:
            load.close_all(conns)

    asyncio.run(run())


def test_uvicorn_asgi_10k(bus: Bus, procs: Any) -> None:
    n = 10_000
    need_fds(n)
    server = procs.uvicorn_server(
        "_http_apps:asgi_app",
        workers=2,
        env=env_for(bus, n),
        app_dir=PERF,
        extra_args=("--backlog", "4096"),
        health_path="/",
    )
    fan_out(server.port, bus, n, server)


def test_gunicorn_gevent_wsgi_2k(bus: Bus, procs: Any) -> None:
    harness.require_module("gevent")
    n = 2_000
    need_fds(n)
    server = procs.gunicorn_server(
        "_http_apps:wsgi_app",
        workers=2,
        worker_class="gevent",
        config="python:shmbus.adapters.integrations.gunicorn",
        env=env_for(bus, n),
        app_dir=PERF,
        extra_args=("--worker-connections", str(n + 500), "--backlog", "4096"),
    )
    fan_out(server.port, bus, n, server)


def test_client_counts_deliveries_exactly(tmp_path: Path) -> None:
    """The load client's counter: a token split across reads is counted once, the first chunk parks."""

    async def run() -> None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        c = load.StreamConn(b"", fut)
        msg = b'[{"global_id":1,"message_id":1,"channel":"/x","data":1}]\r\n|\r\n'
        stream = b"HTTP/1.1 200 OK\r\n\r\n7\r\n[]\r\n|\r\n\r\n" + msg * 3
        for i in range(0, len(stream), 5):
            c.data_received(stream[i : i + 5])
        assert fut.done() and c.count == 3

    asyncio.run(run())
