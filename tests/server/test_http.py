"""gunicorn with ``GunicornWorker`` (real processes): HTTP behaviour around the bus routes.

Bad input gets a precise 4xx and the worker keeps serving; request limits; ``Expect: 100-continue``; non-bus
routes reach the wrapped ASGI app (streamed request body, headers, chunked response, HEAD, HTTP/1.0, errors);
a plain ASGI app with ``shmbus_options`` from the gunicorn config; ``max_requests``; the standalone CLI.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from shmbus import Bus
from tests import harness
from tests.harness.procs import free_port, wait_http

from .wire import Conn, poll, request

SERVER_DIR = Path(__file__).resolve().parent
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("parser", ["httptools", "pure"])
def test_bad_input_precise_4xx_and_worker_keeps_serving(start: Any, shared_bus: Bus, parser: str) -> None:
    if parser == "httptools":
        harness.require_module("httptools")
    server = start(workers=1, parser=None if parser == "httptools" else "pure", max_body_size=1000)
    port = server.port
    shared_bus.publish("/ok", "fine")
    cases = [
        (
            request("POST", "/message-bus/c1/poll", b"{nope", {"Content-Type": "application/json"}),
            400,
            b"malformed JSON body",
        ),
        (
            request("POST", "/message-bus/c1/poll", b"/a=abc", {"Content-Type": "application/x-www-form-urlencoded"}),
            400,
            b"invalid id for channel '/a': 'abc' is not an integer",
        ),
        (request("POST", "/message-bus/bad!id/poll", b"/a=1"), 400, b"invalid client id"),
        (request("POST", "/message-bus/c1/nope", b"/a=1"), 404, b"unknown message-bus route"),
        (request("POST", "/message-bus/c1/poll", b"x", {"Content-Type": "text/xml"}), 415, b"unsupported content type"),
        (
            request(
                "POST", "/message-bus/c1/poll", b"/a=1&" * 300, {"Content-Type": "application/x-www-form-urlencoded"}
            ),
            413,
            b"request body too large (limit 1000 bytes)",
        ),
    ]
    c = Conn(port)
    for raw, status, reason in cases:
        r = c.send(raw).read_response()
        assert r.status == status and r.body.startswith(reason), (raw[:80], r)
        assert r.headers["access-control-allow-origin"] == "*"  # extra headers on errors too
        if status == 413:
            assert r.headers.get("connection") == "close"
            assert c.closed_by_peer()
            c = Conn(port)
    # a declared body over the limit with Expect: 100-continue is refused before the body is sent
    c = Conn(port).send(
        request("POST", "/message-bus/c2/poll", b"", {"Content-Length": "5000", "Expect": "100-continue"})
    )
    r = c.read_response()
    assert (r.status, r.headers.get("connection")) == (413, "close")
    # within the limit: 100 Continue, then the answer
    c = Conn(port).send(
        request(
            "POST",
            "/message-bus/c2/poll?dlp=t",
            b"",
            {"Content-Length": "8", "Expect": "100-continue", "Content-Type": "application/x-www-form-urlencoded"},
        )
    )
    assert c.read_response().status == 100
    r = c.send(b"/ok=0&/x").read_response()  # 8 bytes; every channel starts with "/" (shmbus.channels)
    assert r.status == 200 and json.loads(r.body)[0]["data"] == "fine"
    # malformed HTTP: 400 and a close
    for garbage in (
        b"GARBAGE\r\n\r\n",
        b"GET / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"GET / HTTP/1.1\r\nBad Header\r\n\r\n",
    ):
        c = Conn(port).send(garbage)
        r = c.read_response()
        assert r.status == 400, (garbage, r)
        assert c.closed_by_peer()
    c = Conn(port).send(b"GET /pid HTTP/1.1\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n")
    assert c.read_response().status == 431
    # still serving
    r = Conn(port).send(poll("after", {"/ok": 0}, dlp=True)).read_response()
    assert json.loads(r.body)[0]["data"] == "fine", server.log()


def echo(c: Conn, raw: bytes) -> dict[str, Any]:
    r = c.send(raw).read_response()
    assert (r.status, r.headers["x-echo"]) == (201, "yes"), r
    return dict(json.loads(r.body))


def test_other_routes_reach_the_asgi_app(start: Any) -> None:
    server = start(workers=1)
    c = Conn(server.port)
    body = os.urandom(300_000)
    e = echo(c, request("PUT", "/echo/a%20b?x=1&y=%20", body, {"X-Custom": "Value", "Content-Type": "app/bin"}))
    assert (e["method"], e["path"], e["raw_path"], e["query"], e["http_version"]) == (
        "PUT",
        "/echo/a b",
        "/echo/a%20b",
        "x=1&y=%20",
        "1.1",
    )
    assert ["x-custom", "Value"] in e["headers"] and ["content-type", "app/bin"] in e["headers"]
    assert (e["body_len"], e["body_sha"]) == (len(body), hashlib.sha256(body).hexdigest())
    assert e["lifespan"] == ["startup"]
    assert e["client"][0] == "127.0.0.1"
    # chunked request body, streamed; same connection
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (b"hello ", b"chunked ", b"world")) + b"0\r\n\r\n"
    e = echo(c, request("POST", "/echo", chunked, {"Transfer-Encoding": "chunked"}))
    assert (e["body_len"], e["body_head"]) == (19, "hello chunked world")
    # Expect: 100-continue: sent when the app reads the body
    c.send(request("POST", "/echo", b"", {"Content-Length": "4", "Expect": "100-continue"}))
    assert c.read_response().status == 100
    e = echo(c, b"abcd")
    assert e["body_head"] == "abcd"
    # no content-length from the app: chunked (1.1); HEAD: no body
    r = c.send(request("GET", "/chunks?n=3")).read_response()
    assert r.headers["transfer-encoding"] == "chunked" and r.body == b"piece0;piece1;piece2;"
    r = c.send(request("HEAD", "/pid")).read_response(head_request=True)
    assert r.status == 200 and int(r.headers["content-length"]) > 0
    r = c.send(request("GET", "/pid")).read_response()  # the HEAD left no stray body behind
    assert int(r.body) > 0
    # pipelined: a bridged request, a bus poll, a bridged request, answered in order
    c.send(request("GET", "/pid") + poll("p", {"/x": 0}, dlp=True) + request("GET", "/chunks?n=1"))
    assert int(c.read_response().body) > 0
    assert c.read_response().body == b"[]"
    assert c.read_response().body == b"piece0;"
    # HEAD on a bus route: answered at once (never parked), no body
    r = c.send(poll("h", {"/x": 0}).replace(b"POST ", b"HEAD ", 1)).read_response(head_request=True)
    assert (r.status, r.headers["content-length"]) == (200, "2")
    assert int(c.send(request("GET", "/pid")).read_response().body) > 0
    # a response header with CR/LF from the app is refused, never written
    c2 = Conn(server.port).send(request("GET", "/badheader"))
    r = c2.read_response()
    assert r.status == 500 and b"x-injected" not in r.head
    # an app that raises: 500, connection closed, worker fine
    r = c.send(request("GET", "/boom")).read_response()
    assert r.status == 500 and c.closed_by_peer()
    # HTTP/1.0: no chunking, the close ends the body
    c = Conn(server.port).send(request("GET", "/chunks?n=2", version="1.0"))
    r = c.read_response()
    assert "transfer-encoding" not in r.headers and r.body == b"piece0;piece1;"
    assert "Traceback" in server.log() and "RuntimeError: boom" in server.log()


CONFIG = """
import os

