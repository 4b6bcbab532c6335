"""guble's protocol, checked against the examples of guble's README ("Protocol Reference"), on a real uvicorn.

Every transcript is written from the README: the lines a client sends, and the lines the README shows coming
back, byte for byte except what cannot be fixed in advance (the time, random application ids, sequence ids),
which are masked. Publishes that seed the backlogs come from another process."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shmbus import Bus
from shmbus.adapters.guble.protocol import BadRequest, Cancel, Receive, Replay, Send, parse_command
from tests.harness import skip_or_fail

try:
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import ClientConnection, connect
except ImportError:  # pragma: no cover - the test extra installs it
    connect = None  # type: ignore[assignment]

TIME = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d"


def mask(frame: str) -> str:
    """The frame with its times replaced by ``<T>``."""
    return re.sub(TIME, "<T>", frame)


class Guble:
    """A guble client over a real WebSocket: frames in and out as text."""

    def __init__(self, conn: ClientConnection) -> None:
        self.conn = conn

    def send(self, text: str) -> None:
        self.conn.send(text)

    def recv(self, timeout: float = 20.0) -> str:
        frame = self.conn.recv(timeout=timeout)
        assert isinstance(frame, str), f"guble frames are text frames, got {type(frame).__name__}"
        return frame

    def until(self, prefix: str) -> list[str]:
        """Frames up to and including the first one starting with ``prefix``."""
        out = []
        while True:
            f = self.recv()
            out.append(f)
            if f.startswith(prefix):
                return out

    def bodies(self, frames: list[str]) -> list[str]:
        return [f.split("\n", 2)[2] for f in frames if f.startswith("/")]


@pytest.fixture
def guble(procs: Any, bus: Bus, bus_name: str, request: Any) -> Iterator[Callable[..., Guble]]:
    """``guble(user, app, path)`` -> a connected client (the hello consumed); the server starts on first use and
    the ``bus`` fixture removes the bus it serves."""
    if connect is None:
        skip_or_fail("the websockets package is not installed (pip install websockets)")
    srv_box: dict[str, Any] = {}
    stack = contextlib.ExitStack()

    def open_(user: str | None = "user01", app: str | None = "phone1", path: str = "/stream/") -> Guble:
        if "srv" not in srv_box:
            srv_box["srv"] = procs.uvicorn_server(
                "guble_apps:app", env={"SHMBUS_TEST_BUS": bus_name}, app_dir=request.path.parent, health_path="/health"
            )
        headers = {k: v for k, v in (("x-user", user), ("x-app", app)) if v is not None}
        url = f"ws://127.0.0.1:{srv_box['srv'].port}{path}"
        g = Guble(stack.enter_context(connect(url, additional_headers=headers, open_timeout=15, proxy=None)))
        hello = g.recv()
        assert hello.startswith("#ok-connected You are connected to the server.\n"), hello
        return g

    open_.server = srv_box  # type: ignore[attr-defined]
    yield open_
    stack.close()


def server_url(guble: Any) -> str:
    return str(guble.server["srv"].url)


# ---------------------------------------------------------------------------------------------------- connect
def test_connection_message_bytes(procs: Any, bus: Bus, bus_name: str, request: Any) -> None:
    """README: ``#ok-connected You are connected to the server.`` + ``{"ApplicationId": "phone1", "UserId":
    "user01", "Time": "2015-01-01T12:00:00+01:00"}`` (guble's URL form ``/stream/user/<userId>`` is served too)."""
    if connect is None:
        skip_or_fail("the websockets package is not installed (pip install websockets)")
    srv = procs.uvicorn_server(
        "guble_apps:app", env={"SHMBUS_TEST_BUS": bus_name}, app_dir=request.path.parent, health_path="/health"
    )
    headers = {"x-user": "user01", "x-app": "phone1"}
    with connect(f"ws://127.0.0.1:{srv.port}/stream/user/user01", additional_headers=headers, proxy=None) as c:
        hello = c.recv(timeout=20)
    assert mask(str(hello)) == (
        '#ok-connected You are connected to the server.\n{"ApplicationId": "phone1", "UserId": "user01", "Time": "<T>"}'
    )
    with connect(f"ws://127.0.0.1:{srv.port}/stream/", proxy=None) as c:  # anonymous, no application id given
        info = json.loads(str(c.recv(timeout=20)).split("\n")[1])
    assert info["UserId"] == "" and re.fullmatch(r"[A-Za-z0-9]{16}", info["ApplicationId"])


# ---------------------------------------------------------------------------------------------------- send
def test_send_example_and_the_message_a_receiver_gets(guble: Any) -> None:
    """README: ``> /foo`` + empty line + ``Hello World``; the success notification; the message format."""
    rx = guble(user="user02", app="tablet")
    rx.send("+ /foo")
    assert rx.recv() == "#ok-subscribed-to /foo"
    tx = guble(user="user01", app="phone1")
    tx.send("> /foo\n\nHello World")
    ok = tx.recv()
    assert mask(ok) == (
        '#ok-send\n{"sequenceId": "1", "path": "/foo", "publisherMessageId": "", "messagePublishingTime": "<T>"}'
    )
    assert mask(rx.recv()) == "/foo,1,user01,phone1,,<T>\n\nHello World"


def test_message_format_examples(guble: Any) -> None:
    """README example 1 (headers) and example 2 (no headers) of the message format."""
    rx = guble(user="user09", app="x")
    rx.send("+ /foo/bar")
    rx.recv()
    tx = guble(user="user01", app="phone1")
    headers = '{"Content-Type": "text/plain", "Correlation-Id": "7sdks723ksgqn"}'
    tx.send(f"> /foo/bar id123\n{headers}\n\nHello World")
    assert tx.recv().startswith("#ok-send id123\n")
    assert mask(rx.recv()) == f"/foo/bar,1,user01,phone1,id123,<T>\n{headers}\nHello World"
    tx2 = guble(user="user01", app="54sdcj8sd7")
    tx2.send("> /foo/bar id123\n\nanyByteData")
    assert tx2.recv().startswith("#ok-send id123\n")
    assert mask(rx.recv()) == "/foo/bar,2,user01,54sdcj8sd7,id123,<T>\n\nanyByteData"


def test_send_refused_and_bad_requests(guble: Any) -> None:
    g = guble()
    g.send("> /private/x id7\n\nno")
    refused = g.recv()
    assert mask(refused) == (  # the README's form: the status line, then the same JSON as #ok-send
        "!error-send id7 not allowed to send to /private/x\n"
        '{"sequenceId": "", "path": "/private/x", "publisherMessageId": "id7", "messagePublishingTime": "<T>"}'
    )
    g.send("sdcsd")
    assert g.recv() == "!error-bad-request unknown command 'sdcsd'"  # the README's example, byte for byte
    for bad, reason in [
        ("", "empty command"),
        ("+ foo", "must start with '/'"),
        ("+ /foo x", "startId must be an integer"),
        ("+ /foo 1,0", "maxCount must be at least 1"),
        ("+ /foo 1,2,3", "receive needs"),
        ("- /a /b", "cancel needs"),
        ("replay /x", "replay needs"),
        ("> /foo a,b\n\nx", "commas"),
        ('> /foo\n{"not json\n\nx', "JSON object"),
        ("+ /__status", "reserved"),
        ("+ /a\nbody", "takes no body"),
    ]:
        g.send(bad)
        got = g.recv()
        assert got.startswith("!error-bad-request ") and reason in got, (bad[:40], got)
    g.send("+ /still/ok")
    assert g.recv() == "#ok-subscribed-to /still/ok"  # bad input never ends the connection...
    g.send("x" * 70_000)  # ... but a message over max_frame does: said, then closed with 1009
    assert g.recv().startswith("!error-bad-request message too big")
    with pytest.raises(ConnectionClosed) as info:
        g.recv()
    assert info.value.rcvd is not None and info.value.rcvd.code == 1009


# ---------------------------------------------------------------------------------------------------- receive
@pytest.fixture
def foo30(bus: Bus, publisher: Any, bus_name: str) -> None:
    """/foo holds messages m1..m30 (ids 1..30), /foo/bar one message."""
    publisher(bus_name, [("/foo", f"m{i}") for i in range(1, 31)] + [("/foo/bar", "sub")])


def _sentinel(g: Guble, publisher: Any, bus_name: str, before: list[tuple[str, Any]]) -> list[str]:
    """Publish ``before`` then a sentinel the connection hears; the bodies received up to the sentinel."""
    g.send("+ /sentinel")
    assert g.recv() == "#ok-subscribed-to /sentinel"
    publisher(bus_name, [*before, ("/sentinel", "end")])
    frames = g.until("/sentinel,")
    return g.bodies(frames)[:-1]


@pytest.mark.parametrize(
    "command, replayed, then_live",
    [
        ("+ /foo", [], True),  # Subscribe to all future messages matching /foo
        ("+ /foo 0", [f"m{i}" for i in range(1, 31)], True),  # all, then further incoming messages
        ("+ /foo 22", [f"m{i}" for i in range(22, 31)], True),  # ids >= 22, then live
        ("+ /foo 0 20", [f"m{i}" for i in range(1, 21)], False),  # the first (oldest) 20, and stop
        ("+ /foo -20", [f"m{i}" for i in range(11, 31)], True),  # the last (newest) 20, then live
        ("+ /foo -20 20", [f"m{i}" for i in range(11, 31)], False),  # the last 20, and stop
        ("+ /foo -20,20", [f"m{i}" for i in range(11, 31)], False),  # the grammar's comma form
        ("+ /foo 0 100", [f"m{i}" for i in range(1, 31)], False),  # fewer than maxCount: stops after all
    ],
)
def test_receive_examples(
    guble: Any, foo30: None, publisher: Any, bus_name: str, command: str, replayed: list[str], then_live: bool
) -> None:
    g = guble()
    g.send(command)
    frames = g.until("#")
    assert g.bodies(frames) == replayed
    assert all(mask(f).startswith(f"/foo,{int(b[1:])},,,,<T>\n\n") for f, b in zip(frames, replayed, strict=False))
    assert frames[-1] == ("#ok-subscribed-to /foo" if then_live else "#fetch-done /foo")
    live = _sentinel(g, publisher, bus_name, [("/foo", "new"), ("/foo/bar/baz", "deep"), ("/foobar", "not a subtopic")])
    assert live == (["new", "deep"] if then_live else [])


def test_receive_from_42_as_the_readme_writes_it(guble: Any, publisher: Any, bus_name: str, bus: Bus) -> None:
    """README: ``+ /foo 42`` receives "all message with message ids >= 42 from the topic and subscribe[s] for
    further incoming messages" (the literal transcript, on a topic holding 50 messages)."""
    publisher(bus_name, [("/foo", f"m{i}") for i in range(1, 51)])
    g = guble()
    g.send("+ /foo 42")
    frames = g.until("#")
    assert g.bodies(frames) == [f"m{i}" for i in range(42, 51)]
    assert [mask(f).split("\n")[0] for f in frames[:-1]] == [f"/foo,{i},,,,<T>" for i in range(42, 51)]
    assert frames[-1] == "#ok-subscribed-to /foo"
    assert _sentinel(g, publisher, bus_name, [("/foo", "live")]) == ["live"]


def test_receive_a_subtopic_only(guble: Any, foo30: None, publisher: Any, bus_name: str) -> None:
    """``+ /foo/bar``: future messages of /foo/bar and below, not of /foo."""
    g = guble()
    g.send("+ /foo/bar")
    assert g.recv() == "#ok-subscribed-to /foo/bar"
    assert _sentinel(g, publisher, bus_name, [("/foo", "no"), ("/foo/bar", "yes"), ("/foo/bar/x", "yes too")]) == [
        "yes",
        "yes too",
    ]


def test_cancel_examples(guble: Any, publisher: Any, bus_name: str, bus: Bus) -> None:
    g = guble()
    for p in ("/foo", "/foo/bar"):
        g.send(f"+ {p}")
        assert g.recv() == f"#ok-subscribed-to {p}"
    g.send("- /foo")
    assert g.recv() == "#canceled /foo"
    assert _sentinel(g, publisher, bus_name, [("/foo", "no"), ("/foo/bar", "still")]) == ["still"]
    g.send("- /foo/bar")
    assert g.recv() == "#canceled /foo/bar"
    assert _sentinel(g, publisher, bus_name, [("/foo/bar", "no")]) == []


def test_a_message_matched_by_several_subscriptions_is_delivered_once(
    guble: Any, publisher: Any, bus_name: str, bus: Bus
) -> None:
    g = guble()
    for p in ("/foo", "/foo/bar", "/foo/bar/baz"):
        g.send(f"+ {p}")
        g.recv()
    assert _sentinel(g, publisher, bus_name, [("/foo/bar/baz", "once"), ("/foo/bar", "once too")]) == [
        "once",
        "once too",
    ]
    # a replaying receive skips what a live subscription of the same connection already delivered
    g.send("+ /foo/bar 0")
    frames = g.until("#")
    assert g.bodies(frames) == [] and frames[-1] == "#ok-subscribed-to /foo/bar"


def test_replay_examples(guble: Any, publisher: Any, bus_name: str, bus: Bus) -> None:
    """README: ``replay -1 /events`` (all), ``replay 42 /events`` (sequenceId > 42), ``replay -1,10 /events``
    (the last 10). A replay does not subscribe."""
    publisher(bus_name, [("/events", f"e{i}") for i in range(1, 51)])
    g = guble()
    for command, expected in [
        ("replay -1 /events", [f"e{i}" for i in range(1, 51)]),
        ("replay 42 /events", [f"e{i}" for i in range(43, 51)]),
        ("replay -1,10 /events", [f"e{i}" for i in range(41, 51)]),
    ]:
        g.send(command)
        frames = g.until("#")
        assert g.bodies(frames) == expected and frames[-1] == "#fetch-done /events", command
    assert _sentinel(g, publisher, bus_name, [("/events", "not subscribed")]) == []


# ---------------------------------------------------------------------------------------------------- user topics
def test_user_topics(guble: Any, publisher: Any, bus_name: str, bus: Bus) -> None:
    phone = guble(user="user01", app="phone1")
    tablet = guble(user="user01", app="tablet")
    other = guble(user="user02", app="phone1")
    anon = guble(user=None, app=None)
    for snoop in (other, anon):  # trying to listen in on user01's space, directly and through parents
        for p in ("/user", "/", "/user/user01", "/user/user01/phone1"):
            snoop.send(f"+ {p}")
            snoop.recv()
    sends = [
        ("/user/user01/phone1", "to the phone"),
        ("/user/user01/common", "to every device"),
        ("/user/user01/foo", "not subscribed by default"),
    ]
    everyone = (phone, tablet, other, anon)
    for g in everyone:
        g.send("+ /sentinel")
        assert g.recv() == "#ok-subscribed-to /sentinel"
    publisher(bus_name, [*sends, ("/sentinel", "end")])
    got = [g.bodies(g.until("/sentinel,"))[:-1] for g in everyone]
    assert got == [["to the phone", "to every device"], ["to every device"], [], []]
    # replays of another user's topic are filtered too
    other.send("+ /user/user01/phone1 0")
    frames = other.until("#")
    assert other.bodies(frames) == []
    # and anyone may address a user
    other.send("> /user/user01/common m9\n\nhello from user02")
    assert other.recv().startswith("#ok-send m9\n")
    assert mask(phone.recv()) == "/user/user01/common,2,user02,phone1,m9,<T>\n\nhello from user02"


# ---------------------------------------------------------------------------------------------------- REST
def test_rest_curl_example(guble: Any, bus: Bus) -> None:
    """README: ``curl -X POST -H "x-Guble-Key: Value" --data Hello
    'http://127.0.0.1:8080/api/message/foo?userId=marvin&messageId=42'`` leads to the message
    ``16,/foo,marvin,VoAdxGO3DBEn8vv8,42,2015-12-27T18:20:04+01:00`` / ``{"Key":"Value"}`` / ``Hello`` (the
    README's first line puts the id first; its message format, which we follow, puts the path first)."""
    for i in range(15):
        bus.publish("/foo", f"filler {i}")
    rx = guble()
    rx.send("+ /foo")
    rx.recv()
    url = server_url(guble) + "/api/message/foo"
    headers = {"x-Guble-Key": "Value", "x-token": "secret", "content-type": "application/x-www-form-urlencoded"}
    r = httpx.post(url, params={"userId": "marvin", "messageId": "42"}, headers=headers, content=b"Hello")
    assert r.status_code == 200, r.text
    assert r.json()["sequenceId"] == "16"
    frame = mask(rx.recv())
    assert re.fullmatch(r'/foo,16,marvin,[A-Za-z0-9]{16},42,<T>\n\{"Key":"Value"\}\nHello', frame), frame
    assert bus.backlog("/foo", 15)[0].data["body"] == "Hello"  # any process reads the same message


@pytest.mark.parametrize(
    "path, params, headers, status, reason",
    [
        ("/api/message/foo", {}, {}, 403, "not authorised"),
        ("/api/message/private/x", {}, {"x-token": "secret"}, 403, "not authorised"),
        ("/api/message/foo", {"user": "x"}, {"x-token": "secret"}, 400, "unknown query parameter"),
        ("/api/message/foo", {"userId": "a,b"}, {"x-token": "secret"}, 400, "without commas"),
    ],
)
def test_rest_refusals(guble: Any, path: str, params: Any, headers: Any, status: int, reason: str) -> None:
    guble()  # starts the server
    r = httpx.post(server_url(guble) + path, params=params, headers=headers, content=b"x")
    assert r.status_code == status and reason in r.text
    r = httpx.post(server_url(guble) + "/api/message/foo", headers={"x-token": "secret"}, content=b"\xff")
    assert r.status_code == 400 and "UTF-8" in r.text


# ---------------------------------------------------------------------------------------------------- grammar
@settings(max_examples=500, deadline=None)
@given(st.text(max_size=200) | st.sampled_from(["+ /a 1", "> /a\n\nb", "- /a", "replay 1,2 /a", "+ /a -5 5"]))
def test_parse_command_returns_a_command_or_raises_bad_request(frame: str) -> None:
    try:
        cmd = parse_command(frame)
    except BadRequest as exc:
        assert str(exc)
        return
    assert isinstance(cmd, (Send, Receive, Cancel, Replay))
    assert cmd.path.startswith("/")


def test_parse_command_forms() -> None:
    assert parse_command("+ /foo 0 20") == Receive("/foo", 0, 20) == parse_command("+ /foo 0,20")
    assert parse_command("+ /foo") == Receive("/foo", None, None)
    assert parse_command("replay -1,10 /events") == Replay("/events", -1, 10)
    assert parse_command('> /a id\n{"k": 1}\n\nline1\nline2') == Send("/a", "id", '{"k": 1}', "line1\nline2")
    assert parse_command('> /a\n{"k":1}\nbody') == Send("/a", "", '{"k":1}', "body")  # guble client's form
    assert parse_command("> /a\r\n\r\nbody") == Send("/a", "", "", "body")


# ---------------------------------------------------------------------------------------------------- CLI
def test_cli_client_sends_receives_and_exits(guble: Any, foo30: None, bus: Bus) -> None:
    """``shmbus guble --exit`` like guble-cli: commands in, the server's frames out."""
    import subprocess
    import sys

    guble()  # starts the server
    port = guble.server["srv"].port
    argv = [sys.executable, "-m", "shmbus.cli", "guble", "--url", f"ws://127.0.0.1:{port}/stream/", "-x"]
    argv += ["--header", "x-user: cli-user", "--header", "x-app: term", "+ /foo 0 3", "> /foo id1", "Hello CLI"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout
    frames = mask(out).split("\n")
    assert frames[:2] == [
        "#ok-connected You are connected to the server.",
        '{"ApplicationId": "term", "UserId": "cli-user", "Time": "<T>"}',
    ]
    assert "/foo,1,,,,<T>" in frames and "/foo,3,,,,<T>" in frames and "/foo,4,,,,<T>" not in frames
    assert "#fetch-done /foo" in frames and "#ok-send id1" in frames
    sent = bus.backlog("/foo", 30)[0].data
    assert sent["body"] == "Hello CLI" and sent["guble"]["user_id"] == "cli-user"
