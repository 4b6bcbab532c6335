"""gunicorn with ``shmbus.adapters.server.GunicornWorker`` (real processes): the message_bus protocol on the wire.

Same behaviours as tests/web/test_servers.py: exact stream framing (first ``[]``/status chunk), a long poll
and a stream woken by a message published from ANOTHER process, HTTP/1.0 never chunked, keep-alive polls on
one connection, vanished clients unregistered, a client that stops reading dropped with bounded memory, bad
input answered with a precise 4xx while the worker keeps serving. Run with both parsers (httptools and the
built-in one).
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

import pytest

from shmbus import Bus
from tests import harness

from .wire import Conn, poll, request, wire_chunk

pytestmark = pytest.mark.slow

PARSERS = ["httptools", "pure"]
PUBLISH = (
    "import sys, time; from shmbus import Bus; b = Bus(sys.argv[1], keepalive_interval=0, create=True)\n"
    "n, pause = int(sys.argv[4]), float(sys.argv[5])\n"
    "for i in range(n):\n"
    "    r = b.publish(sys.argv[2], sys.argv[3])\n"
    "    if pause: time.sleep(pause)\n"
    "print(r)"
)


def publish_elsewhere(procs: Any, bus_name: str, channel: str, data: str, n: int = 1, pause: float = 0) -> int:
    p = procs.spawn_python(PUBLISH, bus_name, channel, data, str(n), str(pause))
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    return int(out.strip())


def parser_env(parser: str) -> str | None:
    if parser == "httptools":
        harness.require_module("httptools")
        return None
    return "pure"


@pytest.mark.parametrize("parser", PARSERS)
def test_stream_and_long_poll_across_processes(start: Any, procs: Any, bus_name: str, parser: str) -> None:
    server = start(parser=parser_env(parser), long_polling_interval=20)
    s = Conn(server.port).send(poll("streamer", {"/smoke": -1}, chunk=True))
    status, h, _ = s.read_head()
    assert status == 200, server.log()
    assert h["content-type"] == "text/plain; charset=utf-8"
    assert h["x-content-type-options"] == "nosniff"
    assert h["transfer-encoding"] == "chunked"
    assert h["access-control-allow-origin"] == "*"
    assert "content-length" not in h
    first = s.read_until(b"\r\n|\r\n\r\n")
    assert first == wire_chunk(b'[{"global_id":-1,"message_id":-1,"channel":"/__status","data":{"/smoke":0}}]')
    s.buf = b""
    lp = Conn(server.port).send(poll("longpoller", {"/smoke": 0}))
    time.sleep(0.2)  # not needed for correctness (a message before parking is in the backlog), only for coverage
    assert publish_elsewhere(procs, bus_name, "/smoke", "from-another-process") == 1
    r = lp.read_response()
    assert json.loads(r.body) == [
        {"global_id": 1, "message_id": 1, "channel": "/smoke", "data": "from-another-process"}
    ], server.log()
    assert r.headers["content-type"] == "application/json; charset=utf-8"
    assert r.headers["access-control-allow-origin"] == "*"
    data = s.read_until(b"from-another-process")
    assert data == wire_chunk(b'[{"global_id":1,"message_id":1,"channel":"/smoke","data":"from-another-process"}]')
    s.close()
    # the long poll's connection is kept alive: an immediate poll on it gets the backlog
    r = lp.send(poll("longpoller", {"/smoke": 0}, dlp=True, seq=2)).read_response()
    assert json.loads(r.body)[0]["data"] == "from-another-process"
    lp.close()


@pytest.mark.parametrize("parser", PARSERS)
def test_exact_wire_bytes_and_http10(start: Any, shared_bus: Bus, parser: str) -> None:
    server = start(parser=parser_env(parser), long_polling_interval=1)
    c = Conn(server.port).send(poll("t7", {"/foo": 0}, chunk=True))
    r = c.read_response()
    assert r.raw == b"7\r\n[]\r\n|\r\n\r\n7\r\n[]\r\n|\r\n\r\n0\r\n\r\n"  # first chunk, timeout's end chunk
    shared_bus.publish("/foo", "x")
    c = Conn(server.port).send(poll("old", {"/foo": 0}, chunk=True, version="1.0"))
    r = c.read_response()
    assert "transfer-encoding" not in r.headers
    assert r.headers["content-type"] == "application/json; charset=utf-8"
    assert json.loads(r.body)[0]["data"] == "x"
    assert c.closed_by_peer(), "HTTP/1.0 without keep-alive must be closed"
    c = Conn(server.port).send(
        poll("old", {"/foo": 1}, chunk=True, version="1.0", headers={"Connection": "keep-alive"})
    )
    r = c.read_response(timeout=15)
    assert (r.body, r.headers.get("connection")) == (b"[]", "keep-alive")  # parked unstreamed, ended at timeout
    r = c.send(poll("old", {"/foo": 0}, version="1.0", dlp=True, headers={"Connection": "keep-alive"})).read_response()
    assert json.loads(r.body)[0]["data"] == "x"
    c.close()


@pytest.mark.parametrize("parser", PARSERS)
def test_keep_alive_and_pipelined_polls_on_one_connection(
    start: Any, procs: Any, bus_name: str, shared_bus: Bus, parser: str
) -> None:
    server = start(parser=parser_env(parser), long_polling_interval=20, workers=1)
    shared_bus.publish("/k", "one")
    c = Conn(server.port)
    for i in range(20):
        r = c.send(poll("ka", {"/k": 0}, dlp=True, seq=i + 1)).read_response()
        assert json.loads(r.body)[0]["data"] == "one", r
        assert "connection" not in r.headers
    # three pipelined requests in one write: answered in order, one at a time
    c.send(poll("ka", {"/k": 0}, dlp=True, seq=30) + request("GET", "/pid") + poll("ka", {"/k": 1}, seq=31))
    assert json.loads(c.read_response().body)[0]["data"] == "one"
    pid = int(c.read_response().body)
    publish_elsewhere(procs, bus_name, "/k", "two")  # wakes the third (parked long poll)
    r = c.read_response()
    assert [m["data"] for m in json.loads(r.body)] == ["two"]
    # a stream after the long poll, same connection; then a message from another process; then the timeout
    c.send(poll("ka", {"/k": 2}, chunk=True, seq=32))
    status, h, _ = c.read_head()
    assert (status, h["transfer-encoding"]) == (200, "chunked")
    c.read_until(b"[]\r\n|\r\n\r\n")
    c.buf = b""
    publish_elsewhere(procs, bus_name, "/k", "three")
    assert b"three" in c.read_until(b"three")
    r = c.send(request("GET", "/pid")) and None
    c.sock.close()
    assert pid > 0 and r is None


def test_vanished_clients_are_unregistered(start: Any, procs: Any, bus_name: str) -> None:
    """20 streams that vanish, then max_active_clients=5 still parks: connection_lost unregistered them."""
    server = start(long_polling_interval=30, max_active_clients=5, workers=1)
    for i in range(20):
        c = Conn(server.port).send(poll(f"gone{i}", {"/foo": 0}, chunk=True))
        c.read_until(b"[]\r\n|\r\n")
        c.close()
    deadline = time.monotonic() + 15
    while True:
        c = Conn(server.port).send(poll("alive", {"/foo": 0}, chunk=True))
        _, h, _ = c.read_head()
        if h["content-type"].startswith("text/plain"):
            break
        c.close()
        assert time.monotonic() < deadline, "vanished clients still count as active"
        time.sleep(0.1)
    c.read_until(b"[]\r\n|\r\n")
    c.buf = b""
    publish_elsewhere(procs, bus_name, "/foo", "still-works")
    assert b"still-works" in c.read_until(b"still-works")
    c.close()


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):  # not RssShmem: the bus segment is mapped
                return int(line.split()[1])
    raise AssertionError("no RssAnon")


def worker_pids(server: Any) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            rest = stat[stat.rfind(b")") + 2 :].split()
            if int(rest[1]) == server.proc.pid:
                out.append(int(entry))
    return out


def test_client_that_stops_reading_is_dropped(start: Any, procs: Any, bus_name: str) -> None:
    """A stream whose client reads nothing: dropped once max_stream_buffer bytes queue up; memory bounded."""
    server = start(long_polling_interval=60, max_stream_buffer=1 << 20, workers=1)
    (pid,) = worker_pids(server)
    stuck = Conn(server.port, rcvbuf=4096).send(poll("stuck", {"/big": 0}, chunk=True))
    stuck.read_until(b"[]\r\n|\r\n")
    good = Conn(server.port).send(poll("good", {"/big": 0}, chunk=True))
    good.read_until(b"[]\r\n|\r\n")
    before = rss_kb(pid)
    payload = "x" * 50_000
    # 15 MB for a client that reads nothing, in small batches (a single batch larger than max_stream_buffer
    # would drop a reading client too: it is queued at once)
    pub = procs.spawn_python(PUBLISH, bus_name, "/big", payload, "300", "0.01")  # read while it publishes
    # the reading client gets everything...
    got = 0
    tail = b""
    good.sock.settimeout(60)
    while got < 300:
        data = tail + good.buf + good.sock.recv(1 << 20)
        good.buf = b""
        assert data != tail, f"the reading client was closed after {got} messages" + server.log()
        got += data.count(b'"message_id"')
        tail = data[-11:]
    assert got == 300
    assert pub.wait(60) == 0
    good.close()
    # ...the stuck one was dropped: reading now ends in a close, far short of 20 MB
    assert stuck.closed_by_peer(30), "the non-reading client was not dropped"
    grown = rss_kb(pid) - before
    assert grown < 10_000, f"worker private memory grew by {grown} KiB for a client that reads nothing"
    # and it no longer counts as parked: a new stream with the same id parks
    c = Conn(server.port).send(poll("stuck", {"/big": 300}, chunk=True, seq=2))
    c.read_until(b"[]\r\n|\r\n")
    c.close()


def test_graceful_shutdown_ends_parked_polls(start: Any) -> None:
    server = start(long_polling_interval=60, workers=1)
    s = Conn(server.port).send(poll("s", {"/g": 0}, chunk=True))
    s.read_until(b"[]\r\n|\r\n")
    lp = Conn(server.port).send(poll("l", {"/g": 0}))
    time.sleep(0.3)
    os.kill(server.proc.pid, signal.SIGTERM)  # gunicorn master -> SIGTERM to the worker
    r = lp.read_response(timeout=20)
    assert (r.status, r.body, r.headers.get("connection")) == (200, b"[]", "close")
    assert s.read_until(b"0\r\n\r\n", timeout=20).endswith(b"[]\r\n|\r\n\r\n0\r\n\r\n")
    server.proc.wait(20)
    assert server.proc.returncode == 0, server.log()


def test_a_long_interval_is_ended_by_the_server_clock(start: Any, shared_bus: Bus) -> None:
    """An interval of COARSE_EXPIRY (5 s) or more has no timer per parked poll: the 1 s clock ends the stream
    and the long poll, within a second after the interval, with the same bytes as the precise timer."""

    server = start(long_polling_interval=5, workers=1)
    t0 = time.monotonic()
    stream = Conn(server.port).send(poll("coarse-s", {"/coarse": 0}, chunk=True))
    long = Conn(server.port).send(poll("coarse-l", {"/coarse": 0}, headers={"Dont-Chunk": "true"}))
    assert stream.read_response(timeout=15).raw == b"7\r\n[]\r\n|\r\n\r\n7\r\n[]\r\n|\r\n\r\n0\r\n\r\n"
    assert long.read_response(timeout=15).body == b"[]"
    assert time.monotonic() - t0 >= 5.0  # never before the interval (the upper bound is the clock's second)
    stream.close()
    long.close()
