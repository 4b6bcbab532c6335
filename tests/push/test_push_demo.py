"""The demo's "notify me" wiring (examples/demo/notify.py): the push routes answer as the page expects, the key is
kept for the other workers, and the page's sign-in header is the user."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from shmbus import Bus
from tests.harness import REPO_ROOT, import_file
from tests.harness.wait import wait_for


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
