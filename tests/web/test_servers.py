"""Smoke tests with real servers: gunicorn (sync, gthread, gevent; WSGI) and uvicorn (ASGI).

A message published from ANOTHER process reaches a long-poll and a streaming client; exact stream framing on the
wire; HTTP/1.0 clients are not chunked; the gunicorn config module's hooks are used.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from shmbus import Bus
from tests.harness.wait import wait_for

from . import rawhttp
from .web_servers import WEB_DIR, env_for, start

pytestmark = pytest.mark.slow

PUBLISH = (
    "import sys; from shmbus import Bus; b = Bus(sys.argv[1], keepalive_interval=0, create=True); "
    "print(b.publish(sys.argv[2], sys.argv[3]))"
)


def publish_elsewhere(procs: Any, bus_name: str, channel: str, data: str) -> int:
    p = procs.spawn_python(PUBLISH, bus_name, channel, data)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    return int(out.strip())


def wire_chunk(payload: bytes) -> bytes:
    """The HTTP chunk carrying one streamed piece (the size counts the 5 separator bytes)."""
    return b"%x\r\n%s\r\n|\r\n\r\n" % (len(payload) + 5, payload)


def server_log(server: Any) -> str:
    return "\n--- server log ---\n" + server.log()


def check_stream_and_long_poll(server: Any, procs: Any, bus_name: str) -> None:
    port = server.port
    # streaming: exact framing, first [] chunk at once, then the message from another process
    s = rawhttp.poll(port, "streamer", {"/smoke": -1}, chunk=True).read_head()
    assert s.status == 200, server_log(server)
    assert s.headers["content-type"] == "text/plain; charset=utf-8"
    assert s.headers["x-content-type-options"] == "nosniff"
    assert s.headers["transfer-encoding"] == "chunked"
    assert s.headers["access-control-allow-origin"] == "*"
    first = s.read_until(b"\r\n|\r\n\r\n")
    assert first == wire_chunk(b'[{"global_id":-1,"message_id":-1,"channel":"/__status","data":{"/smoke":0}}]')
    # long poll (non-streaming), parked in the other worker or the same
    lp = rawhttp.poll(port, "longpoller", {"/smoke": 0})
    n = publish_elsewhere(procs, bus_name, "/smoke", "from-another-process")
    assert n == 1
    body = lp.read_head().read_all()
    assert json.loads(body) == [
        {"global_id": 1, "message_id": 1, "channel": "/smoke", "data": "from-another-process"}
    ], server_log(server)
    assert lp.headers["content-type"] == "application/json; charset=utf-8"
    data = s.read_until(b"from-another-process")
    assert wire_chunk(b'[{"global_id":1,"message_id":1,"channel":"/smoke","data":"from-another-process"}]') in data
    s.close()
    # the worker keeps serving
    r = rawhttp.poll(port, "after", {"/smoke": 0}, dlp=True).read_head()
    assert json.loads(r.read_all())[0]["data"] == "from-another-process"


@pytest.fixture
def shared_bus(bus_name: str) -> Any:
    b = Bus(bus_name, keepalive_interval=0, create=True)
    b.last_id("/x")  # create the segment before the servers attach
    try:
        yield b
    finally:
        b.destroy()


@pytest.mark.parametrize("worker_class", ["gthread", "gevent"])
def test_gunicorn_stream_and_long_poll(procs: Any, bus_name: str, shared_bus: Bus, worker_class: str) -> None:
    server = start("gunicorn", procs, bus_name, worker_class=worker_class, long_polling_interval=20)
    check_stream_and_long_poll(server, procs, bus_name)


def test_uvicorn_stream_and_long_poll(procs: Any, bus_name: str, shared_bus: Bus) -> None:
    server = start("uvicorn", procs, bus_name, long_polling_interval=20)
    check_stream_and_long_poll(server, procs, bus_name)


def test_gunicorn_uvicorn_worker(procs: Any, bus_name: str, shared_bus: Bus) -> None:
    server = start("gunicorn", procs, bus_name, worker_class="uvicorn.workers.UvicornWorker", long_polling_interval=20)
    check_stream_and_long_poll(server, procs, bus_name)


def test_gunicorn_sync_polls_at_once_by_default(procs: Any, bus_name: str, shared_bus: Bus) -> None:
    server = start(
        "gunicorn", procs, bus_name, worker_class="sync", extra_args=("--threads", "1"), long_polling_interval=20
    )
    r = rawhttp.poll(server.port, "c", {"/smoke": 0}, chunk=True).read_head()
    assert (r.status, r.read_all()) == (200, b"[]")  # no parking on a one-request-at-a-time worker
    publish_elsewhere(procs, bus_name, "/smoke", "later")
    r = rawhttp.poll(server.port, "c", {"/smoke": 0}).read_head()
    assert json.loads(r.read_all())[0]["data"] == "later"


SYNC_WARNING = "this WSGI server handles one request at a time"


def test_a_sync_worker_without_the_config_module_warns_once_at_start(
    procs: Any, bus_name: str, shared_bus: Bus
) -> None:
    """The newcomer's 13.6 s deliveries: plain ``gunicorn -k sync`` answers every poll at once, and used to say
    nothing about it. Now the worker says so once, at start-up (before any poll), and names the fix."""
    server = procs.gunicorn_server(
        "webapps:wsgi_app",
        workers=1,
        worker_class="sync",
        env=env_for(bus_name, long_polling_interval=20),
        app_dir=WEB_DIR,
    )
    wait_for(lambda: SYNC_WARNING in server.log(), timeout=30)
    assert "python:shmbus.adapters.integrations.gunicorn" in server.log()
    for _ in range(3):
        r = rawhttp.poll(server.port, "c", {"/smoke": 0}).read_head()
        assert (r.status, r.read_all()) == (200, b"[]")
    assert server.log().count(SYNC_WARNING) == 1, server_log(server)


def test_the_config_modules_gthread_worker_does_not_warn(procs: Any, bus_name: str, shared_bus: Bus) -> None:
    server = start("gunicorn", procs, bus_name, workers=1, long_polling_interval=1)
    r = rawhttp.poll(server.port, "c", {"/smoke": 0}).read_head()
    assert r.status == 200
    r.read_all()
    assert SYNC_WARNING not in server.log(), server_log(server)


def test_gunicorn_sync_long_polling_opt_in(procs: Any, bus_name: str, shared_bus: Bus) -> None:
    server = start(
        "gunicorn",
        procs,
        bus_name,
        worker_class="sync",
        workers=3,
        extra_args=("--threads", "1"),
        long_polling_interval=20,
        long_polling_on_sync_workers=True,
    )
    check_stream_and_long_poll(server, procs, bus_name)


@pytest.mark.parametrize("server_kind", ["gunicorn", "uvicorn"])
def test_http10_client_is_not_chunked(procs: Any, bus_name: str, shared_bus: Bus, server_kind: str) -> None:
    server = start(server_kind, procs, bus_name, long_polling_interval=1)
    shared_bus.publish("/foo", "x")
    r = rawhttp.poll(server.port, "old", {"/foo": 0}, chunk=True, version="1.0").read_head()
    assert "transfer-encoding" not in r.headers
    assert r.headers["content-type"] == "application/json; charset=utf-8"
    assert json.loads(r.read_all())[0]["data"] == "x"
    r = rawhttp.poll(server.port, "old", {"/foo": 1}, chunk=True, version="1.0").read_head()
    assert r.read_all() == b"[]"  # parked without streaming, answered at the timeout


@pytest.mark.parametrize("server_kind", ["gunicorn", "uvicorn"])
def test_t7_exact_wire_bytes(procs: Any, bus_name: str, shared_bus: Bus, server_kind: str) -> None:
    server = start(server_kind, procs, bus_name, long_polling_interval=1)
    r = rawhttp.poll(server.port, "t7", {"/foo": 0}, chunk=True).read_head()
    r.read_all()
    assert r.raw_body == b"7\r\n[]\r\n|\r\n\r\n7\r\n[]\r\n|\r\n\r\n0\r\n\r\n"


def test_disconnect_mid_stream_is_cleaned_up(procs: Any, bus_name: str, shared_bus: Bus) -> None:
    """Clients that vanish do not accumulate: many abandoned streams, then max_active_clients=5 still parks."""
    server = start("uvicorn", procs, bus_name, long_polling_interval=30, max_active_clients=5)
    for i in range(20):
        s = rawhttp.poll(server.port, f"gone{i}", {"/foo": 0}, chunk=True).read_head()
        s.read_until(b"[]\r\n|\r\n")
        s.close()
    import time

    deadline = time.monotonic() + 15
    while True:  # a stream still parks (i.e. the 20 vanished clients were unregistered)
        s = rawhttp.poll(server.port, "alive", {"/foo": 0}, chunk=True).read_head()
        if s.headers.get("content-type", "").startswith("text/plain"):
            break
        s.read_all()
        assert time.monotonic() < deadline, "vanished clients still count as active"
        time.sleep(0.1)
    s.read_until(b"[]\r\n|\r\n")
    publish_elsewhere(procs, bus_name, "/foo", "still-works")
    assert b"still-works" in s.read_until(b"still-works")
    s.close()


def test_gunicorn_config_module_values() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import shmbus.adapters.integrations.gunicorn as g; "
            "print(g.worker_class, g.threads, g.timeout, callable(g.post_fork), "
            "callable(g.worker_exit))",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.stdout.split() == ["gthread", "32", "60", "True", "True"]
