"""Client-bound subscriptions (the iodine draft's client objects) on real servers: SSE under uvicorn (ASGI) and
under gunicorn gevent and gthread workers (WSGI), and WebSocket under uvicorn. The app (pubsub_apps.py)
subscribes each connection server-side in ``on_open``; messages come from another process."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from shmbus import Bus
from tests.harness.wait import wait_for

from .transport_util import SSEClient

SERVERS = ["uvicorn", "gunicorn-gevent", "gunicorn-gthread"]
END = "/srv/direct"  # the sentinel: every connection is subscribed to it


@pytest.fixture
def pubsub_server(procs: Any, bus_name: str, request: Any) -> Callable[[str], Any]:
    def start(kind: str) -> Any:
        env = {"SHMBUS_TEST_BUS": bus_name}
        app_dir = request.path.parent
        if kind == "uvicorn":
            return procs.uvicorn_server("pubsub_apps:asgi_app", env=env, app_dir=app_dir, health_path="/health")
        worker = kind.split("-")[1]
        extra = ["--threads", "8"] if worker == "gthread" else []
        return procs.gunicorn_server(
            "pubsub_apps:wsgi_app",
            workers=1,
            worker_class=worker,
            env=env,
            app_dir=app_dir,
            extra_args=extra,
            health_path="/health",
        )

    return start


def get_json(url: str) -> Any:
    return httpx.get(url, timeout=10, trust_env=False).json()


def events_until(c: SSEClient, data: str) -> list[Any]:
    """(channel, data) of every message event up to the sentinel carrying ``data``."""
    out = []
    deadline = time.monotonic() + 30
    while True:
        ev = c.next(max(deadline - time.monotonic(), 0.1))
        if ev.event and ev.event.startswith("/"):
            out.append((ev.event, ev.json()["data"]))
            if ev.event == END and ev.json()["data"] == data:
                return out


@pytest.mark.parametrize("kind", SERVERS)
def test_server_side_subscriptions_reach_the_client_or_the_callback(
    bus: Bus, pubsub_server: Any, sse: Any, publisher: Any, bus_name: str, kind: str
) -> None:
    srv = pubsub_server(kind)
    c = sse(srv.url + "/sse", params=[("client_id", "alice")], headers={"x-user": "7"})
    assert c.status == 200, c.body
    publisher(
        bus_name,
        [
            ("/srv/direct", "d1"),
            ("/srv/room/1", "r1"),
            ("/srv/room/1/deep", "not a glob match"),
            ("/srv/cb", "to the callback"),
            ("/srv/swap1", "direct won"),
            ("/srv/swap2", "callback won"),
            ("/srv/user/7", "mine"),
            ("/srv/user/8", "not mine"),
            ("/srv/direct", "for 8 only", {"user_ids": [8]}),  # targeting holds on server-side subscriptions
            ("/srv/cb", "for 8 only", {"user_ids": [8]}),  # ... and for callbacks
            ("/srv/direct", "end"),
        ],
    )
    assert events_until(c, "end") == [
        ("/srv/direct", "d1"),
        ("/srv/room/1", "r1"),
        ("/srv/swap1", "direct won"),
        ("/srv/user/7", "mine"),
        ("/srv/direct", "end"),
    ]
    st = wait_for(lambda: (s := get_json(srv.url + "/state"))["callbacks"] and len(s["callbacks"]) >= 2 and s)
    assert st["callbacks"] == [["alice", "/srv/cb", "to the callback"], ["alice", "/srv/swap2", "callback won"]]
    assert st["callback_subs"] == 2  # /srv/cb and /srv/swap2: the replaced ones are gone from the bus


@pytest.mark.parametrize("kind", SERVERS)
def test_every_subscription_ends_when_the_connection_closes(
    bus: Bus, pubsub_server: Any, sse: Any, publisher: Any, bus_name: str, kind: str
) -> None:
    srv = pubsub_server(kind)
    c = sse(srv.url + "/sse", params=[("client_id", "bob")])
    publisher(bus_name, [("/srv/direct", "ready")])
    events_until(c, "ready")
    assert get_json(srv.url + "/state")["callback_subs"] == 2
    c.close()
    st = wait_for(lambda: (s := get_json(srv.url + "/state"))["closed"] and s, timeout=15, what="on_close")
    assert st["closed"] == [{"client_id": "bob", "open": False, "subscribe_after_close": None}]
    assert st["callback_subs"] == 0 and st["open"] == 0
    publisher(bus_name, [("/srv/cb", "nobody")])
    time.sleep(0.5)
    assert get_json(srv.url + "/state")["callbacks"] == []


@pytest.mark.parametrize("kind", SERVERS)
def test_engine_false_reaches_this_process_clients(
    bus: Bus, pubsub_server: Any, sse: Any, publisher: Any, bus_name: str, kind: str
) -> None:
    srv = pubsub_server(kind)
    c = sse(srv.url + "/sse", params=[("client_id", "carol")])
    publisher(bus_name, [("/srv/direct", "ready")])
    events_until(c, "ready")
    r = httpx.get(srv.url + "/local", params={"channel": "/srv/direct", "data": "local"}, timeout=10, trust_env=False)
    assert r.json() == {"result": True}
    ev = c.next()
    assert ev.event == "/srv/direct" and ev.json()["data"] == "local"
    assert ev.id is None  # no global id: the resume cursor does not move
    assert bus.last_id("/srv/direct") == 1  # nothing stored


@pytest.mark.parametrize("kind", SERVERS)
def test_a_resume_replays_the_server_side_subscriptions(
    bus: Bus, pubsub_server: Any, sse: Any, publisher: Any, bus_name: str, kind: str
) -> None:
    srv = pubsub_server(kind)
    c = sse(srv.url + "/sse", params=[("client_id", "dan")])
    publisher(bus_name, [("/srv/direct", "first")])
    ev = c.next()
    assert ev.json()["data"] == "first"
    c.close()
    publisher(bus_name, [("/srv/room/2", "missed 1"), ("/srv/cb", "callback only"), ("/srv/direct", "missed 2")])
    c2 = sse(srv.url + "/sse", params=[("client_id", "dan")], headers={"Last-Event-ID": ev.id})
    assert events_until(c2, "missed 2") == [("/srv/room/2", "missed 1"), ("/srv/direct", "missed 2")]


def test_wsgi_sse_refuses_a_sync_worker_with_a_reason(bus: Bus, procs: Any, bus_name: str) -> None:
    env = {"SHMBUS_TEST_BUS": bus_name}
    app_dir = Path(__file__).parent
    srv = procs.gunicorn_server("pubsub_apps:wsgi_app", workers=1, env=env, app_dir=app_dir, health_path="/health")
    r = httpx.get(srv.url + "/sse", timeout=10, trust_env=False)
    assert r.status_code == 503 and "gevent or threaded" in r.text


def test_websocket_connections_are_subscribed_server_side(
    bus: Bus, pubsub_server: Any, publisher: Any, bus_name: str
) -> None:
    connect = pytest.importorskip("websockets.sync.client").connect
    srv = pubsub_server("uvicorn")
    with contextlib.ExitStack() as stack:
        ws = stack.enter_context(connect(f"ws://127.0.0.1:{srv.port}/ws?client_id=erin", open_timeout=15, proxy=None))
        assert json.loads(ws.recv(timeout=20))["status"] == "connected"
        publisher(bus_name, [("/srv/cb", "cb"), ("/srv/room/x", "room"), ("/srv/direct", "end")])
        frames = [json.loads(ws.recv(timeout=20)) for _ in range(2)]
        assert [(f["channel"], f["data"]) for f in frames] == [("/srv/room/x", "room"), ("/srv/direct", "end")]
        wait_for(lambda: get_json(srv.url + "/state")["callbacks"] == [["erin", "/srv/cb", "cb"]])
    st = wait_for(lambda: (s := get_json(srv.url + "/state"))["closed"] and s, timeout=15, what="on_close")
    assert st["closed"][0]["client_id"] == "erin" and st["callback_subs"] == 0


def test_messages_published_while_an_async_on_open_waits_arrive_exactly_once(bus: Bus) -> None:
    """Live batches that reach the stream while ``on_open`` awaits are held: the opening replay sends each
    message once (without the hold, the message published after the subscription would come twice)."""
    from shmbus.adapters.transports.sse import SSEApp

    from .transport_util import Recorder, http_scope

    bus.publish("/o", "before the stream")  # older than the stream: not replayed without Last-Event-ID

    async def on_open(conn: Any) -> None:
        conn.subscribe("/o")
        bus.publish("/o", "during on_open")
        await asyncio.sleep(0.3)  # the listener dispatches that message to this loop meanwhile
        bus.publish("/o", "still opening")

    app = SSEApp(bus=bus, on_open=on_open)
    rec = Recorder()

    async def main() -> None:
        gone = asyncio.Event()

        async def receive() -> dict[str, Any]:
            await gone.wait()
            return {"type": "http.disconnect"}

        task = asyncio.ensure_future(app(http_scope("/sse"), receive, rec))
        deadline = time.monotonic() + 20
        while rec.body_sends == 0:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        bus.publish("/o", "live")
        while b'"live"' not in rec.body():
            assert time.monotonic() < deadline, rec.body()
            await asyncio.sleep(0.01)
        gone.set()
        await asyncio.wait_for(task, 20)

    asyncio.run(main())
    app.close()
    datas = [json.loads(line[6:])["data"] for line in rec.body().decode().splitlines() if line.startswith("data: ")]
    assert datas == ["during on_open", "still opening", "live"]


@pytest.mark.parametrize("kind", SERVERS)
def test_events_message_sends_unnamed_events_with_the_channel_in_the_data(
    bus: Bus, pubsub_server: Any, sse: Any, publisher: Any, bus_name: str, kind: str
) -> None:
    """``events=message``: what a browser's ``EventSource.onmessage`` needs for ``prefix=``/``glob=`` streams (it
    has no wildcard listener for named events); the same core serves the ASGI and the WSGI app."""
    srv = pubsub_server(kind)
    c = sse(srv.url + "/sse", params=[("prefix", "/news"), ("glob", "/g/*"), ("events", "message")])
    assert c.status == 200, c.body
    publisher(bus_name, [("/news/a", "a"), ("/other", "no"), ("/g/1", "g"), ("/news", "end")])
    got = []
    while not got or got[-1][1] != "end":
        ev = c.next()
        if ev.data and not ev.event:
            got.append((ev.json()["channel"], ev.json()["data"]))
        else:
            assert ev.event is None, f"a named event with events=message: {ev.event}"
    assert got == [("/news/a", "a"), ("/g/1", "g"), ("/news", "end")]
    bad = httpx.get(srv.url + "/sse", params={"prefix": "/news", "events": "all"}, timeout=10, trust_env=False)
    assert bad.status_code == 400 and "events must be" in bad.text
