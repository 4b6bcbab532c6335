"""The push REST app, ASGI and WSGI: registering, listing, removing, the VAPID key, the fetch route; refusals."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from shmbus import Bus
from shmbus.adapters.push import MAX_PLAINTEXT, PushApp, PushConnector, PushWSGIApp, VapidKeys, default_endpoint_allowed
from shmbus.adapters.push.devservice import PushService
from tests.harness.wait import wait_for

from .push_util import LOCAL, wait_leading


def _user(scope_or_environ: dict[str, Any]) -> Any:
    if "headers" in scope_or_environ:  # ASGI
        value = dict(scope_or_environ["headers"]).get(b"x-user")
        value = value.decode() if value else None
    else:
        value = scope_or_environ.get("HTTP_X_USER")
    return int(value) if value and value.isdigit() else value


def _groups(scope_or_environ: dict[str, Any]) -> Any:
    if "headers" in scope_or_environ:
        value = dict(scope_or_environ["headers"]).get(b"x-groups", b"").decode()
    else:
        value = scope_or_environ.get("HTTP_X_GROUPS", "")
    return [int(g) for g in value.split(",") if g]


class Client:
    """The same calls against either shell (httpx's ASGI or WSGI transport)."""

    def __init__(self, app: Any, asgi: bool) -> None:
        self.app, self.asgi = app, asgi

    def __call__(self, method: str, path: str, user: Any = None, **kw: Any) -> httpx.Response:
        headers = {"x-user": str(user)} if user is not None else {}
        headers.update(kw.pop("headers", {}))
        if self.asgi:

            async def go() -> httpx.Response:
                async with httpx.AsyncClient(transport=httpx.ASGITransport(self.app), base_url="http://t") as c:
                    return await c.request(method, path, headers=headers, **kw)

            return asyncio.run(go())
        with httpx.Client(transport=httpx.WSGITransport(self.app), base_url="http://t") as c:
            return c.request(method, path, headers=headers, **kw)


@pytest.fixture(params=["asgi", "wsgi"])
def client(request: pytest.FixtureRequest, connector: Callable[..., PushConnector]) -> tuple[Client, PushConnector]:
    c = connector(channels=["/chat", "/user"])
    cls = PushApp if request.param == "asgi" else PushWSGIApp
    app = cls(connector=c, user_id_lookup=_user, group_ids_lookup=_groups, allow_endpoint=LOCAL)
    return Client(app, request.param == "asgi"), c


def test_register_list_remove(
    client: tuple[Client, PushConnector], push_service: PushService, vapid: VapidKeys
) -> None:
    call, c = client
    assert call("GET", "/push/key").json() == {"publicKey": vapid.public_key}
    sub = push_service.subscribe(vapid.public_key)
    r = call("POST", "/push/subscriptions", user=5, json={"subscription": sub, "topics": ["/chat/1", "/user/5/"]})
    assert r.status_code == 201, r.text
    assert r.json() == {"endpoint": sub["endpoint"], "topics": ["/chat/1", "/user/5"]}
    listed = call("GET", "/push/subscriptions", user=5).json()["subscriptions"]
    assert [(s["endpoint"], s["topics"]) for s in listed] == [(sub["endpoint"], ["/chat/1", "/user/5"])]
    assert call("GET", "/push/subscriptions", user=6).json() == {"subscriptions": []}
    # another user cannot remove it; its owner can
    assert call("DELETE", "/push/subscriptions", user=6, json={"endpoint": sub["endpoint"]}).json() == {
        "removed": False
    }
    assert [r.endpoint for r in c.store.all()] == [sub["endpoint"]]
    assert call("DELETE", "/push/subscriptions", user=5, json={"endpoint": sub["endpoint"]}).json() == {"removed": True}
    assert c.store.all() == []
    # the same browser signing in as another user moves the device to that user
    call("POST", "/push/subscriptions", user=5, json={"subscription": sub, "topics": ["/chat"]})
    call("POST", "/push/subscriptions", user=6, json={"subscription": sub, "topics": ["/chat"]})
    assert [(r.user_id, r.endpoint) for r in c.store.all()] == [(6, sub["endpoint"])]


@pytest.mark.parametrize(
    ("user", "body", "status", "reason"),
    [
        (None, {"topics": ["/chat"]}, 403, "sign in"),
        (5, {"topics": ["/user/6"]}, 403, "another user's space"),
        (5, {"topics": ["/news"]}, 403, "not a push channel"),
        (5, {"topics": ["/__status"]}, 400, "invalid topic"),
        (5, {"topics": []}, 400, "topics must be"),
        (5, {"topics": ["/chat"], "bad_keys": True}, 400, "p256dh"),
        (5, {"topics": ["/chat"], "endpoint": "https://10.0.0.1/x"}, 403, "not an allowed push service"),
        (5, {"topics": ["/chat"], "endpoint": "ftp://h/x"}, 400, "http(s) URL"),
        (5, "not json", 400, "JSON"),
        (5, "form", 415, "application/json"),
    ],
)
def test_refusals(
    client: tuple[Client, PushConnector],
    push_service: PushService,
    vapid: VapidKeys,
    user: Any,
    body: Any,
    status: int,
    reason: str,
) -> None:
    call, c = client
    sub = push_service.subscribe(vapid.public_key)
    if isinstance(body, dict):
        body = dict(body)  # the parameters are shared by both shells
        if body.pop("bad_keys", False):
            sub["keys"]["p256dh"] = sub["keys"]["p256dh"][:-4] + "AAAA"  # off the curve (or not 65 bytes)
        if "endpoint" in body:
            sub["endpoint"] = body.pop("endpoint")
        r = call("POST", "/push/subscriptions", user=user, json={"subscription": sub, **body})
    elif body == "form":  # what a cross-site form can send: text/plain with a JSON-looking body (CSRF)
        data = json.dumps({"subscription": sub, "topics": ["/chat"]}).encode()
        r = call("POST", "/push/subscriptions", user=user, content=data, headers={"content-type": "text/plain"})
    else:
        r = call(
            "POST",
            "/push/subscriptions",
            user=user,
            content=body.encode(),
            headers={"content-type": "application/json"},
        )
    assert (r.status_code, reason in r.text) == (status, True), r.text
    assert c.store.all() == []


def test_routes_and_sizes(client: tuple[Client, PushConnector]) -> None:
    call, _c = client
    assert call("GET", "/push/nope", user=1).status_code == 404
    assert call("PUT", "/push/subscriptions", user=1).status_code == 405
    assert call("POST", "/push/subscriptions", user=1, content=b"x" * 20000).status_code == 413
    assert call("DELETE", "/push/subscriptions", user=1, content=b"{}").status_code == 415
    assert call("GET", "/elsewhere").status_code == 404
    assert call("GET", "/push/message?channel=/chat/1&id=x", user=1).status_code == 400


def test_fetch_route_applies_targeting(
    client: tuple[Client, PushConnector], bus: Bus, push_service: PushService, vapid: VapidKeys
) -> None:
    """An oversized message arrives as a fetch notice; the service worker fetches it, and only its user can."""
    call, c = client
    c.start()
    sub = push_service.subscribe(vapid.public_key)
    assert (
        call("POST", "/push/subscriptions", user=5, json={"subscription": sub, "topics": ["/chat"]}).status_code == 201
    )
    wait_leading(c)
    big = "y" * (MAX_PLAINTEXT + 1)
    mid = bus.publish("/chat/9", {"text": big}, user_ids=[5])
    bus.publish("/chat/9", "group", group_ids=[3])
    (notice,) = wait_for(lambda: push_service.received(sub), what="the notice")
    assert notice.payload["fetch"] is True and "data" not in notice.payload
    url = f"/push/message?channel=/chat/9&id={notice.payload['message_id']}"
    r = call("GET", url, user=5)
    assert r.status_code == 200 and r.json()["data"] == {"text": big} and r.json()["message_id"] == mid
    assert call("GET", url, user=6).status_code == 404  # another user: as if it did not exist
    assert call("GET", url).status_code == 403
    assert call("GET", f"/push/message?channel=/chat/9&id={mid + 1}", user=6).status_code == 404
    assert (
        call("GET", f"/push/message?channel=/chat/9&id={mid + 1}", user=6, headers={"x-groups": "3"}).status_code == 200
    )
    assert call("GET", f"/push/message?channel=/news&id={mid}", user=5).status_code == 404


@pytest.mark.parametrize(
    "url",
    ["https://2130706433/x", "https://0x7f.1/x", "https://127.1/x", "https://0/x", "https://localhost./x",
     "https://a.localhost/x", "https://10.0.0.1/x", "https://[::1]/x", "https://[::ffff:127.0.0.1]/x",
     "http://push.example.com/x"],
)  # fmt: skip
def test_default_endpoint_policy_refuses_addresses(url: str) -> None:
    """Every spelling of an IP address the resolver accepts (decimal, hex, short dotted) is refused like a
    literal: the registration check is no place to trust a name's look. (The sender checks resolved addresses.)"""
    assert not default_endpoint_allowed(url)
    assert default_endpoint_allowed(url.replace(url.split("/")[2], "fcm.googleapis.com").replace("http:", "https:"))


def test_devices_per_user_are_bounded(
    client: tuple[Client, PushConnector], push_service: PushService, vapid: VapidKeys
) -> None:
    """A user cannot register devices without bound (each is stored and pushed to): beyond max_devices a new one
    is 409; re-registering one of them, and another user's devices, are unaffected."""
    call, c = client
    call.app.max_devices = 2
    subs = [push_service.subscribe(vapid.public_key) for _ in range(4)]

    def post(user: int, sub: dict[str, Any]) -> int:
        body = {"subscription": sub, "topics": ["/chat"]}
        return call("POST", "/push/subscriptions", user=user, json=body).status_code

    assert [post(5, s) for s in subs[:3]] == [201, 201, 409]
    assert post(5, subs[0]) == 201  # the same device again: an update, not a new one
    assert post(6, subs[3]) == 201
    assert call("DELETE", "/push/subscriptions", user=5, json={"endpoint": subs[1]["endpoint"]}).json()["removed"]
    assert post(5, subs[2]) == 201
    assert sorted(r.endpoint for r in c.store.of_user(5)) == sorted([subs[0]["endpoint"], subs[2]["endpoint"]])
