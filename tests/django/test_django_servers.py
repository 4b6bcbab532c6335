"""The message_bus routes of a Django project under real servers, from the same settings: gunicorn gthread and
gevent (``get_wsgi_application``) and gunicorn with the uvicorn worker (``get_asgi_application``), 2 workers each.

Users log in through Django's own login view (session cookie, CSRF token); the default lookups make a message
targeted at a user reach that user only, a group message the group's members only, and nothing targeted
reaches an anonymous visitor (or a forged session cookie). Parked polls of other users are not woken with
someone else's message. Polls need no CSRF token while the project's own POST view does, and a poll never
re-sends the session cookie.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from shmbus import Bus

from .dj_util import DJTEST_DIR, run_django

pytestmark = pytest.mark.slow

SERVERS = {
    "gthread": ("djtest.wsgi:application", "gthread", "python:shmbus.adapters.integrations.gunicorn"),
    "gevent": ("djtest.wsgi:application", "gevent", "python:shmbus.adapters.integrations.gunicorn"),
    "uvicorn": ("djtest.asgi:application", "shmbus.adapters.server.uvicorn_worker.UvicornWorker", None),
}
USERS = """
import json
from django.contrib.auth.models import Group, User
staff = Group.objects.create(name="staff")
pks = {name: User.objects.create_user(name, password="pw").pk for name in ("alice", "bob", "carol")}
User.objects.get(username="carol").groups.add(staff)
print(json.dumps({**pks, "staff": staff.pk}))
"""


def login(url: str, username: str | None) -> httpx.Client:
    """A client logged in through Django's LoginView (anonymous for None)."""
    client = httpx.Client(base_url=url, trust_env=False, timeout=30)
    if username is not None:
        token = client.get("/login/").text
        resp = client.post("/login/", data={"username": username, "password": "pw", "csrfmiddlewaretoken": token})
        assert resp.status_code == 302, resp.text
        assert client.get("/whoami").json()["user"] is not None
    return client


def poll(client: httpx.Client, last_id: int = 0, *, dlp: bool = False) -> list[dict[str, Any]]:
    query = "?dlp=t" if dlp else ""
    resp = client.post(
        f"/message-bus/{uuid.uuid4().hex}/poll{query}", data={"/private": str(last_id)}, headers={"Dont-Chunk": "1"}
    )
    assert resp.status_code == 200, resp.text
    assert "set-cookie" not in resp.headers, "a poll re-sent a cookie"
    return [m for m in resp.json() if m["channel"] == "/private"]


@pytest.fixture(params=sorted(SERVERS))
def served(request: Any, django_env: dict[str, str], gunicorn_server: Any) -> Iterator[tuple[str, dict[str, int]]]:
    pks = json.loads(run_django(django_env, "shell", "-v0", "-c", USERS).splitlines()[-1])
    app, worker_class, config = SERVERS[request.param]
    server = gunicorn_server(
        app,
        workers=2,
        worker_class=worker_class,
        config=config,
        env=django_env,
        app_dir=DJTEST_DIR,
        health_path="/whoami",
    )
    yield server.url, pks
    server.stop()


def test_targeted_messages_reach_their_users_only(served: tuple[str, dict[str, int]], bus_name: str) -> None:
    url, pks = served
    clients = {name: login(url, name) for name in ("alice", "bob", "carol")}
    clients["anonymous"] = login(url, None)
    clients["forged"] = login(url, None)
    clients["forged"].cookies.set("sessionid", "x" * 32)
    bus = Bus(bus_name, ring_size=1 << 20, max_channels=256, keepalive_interval=0, create=True)
    try:
        with ThreadPoolExecutor(len(clients)) as pool:
            parked = {name: pool.submit(poll, c) for name, c in clients.items()}
            time.sleep(1.0)  # let the polls park (one parked late still reads the backlog: same answer)
            bus.publish("/private", "alice", user_ids=[pks["alice"]])
            bus.publish("/private", "bob", user_ids=[pks["bob"]])
            bus.publish("/private", "staff", group_ids=[pks["staff"]])
            bus.publish("/private", "everyone")
            first = {name: [m["data"] for m in f.result(timeout=30)] for name, f in parked.items()}
        allowed = {
            "alice": ["alice", "everyone"],
            "bob": ["bob", "everyone"],
            "carol": ["staff", "everyone"],
            "anonymous": ["everyone"],
            "forged": ["everyone"],
        }
        for name, got in first.items():
            assert got and got[0] == allowed[name][0] and set(got) <= set(allowed[name]), (name, got)
        for name, client in clients.items():  # the whole backlog, as each one may read it
            assert [m["data"] for m in poll(client, dlp=True)] == allowed[name], name
    finally:
        bus.destroy()
        for c in clients.values():
            c.close()


