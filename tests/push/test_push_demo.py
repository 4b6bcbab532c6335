"""The demo's "notify me" wiring (examples/demo/notify.py): the push routes answer as the page expects, the key is
kept for the other workers, and the page's sign-in header is the user; with a development push service
(``scripts/demo --push-dev URL``) the page's fallback is pushed to, and a push the sender gives up on is said."""

from __future__ import annotations

import asyncio
import hashlib
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from shmbus import Bus
from shmbus.adapters.push import VapidKeys
from shmbus.adapters.push.devservice import PushService
from tests.harness import REPO_ROOT, import_file
from tests.harness.wait import wait_for

ANN = {"x-demo-user": "ann"}


@pytest.fixture
def notify(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    monkeypatch.setenv("SHMBUS_DEMO_PUSH_DIR", str(tmp_path / "push"))
    try:
        yield import_file(REPO_ROOT / "examples" / "demo" / "notify.py", "demo_notify")
    finally:
        sys.modules.pop("demo_notify", None)


def test_demo_push_routes(notify: Any, bus: Bus, tmp_path: Path) -> None:
    app, connector = notify.wrap(None, bus, "/chat")
    _again, other = notify.wrap(None, bus, "/chat")  # a second worker: the same key
    try:
        wait_for(lambda: connector.leading or other.leading, what="one of the two workers sending")
        assert not (connector.leading and other.leading)

        async def go() -> list[httpx.Response]:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as c:
                return [
                    await c.get("/push/key"),
                    await c.get("/push/subscriptions"),
                    await c.get("/push/subscriptions", headers={"x-demo-user": "ann"}),
                    await c.post("/push/subscriptions", headers={"x-demo-user": "ann"}, json={"topics": ["/chat"]}),
                ]

        key, anonymous, listed, bad = asyncio.run(go())
        assert key.json()["publicKey"] == connector.vapid.public_key == other.vapid.public_key
        assert anonymous.status_code == 403 and listed.json() == {"subscriptions": []}
        assert bad.status_code == 400
        assert (tmp_path / "push" / "vapid_private.pem").stat().st_mode & 0o077 == 0
    finally:
        connector.close(grace=0)
        other.close(grace=0)


def test_demo_without_a_dev_push_service(notify: Any, bus: Bus, push_service: PushService, vapid: VapidKeys) -> None:
    app, connector = notify.wrap(None, bus, "/chat")
    try:

        async def go() -> list[httpx.Response]:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as c:
                sub = push_service.subscribe(connector.vapid.public_key)
                body = {"subscription": sub, "topics": ["/chat"]}
                return [await c.get("/push-dev"), await c.post("/push/subscriptions", headers=ANN, json=body)]

        dev, loopback = asyncio.run(go())
        assert dev.status_code == 404 and "--push-dev" in dev.json()["error"]
        assert loopback.status_code == 403  # the SSRF guard's default: no loopback endpoint
    finally:
        connector.close(grace=0)


def test_demo_pushes_to_the_dev_push_service_and_says_when_it_cannot(
    notify: Any, bus: Bus, push_service: PushService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--push-dev``: the page's fallback (a subscription of the dev service, registered as the page's own) is
    pushed to; once the service is gone, the push the sender gives up on is published on the status channel, with
    the device the page registered (its hash: the endpoint is the device's secret)."""
    monkeypatch.setenv("SHMBUS_DEMO_PUSH_DEV", push_service.origin)
    app, connector = notify.wrap(None, bus, "/chat")
    try:
        wait_for(lambda: connector.leading, what="the demo's sender")

        async def go() -> tuple[httpx.Response, httpx.Response, httpx.Response]:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as c:
                dev = await c.get("/push-dev")
                sub = await c.post("/push-dev", json={})
                body = {"subscription": sub.json(), "topics": ["/chat"]}
                return dev, sub, await c.post("/push/subscriptions", headers=ANN, json=body)

        dev, sub, registered = asyncio.run(go())
        assert dev.json() == {"url": push_service.origin}
        assert registered.status_code == 201, registered.text
        endpoint = sub.json()["endpoint"]
        gid = bus.publish("/chat", {"user": "bob", "text": "hello ann"}) and bus.segment.global_id()
        (got,) = wait_for(lambda: push_service.received(endpoint), what="the push to the dev service")
        assert got.payload == {"channel": "/chat", "message_id": 1, "global_id": gid,
                               "data": {"user": "bob", "text": "hello ann"}}  # fmt: skip

        push_service.stop()  # no push service reachable
        bus.publish("/chat", {"user": "bob", "text": "are you there?"})
        (status,) = wait_for(lambda: [m.data for m in bus.backlog(notify.STATUS, 0)], timeout=60, what="a status")
        assert status["device"] == notify.device_id(endpoint) == hashlib.sha256(endpoint.encode()).hexdigest()[:16]
        assert status["outcome"] == "failed" and "gave up after 3 attempt(s)" in status["why"]
        assert status["global_id"] == gid + 1
    finally:
        connector.close(grace=0)