shmbus_options = {"bus": os.environ["SHMBUS_TEST_BUS"], "long_polling_interval": 20, "base_route": "/mb"}
max_requests = 30
keepalive = 1
"""


def test_plain_app_with_shmbus_options_and_max_requests(start: Any, procs: Any, shared_bus: Bus) -> None:
    server = start(app="server_apps:echo", workers=1, config_text=CONFIG)
    shared_bus.publish("/p", "hi")
    r = Conn(server.port).send(poll("x", {"/p": 0}, dlp=True).replace(b"/message-bus/", b"/mb/message-bus/"))
    assert json.loads(r.read_response().body)[0]["data"] == "hi"
    c = Conn(server.port)
    assert echo(c, request("POST", "/echo", b"x"))["body_len"] == 1
    first = int(c.send(request("GET", "/pid")).read_response().body)
    # keepalive = 1: an idle keep-alive connection is closed (the sweep runs every second)
    assert c.closed_by_peer(60)  # nothing but the keep-alive sweep closes an idle connection
    # max_requests = 30: the worker is replaced
    deadline = time.monotonic() + 30
    pid = first
    while pid == first:
        assert time.monotonic() < deadline, "max_requests did not restart the worker"
        try:
            pid = int(
                Conn(server.port).send(request("GET", "/pid", headers={"Connection": "close"})).read_response().body
            )
        except (EOFError, ConnectionError):
            time.sleep(0.05)
    r = Conn(server.port).send(poll("x", {"/p": 0}, dlp=True).replace(b"/message-bus/", b"/mb/message-bus/"))
    assert json.loads(r.read_response().body)[0]["data"] == "hi"


def test_standalone_cli(procs: Any, bus_name: str, shared_bus: Bus) -> None:
    port = free_port()
    p = procs.spawn(
        [
            sys.executable,
            "-m",
            "shmbus.adapters.server",
            "server_apps:mw_app",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            "2",
        ],
        env={"SHMBUS_TEST_BUS": bus_name, "PYTHONPATH": str(SERVER_DIR)},
        cwd=str(SERVER_DIR),
    )
    wait_http(f"http://127.0.0.1:{port}/pid", timeout=30, proc=p)
    s = Conn(port).send(poll("cli", {"/c": 0}, chunk=True))
    s.read_until(b"[]\r\n|\r\n")
    shared_bus.publish("/c", "via-cli")
    assert b"via-cli" in s.read_until(b"via-cli")
    p.send_signal(signal.SIGTERM)
    assert p.wait(20) == 0
    assert s.read_until(b"0\r\n\r\n", timeout=10).endswith(b"0\r\n\r\n")