def test_polls_need_no_csrf_token_while_views_do(served: tuple[str, dict[str, int]], bus_name: str) -> None:
    url, _ = served
    alice, bob = login(url, "alice"), login(url, "bob")
    try:
        assert alice.post("/note", data={"text": "no token"}).status_code == 403  # CsrfViewMiddleware is on
        token = alice.cookies["csrftoken"]
        assert alice.post("/note", data={"text": "mine"}, headers={"X-CSRFToken": token}).json() == {"ok": True}
        resp = alice.post(f"/message-bus/{uuid.uuid4().hex}/poll?dlp=t", data={"/notes": "0"})
        assert resp.status_code == 200 and "set-cookie" not in resp.headers
        assert [m["data"]["text"] for m in resp.json() if m["channel"] == "/notes"] == ["mine"]
        resp = bob.post(f"/message-bus/{uuid.uuid4().hex}/poll?dlp=t", data={"/notes": "0"})
        assert [m for m in resp.json() if m["channel"] == "/notes"] == []
    finally:
        alice.close()
        bob.close()
    Bus(bus_name, create=False).destroy()


def test_subscribe_allowed_refuses_staff_channels_to_others(served: tuple[str, dict[str, int]], bus_name: str) -> None:
    """``SUBSCRIBE_ALLOWED`` (djtest/permissions.py) sees the Django request and the lookups' user id: carol (staff)
    reads ``/staff/board``, alice and an anonymous visitor get nothing of it, not even its last id."""
    url, _ = served
    clients = {"carol": login(url, "carol"), "alice": login(url, "alice"), "anonymous": login(url, None)}
    bus = Bus(bus_name, ring_size=1 << 20, max_channels=256, keepalive_interval=0, create=True)
    try:
        bus.publish("/staff/board", "for staff")
        bus.publish("/lobby", "for all")
        got = {}
        for name, client in clients.items():
            resp = client.post(
                f"/message-bus/{uuid.uuid4().hex}/poll?dlp=t", data={"/staff/board": "0", "/lobby": "-1"}
            )
            assert resp.status_code == 200, resp.text
            got[name] = (resp.json(), resp.headers.get("shmbus-refused-channels"))
        assert got["carol"] == (
            [
                {"global_id": 1, "message_id": 1, "channel": "/staff/board", "data": "for staff"},
                {"global_id": -1, "message_id": -1, "channel": "/__status", "data": {"/lobby": 1}},
            ],
            None,
        )
        refused = ([{"global_id": -1, "message_id": -1, "channel": "/__status", "data": {"/lobby": 1}}], "/staff/board")
        assert got["alice"] == refused and got["anonymous"] == refused
    finally:
        bus.destroy()
        for c in clients.values():
            c.close()


@pytest.mark.parametrize(
    ("worker_class", "args", "expected"),
    [
        ("sync", ["--threads", "1"], "shmbus.W001"),
        ("gthread", ["--threads", "4"], "shmbus.W002"),
        ("gthread", ["--threads", "4", "--preload", "-c", "python:shmbus.adapters.integrations.gunicorn"], None),
    ],
)
def test_server_start_runs_the_checks(
    django_env: dict[str, str], gunicorn_server: Any, worker_class: str, args: list[str], expected: str | None
) -> None:
    """gunicorn runs no system checks: the entry point does, and finds the worker class it is loaded by."""
    server = gunicorn_server(
        "djtest.wsgi:application",
        workers=1,
        worker_class=worker_class,
        env=django_env,
        app_dir=DJTEST_DIR,
        extra_args=args,
        health_path="/whoami",
    )
    log = server.log()
    found = {w for w in ("shmbus.W001", "shmbus.W002") if w in log}
    assert found == ({expected} if expected else set()), log
    server.stop()


def test_a_bad_setting_stops_the_server_start(django_env: dict[str, str], gunicorn_server: Any) -> None:
    with pytest.raises(RuntimeError, match=r"shmbus\.E002"):
        gunicorn_server(
            "djtest.wsgi:application",
            workers=1,
            env={**django_env, "SHMBUS_TEST_BUS": "bad/name"},
            app_dir=DJTEST_DIR,
            health_path="/whoami",
            timeout=15,
        )
