"""Hostile clients against real servers: the lean gunicorn worker and gunicorn's uvicorn worker (with the
middleware). No wall-clock assertion: timeouts are set small in the servers' config and only bound the waits.

* a flood: one connection parks a long poll and pipelines 60 KB requests behind it (up to 1 GB offered);
* slowloris: 200 connections send half a request head;
* a corpus of 2,000+ generated malformed, oversized, pipelined and half-closed requests;
* bodies: a chunk size of ffffffffffffffff, a 10 MB body (413, never a reset), a stalled body (408).
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from tests.web import hostile

from .wire import Conn, poll, request

SERVER_DIR = Path(__file__).resolve().parent
LIMITS = {"header_timeout": 2, "body_timeout": 2, "max_pipeline_bytes": 65536, "linger": 1}
SERVERS = {
    "lean": "shmbus.adapters.server.GunicornWorker",
    "uvicorn": "shmbus.adapters.server.uvicorn_worker.UvicornWorker",
}


@pytest.fixture(params=sorted(SERVERS))
def server(request: pytest.FixtureRequest, procs: Any, bus_name: str, shared_bus: Any, tmp_path: Path) -> Any:
    """One worker of each kind, serving ``server_apps:mw_app`` with small timeouts (``shmbus_server``)."""
    limits = dict(LIMITS, **getattr(request, "param_limits", {}))
    conf = tmp_path / "conf.py"
    conf.write_text(f"shmbus_server = {limits!r}\nkeepalive = 5\n")
    env = {
        "SHMBUS_TEST_BUS": bus_name,
        "SHMBUS_TEST_OPTS": json.dumps({"long_polling_interval": 1.0, "body_timeout": 2}),
    }
    srv = procs.gunicorn_server(
        "server_apps:mw_app",
        workers=1,
        worker_class=SERVERS[request.param],
        config=conf,
        env=env,
        app_dir=SERVER_DIR,
        health_path="/pid",
    )
    srv.kind = request.param
    return srv


def worker_pid(port: int) -> int:
    status, body = hostile.http_get(port, "/pid")
    assert status == 200
    return int(body)


def test_a_pipelined_flood_behind_a_parked_poll_keeps_memory_bounded(server: Any, procs: Any) -> None:
    pid = worker_pid(server.port)
    before = hostile.rss_kb(pid)
    res = hostile.flood(server.port, pid, seconds=12, max_bytes=1 << 30)
    growth_mb = (res.peak_rss_kb - before) / 1024
    assert growth_mb < 50, f"{server.kind}: RSS grew {growth_mb:.0f} MB while {res.offered >> 20} MB were offered"
    assert res.normal_polls_ok >= 5 and res.normal_polls_failed == 0, (res.normal_polls_ok, res.errors[:3])
    assert worker_pid(server.port) == pid, "the worker was restarted"


def test_slowloris_connections_get_408_and_are_closed(server: Any) -> None:
    pid = worker_pid(server.port)
    statuses, closed = hostile.slowloris(server.port, 200, wait=LIMITS["header_timeout"] + 10)
    assert closed == 200, f"{server.kind}: {200 - closed} half-sent heads still open after the header timeout"
    assert statuses.count(408) == 200, sorted(set(statuses))
    assert worker_pid(server.port) == pid


def test_a_generated_corpus_of_hostile_requests_gets_no_5xx_and_no_silent_close(server: Any) -> None:
    pid = worker_pid(server.port)
    before = hostile.rss_kb(pid)
    cases = hostile.generate(2000)
    res = hostile.run_corpus(server.port, cases)
    assert res.requests == 2000
    assert not res.server_errors, f"{server.kind}: {len(res.server_errors)} 5xx, e.g. {res.server_errors[:3]}"
    assert not res.no_response, f"{server.kind}: {len(res.no_response)} without a response: {res.no_response[:5]}"
    assert worker_pid(server.port) == pid, "a worker died and was restarted"
    assert (hostile.rss_kb(pid) - before) / 1024 < 50


def test_an_endless_chunk_size_on_a_bus_route_gets_411_at_once(server: Any) -> None:
    c = Conn(server.port).send(
        b"POST /message-bus/cid/poll HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\nabc"
    )
    r = c.read_response(timeout=1.5)  # well before the 2 s body timeout: refused from the head alone
    assert r.status == 411 and b"Content-Length" in r.body
    assert c.closed_by_peer()


def test_a_10_mb_body_gets_413_not_a_reset(server: Any) -> None:
    for _ in range(3):
        c = Conn(server.port)
        body = b"x" * (10 << 20)
        head = request(
            "POST",
            "/message-bus/cid/poll",
            b"",
            {"Content-Length": str(len(body)), "Content-Type": "application/x-www-form-urlencoded"},
        )
        c.sock.sendall(head)
        try:
            c.sock.sendall(body)  # the server may stop reading after its answer; that must not reset the answer
        except OSError:
            pass
        r = c.read_response()
        assert r.status == 413, r
        c.close()


def test_a_stalled_body_gets_408(server: Any) -> None:
    c = Conn(server.port).send(
        b"POST /message-bus/cid/poll HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n"
        b"Content-Type: application/x-www-form-urlencoded\r\n\r\n/a=0"
    )
    r = c.read_response(timeout=LIMITS["body_timeout"] + 5)
    assert r.status == 408


def test_max_connections_refuses_the_surplus_with_503(
    procs: Any, bus_name: str, shared_bus: Any, tmp_path: Path
) -> None:
    conf = tmp_path / "conf.py"
    conf.write_text(f"shmbus_server = {dict(LIMITS, max_connections=20)!r}\n")
    env = {"SHMBUS_TEST_BUS": bus_name}
    srv = procs.gunicorn_server(
        "server_apps:mw_app",
        workers=1,
        worker_class=SERVERS["lean"],
        config=conf,
        env=env,
        app_dir=SERVER_DIR,
        health_path="/pid",
    )
    held = [Conn(srv.port) for _ in range(20)]  # idle keep-alive connections (5 s idle limit)
    time.sleep(0.3)
    extra = Conn(srv.port)
    r = extra.read_response(timeout=5)
    assert r.status == 503 and b"more than 20 connections" in r.body
    for c in held:
        c.close()
    time.sleep(0.5)
    c = Conn(srv.port).send(poll("ok", {"/foo": 0}, dlp=True))
    assert c.read_response().status == 200


def test_the_uvicorn_worker_stops_within_graceful_timeout_with_a_parked_poll(
    procs: Any, bus_name: str, shared_bus: Any
) -> None:
    """Stock UvicornWorker waits for a parked 25 s poll until gunicorn kills it ("Perhaps out of memory?");
    ours ends parked polls before graceful_timeout and exits by itself."""
    env = {"SHMBUS_TEST_BUS": bus_name, "SHMBUS_TEST_OPTS": json.dumps({"long_polling_interval": 60})}
    srv = procs.gunicorn_server(
        "server_apps:mw_app",
        workers=1,
        worker_class=SERVERS["uvicorn"],
        env=env,
        app_dir=SERVER_DIR,
        health_path="/pid",
        graceful_timeout=3,
    )
    c = Conn(srv.port).send(poll("parked", {"/foo": 0}))  # long poll (Dont-Chunk): waits 60 s
    time.sleep(0.5)
    srv.proc.terminate()  # SIGTERM to the master: graceful stop
    srv.proc.wait(timeout=30)
    log = srv.log()
    assert "Perhaps out of memory" not in log and "SIGKILL" not in log, log[-2000:]
    assert "Finished server process" in log, f"the worker was killed, it did not stop by itself:\n{log[-2000:]}"
    c.close()


@pytest.mark.parametrize("kind", sorted(SERVERS))
def test_a_stream_whose_client_closes_ends_at_once(procs: Any, bus_name: str, shared_bus: Any, kind: str) -> None:
    """A client that closes its side while its stream runs is gone: the server must close too (and the poll be
    unregistered), not keep the stream, and keep writing to it, until long_polling_interval (60 s here). The
    uvicorn worker used to keep it: 300 gone streams still ran at shutdown in perf/bench_http_cost.py."""
    env = {"SHMBUS_TEST_BUS": bus_name, "SHMBUS_TEST_OPTS": json.dumps({"long_polling_interval": 60})}
    srv = procs.gunicorn_server(
        "server_apps:mw_app", workers=1, worker_class=SERVERS[kind], env=env, app_dir=SERVER_DIR, health_path="/pid"
    )
    sock = socket.create_connection(("127.0.0.1", srv.port))
    try:
        sock.sendall(poll("gone", {"/foo": -1}, chunk=True))
        sock.settimeout(10)
        first = b""
        while b"/__status" not in first:  # the head and the first chunk may come in separate reads
            got = sock.recv(65536)
            assert got, first
            first += got
        assert b"transfer-encoding: chunked" in first.lower(), first
        sock.shutdown(socket.SHUT_WR)  # FIN: what a client that exits sends
        deadline = time.monotonic() + 20  # a bound well under the 60 s interval, not a timing claim
        rest = b""
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                continue
            if not chunk:
                break
            rest += chunk
        else:
            pytest.fail(f"{kind}: the stream of a closed client was still open after 20 s")
    finally:
        sock.close()


def test_a_request_pipelined_behind_a_parked_poll_is_answered_with_its_held_body(server: Any) -> None:
    """Its head is parsed while the poll waits, its body held: both must be read when its turn comes."""
    body = b"/x=0&pad=" + b"p" * 20_000  # more than one parser step: the body lands in the held input
    c = Conn(server.port).send(poll("cid", {"/x": 0}) + hostile.poll_request("cid2", body))
    first = c.read_response(timeout=10)  # the long poll, answered at its 1 s timeout
    second = c.read_response(timeout=5)  # well before the 2 s body timeout would answer 408
    assert (first.status, second.status) == (200, 400), (first, second)  # 400: "pad" is not an id


def test_a_stalled_second_head_on_a_kept_alive_connection_gets_408(server: Any) -> None:
    c = Conn(server.port).send(request("GET", "/pid"))
    assert c.read_response().status == 200
    c.send(b"GET /pid HTTP/1.1\r\nHost: x\r\nX-Slow: ")  # the second request never finishes its head
    r = c.read_response(timeout=LIMITS["header_timeout"] + 5)
    assert r.status == 408
    assert c.closed_by_peer()


@pytest.mark.parametrize("kind", sorted(SERVERS))
def test_an_app_that_reads_its_body_slowly_is_not_a_slow_client(
    procs: Any, bus_name: str, shared_bus: Any, tmp_path: Path, kind: str
) -> None:
    """A server stops reading while the app has not taken what was buffered: that wait is not the client's,
    so it must not count against body_timeout."""
    conf = tmp_path / "conf.py"
    conf.write_text(f"shmbus_server = {LIMITS!r}\n")
    srv = procs.gunicorn_server(
        "server_apps:mw_app",
        workers=1,
        worker_class=SERVERS[kind],
        config=conf,
        env={"SHMBUS_TEST_BUS": bus_name},
        app_dir=SERVER_DIR,
        health_path="/pid",
    )
    body = b"b" * (1 << 20)
    c = Conn(srv.port).send(request("POST", "/slowread", body))  # the app sleeps 3 s > body_timeout 2 s
    r = c.read_response(timeout=20)
    assert r.status == 201 and json.loads(r.body)["body_len"] == len(body)
