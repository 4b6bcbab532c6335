"""The development push service as a developer uses it: over HTTP (subscriptions handed out, what it took shown
decrypted, what it refused and why), as a command (``shmbus push-dev``), and with the allowance that lets an app's
sender reach it while the SSRF guard's defaults stay as they are for everything else."""

from __future__ import annotations

import ipaddress
import json
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

from shmbus import Bus
from shmbus.adapters.push import PushConnector, VapidKeys
from shmbus.adapters.push.devpolicy import DevAllowance
from shmbus.adapters.push.devservice import PushService
from tests.harness.wait import wait_for

from .push_util import register, wait_leading

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _call(url: str, body: Any = None, ctype: str = "application/json") -> tuple[int, bytes]:
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    req = urllib.request.Request(url, data, {"Content-Type": ctype} if data is not None else {})
    try:
        with _OPENER.open(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_a_subscription_over_http_then_its_pushes_decrypted(
    bus: Bus, push_service: PushService, connector: Callable[..., PushConnector], vapid: VapidKeys
) -> None:
    origin = push_service.origin
    status, body = _call(f"{origin}/subscriptions", {"applicationServerKey": vapid.public_key})
    assert status == 201
    sub = json.loads(body)
    assert sub["endpoint"].startswith(f"{origin}/push/") and set(sub["keys"]) == {"p256dh", "auth"}
    other = push_service.subscribe(vapid.public_key)
    c = connector(channels="/chat").start()
    register(c, sub, "ann", ["/chat"])
    register(c, other, "bob", ["/chat"])
    wait_leading(c)
    bus.publish("/chat", {"text": "hello ann"})
    wait_for(lambda: len(push_service.deliveries) == 2, what="both pushes")
    bus.publish("/chat", {"text": "again"})
    wait_for(lambda: len(push_service.deliveries) == 4, what="the second pushes")

    status, body = _call(f"{origin}/deliveries?endpoint={sub['endpoint']}")
    mine = json.loads(body)["deliveries"]
    assert status == 200 and [d["payload"]["data"]["text"] for d in mine] == ["hello ann", "again"]
    assert {d["endpoint"] for d in mine} == {sub["endpoint"]} and mine[0]["ttl"] == 86400
    status, body = _call(f"{origin}/deliveries?endpoint={sub['endpoint']}&after={mine[0]['seq']}")
    assert [d["payload"]["data"]["text"] for d in json.loads(body)["deliveries"]] == ["again"]
    assert len(json.loads(_call(f"{origin}/deliveries")[1])["deliveries"]) == 4

    status, page = _call(f"{origin}/")
    assert status == 200 and b"For development only: not a real push service" in page
    assert b"hello ann" in page and b"2 subscription(s) handed out" in page


def test_what_it_refuses_and_why(push_service: PushService, vapid: VapidKeys) -> None:
    origin = push_service.origin
    assert _call(f"{origin}/subscriptions", {"applicationServerKey": vapid.public_key}, "text/plain")[0] == 415
    status, why = _call(f"{origin}/subscriptions", {"applicationServerKey": "not-a-key"})
    assert status == 400 and b"P-256" in why
    assert _call(f"{origin}/subscriptions", {"key": vapid.public_key})[0] == 400
    sub = push_service.subscribe(vapid.public_key)
    # a push without VAPID, then one to a subscription it never made: refused as a push service refuses them
    status, why = _call(sub["endpoint"], b"\x00" * 100, "application/octet-stream")
    assert status == 401 and b"vapid" in why
    assert _call(f"{origin}/push/unknown", b"", "application/octet-stream")[0] == 404
    refused = json.loads(_call(f"{origin}/deliveries?endpoint={sub['endpoint']}")[1])["refusals"]
    assert [r["status"] for r in refused] == [401]


def test_text_and_empty_pushes_are_taken(push_service: PushService, vapid: VapidKeys) -> None:
    """Another app's pushes need not be JSON, and RFC 8030 allows a push without a body."""
    from pywebpush import webpush

    sub = push_service.subscribe(vapid.public_key)
    claims = {"sub": vapid.sub}
    webpush(sub, "plain text", vapid_private_key=vapid.vapid, vapid_claims=dict(claims), ttl=60)
    webpush(sub, None, vapid_private_key=vapid.vapid, vapid_claims=dict(claims), ttl=60)
    assert [d.payload for d in push_service.received(sub)] == ["plain text", None]
    assert push_service.refusals == []


def test_kept_deliveries_are_bounded(vapid: VapidKeys) -> None:
    from pywebpush import webpush

    service = PushService(keep=2).start()
    try:
        sub = service.subscribe(vapid.public_key)
        for i in range(3):
            webpush(sub, json.dumps(i), vapid_private_key=vapid.vapid, vapid_claims={"sub": vapid.sub}, ttl=60)
        assert [(d.seq, d.payload) for d in service.deliveries] == [(2, 1), (3, 2)] and service.accepted == 3
    finally:
        service.stop()


def test_the_command_prints_its_url_and_stops_on_sigterm(procs: Any, vapid: VapidKeys) -> None:
    proc = procs.spawn([sys.executable, "-m", "shmbus.cli", "push-dev", "--port", "0"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)  # fmt: skip
    origin = proc.stdout.readline().strip()
    assert origin.startswith("http://127.0.0.1:"), proc.stderr.read() if proc.poll() is not None else origin
    assert _call(f"{origin}/subscriptions", {"applicationServerKey": vapid.public_key})[0] == 201
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert "DEVELOPMENT push service" in proc.stderr.read()


def test_the_command_refuses_a_wildcard_host() -> None:
    done = subprocess.run([sys.executable, "-m", "shmbus.adapters.push.devservice", "--host", "0.0.0.0"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode != 0 and "not a wildcard" in done.stderr


def test_the_allowance_adds_the_dev_service_and_nothing_else() -> None:
    dev = DevAllowance("http://127.0.0.1:8030", resolve=lambda host, port: [(2, 1, 6, "", ("127.0.0.1", port))])
    assert dev.url == "http://127.0.0.1:8030" and dev.allow_ports == {443, 8030}
    assert dev.allow_endpoint("http://127.0.0.1:8030/push/abc")
    assert dev.allow_endpoint("https://fcm.googleapis.com/fcm/send/x")  # the default's still
    for refused in (
        "http://127.0.0.1:8031/push/abc",  # another port
        "https://127.0.0.1:8030/push/abc",  # another scheme
        "http://127.0.0.1:8030/admin",  # not a push endpoint
        "http://10.0.0.1:8030/push/abc",  # another address
        "http://localhost:8031/push/abc",
    ):
        assert not dev.allow_endpoint(refused), refused
    assert dev.allow_address(ipaddress.ip_address("127.0.0.1"))
    assert dev.allow_address(ipaddress.ip_address("8.8.8.8"))
    assert not dev.allow_address(ipaddress.ip_address("127.0.0.2"))
    assert not dev.allow_address(ipaddress.ip_address("10.0.0.1"))
    by_name = DevAllowance("http://localhost:8030", resolve=lambda host, port: [(2, 1, 6, "", ("127.0.0.1", port))])
    assert by_name.allow_endpoint("http://localhost:8030/push/x") and by_name.allow_endpoint(
        "http://127.0.0.1:8030/push/x"
    )
    with pytest.raises(ValueError):
        DevAllowance("127.0.0.1:8030")


def test_a_connector_with_the_allowance_pushes_to_it(
    bus: Bus, push_service: PushService, connector: Callable[..., PushConnector], vapid: VapidKeys
) -> None:
    """The sender's defaults refuse the dev service (loopback, another port); the allowance lets it through."""
    dev = DevAllowance(push_service.origin)
    c = connector(channels="/chat", **dev.connector_options()).start()
    sub = push_service.subscribe(vapid.public_key)
    register(c, sub, "ann", ["/chat"])
    wait_leading(c)
    bus.publish("/chat", {"text": "through"})
    (got,) = wait_for(lambda: push_service.received(sub), what="the push")
    assert got.payload["data"] == {"text": "through"}
