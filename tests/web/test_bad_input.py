"""Bad input: each case gets a precise 4xx with a short reason (never a 500), and the server keeps serving.

Run in-process over both shells, and through real servers (gunicorn gthread, uvicorn).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from shmbus import Bus

from . import rawhttp
from .web_servers import start

FORM = {"Content-Type": "application/x-www-form-urlencoded"}
JSONH = {"Content-Type": "application/json"}
P = "/message-bus/abc/poll?dlp=t"
many = "&".join(f"/c{i}=0" for i in range(201)).encode()

# (method, path, body, headers, status, reason)
CASES: list[tuple[str, str, bytes, dict[str, str], int, bytes]] = [
    ("POST", P, b"{not json", JSONH, 400, b"malformed JSON body"),
    ("POST", P, b"[1,2]", JSONH, 400, b"JSON body must be an object mapping channel to last id"),
    ("POST", P, b'{"/foo":"\xff"}', JSONH, 400, b"request body is not valid UTF-8"),
    ("POST", P, b"/foo=\xff", FORM, 400, b"request body is not valid UTF-8"),
    ("POST", P, b"/foo=%ff", FORM, 400, b"form body is not valid UTF-8 (after percent-decoding)"),
    ("POST", P, b"/foo=abc", FORM, 400, b"invalid id for channel '/foo': 'abc' is not an integer"),
    ("POST", P, b"/foo=1.5", FORM, 400, b"invalid id for channel '/foo': '1.5' is not an integer"),
    ("POST", P, b'{"/foo":1.5}', JSONH, 400, b"invalid id for channel '/foo': '1.5'"),
    ("POST", P, b'{"/foo":true}', JSONH, 400, b"invalid id for channel '/foo': True"),
    ("POST", P, b'{"/foo":[1]}', JSONH, 400, b"invalid id for channel '/foo': '[1]'"),
    (
        "POST",
        P,
        b"/foo=99999999999999999999",
        FORM,
        400,
        b"id out of range for channel '/foo' (|id| must be <= 9007199254740991)",
    ),
    (
        "POST",
        P,
        b'{"/foo":-99999999999999999999}',
        JSONH,
        400,
        b"id out of range for channel '/foo' (|id| must be <= 9007199254740991)",
    ),
    ("POST", P, b"/foo=0&__seq=x", FORM, 400, b"invalid id for channel '__seq': 'x' is not an integer"),
    ("POST", P, b'{"":0}', JSONH, 400, b"channel must not be empty"),
    ("POST", P, b'{"/a\\u0000b":0}', JSONH, 400, b"channel must not contain NUL: '/a\\x00b'"),
    ("POST", P, ("/" + "x" * 200 + "=0").encode(), FORM, 400, b"channel is longer than 160 bytes in UTF-8"),
    # the one channel rule (shmbus.channels): what SSE, WebSocket and bus.publish refuse, a poll refuses too
    ("POST", P, b"news=0", FORM, 400, b"channel must start with '/' (message_bus channel names are paths): 'news'"),
    ("POST", P, b'{"/a\\nb":0}', JSONH, 400, b"channel must not contain CR or LF: '/a\\nb'"),
    (
        "POST",
        P,
        b"/__shmbus_cache/settings=0",
        FORM,
        400,
        b"channel '/__shmbus_cache/settings' is reserved (names starting with '/__' are the bus's own)",
    ),
    ("POST", P, many, FORM, 400, b"too many channels in one poll (limit 200)"),
    ("POST", P, b"x" * (64 * 1024 + 1), FORM, 413, b"request body too large (limit 65536 bytes)"),
    (
        "POST",
        P,
        b"<xml/>",
        {"Content-Type": "text/xml"},
        415,
        b"unsupported content type (use application/x-www-form-urlencoded or application/json)",
    ),
    ("POST", "/message-bus/", b"", FORM, 404, b"not found"),
    ("POST", "/message-bus//poll", b"", FORM, 404, b"missing client id"),
    ("POST", "/message-bus/abc/poll/extra", b"", FORM, 404, b"unknown message-bus route"),
    ("POST", "/message-bus/a%20b/poll", b"", FORM, 400, b"invalid client id (1-128 characters of A-Z a-z 0-9 . _ ~ -)"),
    (
        "POST",
        "/message-bus/" + "a" * 129 + "/poll",
        b"",
        FORM,
        400,
        b"invalid client id (1-128 characters of A-Z a-z 0-9 . _ ~ -)",
    ),
    (
        "POST",
        "/message-bus/broadcast",
        b"channel=/x&data=1",
        FORM,
        404,
        b"broadcast is disabled (allow_broadcast=False)",
    ),
]
IDS = [f"{c[4]}-{c[5][:30].decode('latin-1')}" for c in CASES]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_bad_input_in_process(bus: Bus, driver: Any, kind: str, case: Any) -> None:
    method, path, body, headers, status, reason = case
    d = driver(kind)
    r = d.request(method, path, body, headers)
    got = r.body()
    assert (r.status, got) == (status, reason)
    assert r.header("content-type") == "text/plain; charset=utf-8" or (status == 404 and got == b"not found")


def test_bad_content_length(bus: Bus, driver: Any, kind: str) -> None:
    d = driver(kind)
    r = d.request("POST", P, b"", {"Content-Length": "abc", **FORM})
    assert (r.status, r.body()) == (400, b"invalid Content-Length")


@pytest.fixture
def shared_bus(bus_name: str) -> Any:
    b = Bus(bus_name, keepalive_interval=0, create=True)
    b.publish("/foo", "ok")
    try:
        yield b
    finally:
        b.destroy()


@pytest.mark.slow
@pytest.mark.parametrize("server_kind", ["gunicorn", "uvicorn"])
def test_bad_input_real_server_keeps_serving(procs: Any, bus_name: str, shared_bus: Bus, server_kind: str) -> None:
    server = start(server_kind, procs, bus_name, workers=1, long_polling_interval=5)
    for method, path, body, headers, status, reason in CASES:
        r = rawhttp.send(server.port, method, path, body, headers).read_head()
        got = r.read_all()
        assert (r.status, got) == (status, reason), (path, body[:40], server.log())
        # and a normal poll still works on the same server
        ok = rawhttp.poll(server.port, "fine", {"/foo": 0}, dlp=True).read_head()
        assert json.loads(ok.read_all())[0]["data"] == "ok"
    assert "Traceback" not in server.log()


class _RecordingInput:
    """A ``wsgi.input`` that records every read size (and would hand out endless bytes)."""

    def __init__(self, total: int) -> None:
        self.left = total
        self.sizes: list[int | None] = []

    def read(self, size: int | None = None) -> bytes:
        self.sizes.append(size)
        n = self.left if size is None or size < 0 else min(size, self.left)
        self.left -= n
        return b"a" * n


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"CONTENT_LENGTH": "60000"}, "400"),  # within max_body_size: read, in pieces, then refused as a bad body
        ({"wsgi.input_terminated": True}, "413"),  # no length, endless input: stops after max_body_size + 1
        ({"HTTP_TRANSFER_ENCODING": "chunked"}, "411"),  # refused before reading anything
    ],
)
def test_wsgi_reads_bodies_in_bounded_pieces(bus: Bus, headers: dict[str, Any], status: str) -> None:
    from shmbus.adapters.wsgi import READ_PIECE, MessageBusMiddleware

    app = MessageBusMiddleware(lambda env, start: [], bus=bus)
    stream = _RecordingInput(10 << 20)
    environ = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": "/message-bus/abc/poll",
        "QUERY_STRING": "dlp=t",
        "CONTENT_TYPE": "application/x-www-form-urlencoded",
        "wsgi.input": stream,
        "wsgi.multithread": True,
        "SERVER_PROTOCOL": "HTTP/1.1",
        **headers,
    }
    got: list[str] = []
    b"".join(app(environ, lambda s, h, exc=None: got.append(s)))
    assert got and got[0].startswith(status), got
    assert all(size is not None and 0 < size <= READ_PIECE for size in stream.sizes), stream.sizes
    assert (10 << 20) - stream.left <= 64 * 1024 + 1  # never more than max_body_size (+1 to detect "too large")
