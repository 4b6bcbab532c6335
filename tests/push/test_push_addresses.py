"""The sender's SSRF guard: which addresses and ports a push may connect to. An IPv6 address that carries an IPv4
one (mapped, translated, compatible, NAT64, 6to4, Teredo) is judged as that IPv4 address; ports are 443 unless
``allow_ports`` says otherwise, checked at registration and at every connection."""

from __future__ import annotations

import asyncio
import ipaddress
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from shmbus import Bus
from shmbus.adapters.push import DEFAULT_PORTS, FileStore, PushApp, PushConnector, VapidKeys, public_address
from shmbus.adapters.push.addresses import describe_address, embedded_ipv4, endpoint_port, ports_of
from shmbus.adapters.push.devservice import PushService
from shmbus.adapters.push.subscriptions import parse_registration
from tests.harness.wait import wait_for

from .push_util import register, wait_leading

# the Teredo client address is stored XOR-ed: ~127.0.0.1 = 0x80fffffe, ~8.8.8.8 = 0xf7f7f7f7
_TEREDO_LOOPBACK_CLIENT = "2001:0:4136:e378:8000:63bf:80ff:fffe"  # server 65.54.227.120, client 127.0.0.1
_TEREDO_PRIVATE_SERVER = "2001:0:a00:1:8000:63bf:f7f7:f7f7"  # server 10.0.0.1, client 8.8.8.8


@pytest.mark.parametrize(
    ("address", "public"),
    [
        # plain addresses
        ("127.0.0.1", False), ("10.1.2.3", False), ("169.254.169.254", False), ("100.64.0.1", False),
        ("0.0.0.0", False), ("224.0.0.1", False), ("::1", False), ("::", False), ("fe80::1", False),
        ("fc00::1", False), ("ff02::1", False), ("142.250.74.106", True), ("2a00:1450:4001:82b::200a", True),
        # IPv4-mapped ::ffff:a.b.c.d
        ("::ffff:127.0.0.1", False), ("::ffff:10.0.0.1", False), ("::ffff:169.254.169.254", False),
        ("::ffff:8.8.8.8", True),
        # IPv4-translated ::ffff:0:a.b.c.d (SIIT)
        ("::ffff:0:127.0.0.1", False), ("::ffff:0:192.168.1.1", False), ("::ffff:0:8.8.8.8", True),
        # IPv4-compatible ::a.b.c.d
        ("::127.0.0.1", False), ("::10.0.0.1", False), ("::169.254.169.254", False), ("::100.64.0.1", False),
        ("::8.8.8.8", True),
        # NAT64, the well-known prefix 64:ff9b::/96
        ("64:ff9b::7f00:1", False), ("64:ff9b::a00:1", False), ("64:ff9b::a9fe:a9fe", False),
        ("64:ff9b::c0a8:101", False), ("64:ff9b::e000:1", False), ("64:ff9b::808:808", True),
        # NAT64, the local-use prefix 64:ff9b:1::/48 (where the IPv4 address sits is the operator's choice)
        ("64:ff9b:1::808:808", False), ("64:ff9b:1:7f00:1::", False),
        # 6to4 2002:a.b.c.d::/48
        ("2002:7f00:1::1", False), ("2002:a00:1::1", False), ("2002:a9fe:a9fe::1", False),
        ("2002:c0a8:101::1", False), ("2002:808:808::1", True),
        # Teredo 2001::/32: server in bits 32-63, client XOR-ed in the last 32
        (_TEREDO_LOOPBACK_CLIENT, False), (_TEREDO_PRIVATE_SERVER, False),
    ],
)  # fmt: skip
def test_public_address_policy(address: str, public: bool) -> None:
    assert public_address(ipaddress.ip_address(address)) is public


@pytest.mark.parametrize(
    ("address", "form", "carried"),
    [("::ffff:127.0.0.1", "IPv4-mapped", ["127.0.0.1"]), ("::ffff:0:10.0.0.1", "IPv4-translated", ["10.0.0.1"]),
     ("::10.0.0.1", "IPv4-compatible", ["10.0.0.1"]), ("64:ff9b::7f00:1", "NAT64", ["127.0.0.1"]),
     ("2002:a9fe:a9fe::1", "6to4", ["169.254.169.254"]),
     (_TEREDO_LOOPBACK_CLIENT, "Teredo", ["65.54.227.120", "127.0.0.1"]),
     (_TEREDO_PRIVATE_SERVER, "Teredo", ["10.0.0.1", "8.8.8.8"])],
)  # fmt: skip
def test_embedded_ipv4_is_found(address: str, form: str, carried: list[str]) -> None:
    got = embedded_ipv4(ipaddress.IPv6Address(address))
    assert got is not None and (got[0], [str(a) for a in got[1]]) == (form, carried)


def test_addresses_carrying_no_ipv4() -> None:
    assert embedded_ipv4(ipaddress.IPv6Address("2a00:1450:4001:82b::200a")) is None
    assert describe_address(ipaddress.ip_address("10.0.0.1")) == "10.0.0.1"
    assert describe_address(ipaddress.ip_address("64:ff9b::7f00:1")) == "64:ff9b::7f00:1 (NAT64 of 127.0.0.1)"
    assert describe_address(ipaddress.ip_address("64:ff9b:1::1")) == "64:ff9b:1::1 (local-use NAT64)"


def test_ports() -> None:
    assert endpoint_port("https://fcm.googleapis.com/x") == 443
    assert endpoint_port("https://fcm.googleapis.com:8443/x") == 8443
    assert endpoint_port("http://push.example/x") == 80
    assert {443} == DEFAULT_PORTS and ports_of(None) is None and ports_of([443, 8443]) == {443, 8443}
    for bad in ([], [0], [65536], ["443"], [True]):
        with pytest.raises(ValueError, match="allow_ports"):
            ports_of(bad)


def test_default_connector_allows_port_443_only(bus: Bus, vapid: VapidKeys, tmp_path: Path) -> None:
    c = PushConnector(bus, vapid=vapid, channels="/", store=FileStore(str(tmp_path / "push")))
    assert c.lane_options.allow_ports == {443} and c.lane_options.allow_address is public_address


def _settled_refusals(c: PushConnector, bus: Bus) -> list[str]:
    wait_for(lambda: c.stats()["cursor"] == bus.segment.global_id(), what="settled")
    st = c.stats()
    assert (st["sent"], st["retried"]) == (0, 0), st
    return [why for _g, _r, _o, why in c.undelivered]


@pytest.mark.parametrize(
    ("host", "shown"),
    [("[64:ff9b::7f00:1]", "NAT64 of 127.0.0.1"), ("[2002:7f00:1::1]", "6to4 of 127.0.0.1"),
     ("[::127.0.0.1]", "IPv4-compatible of 127.0.0.1"), ("[::ffff:0:127.0.0.1]", "IPv4-translated of 127.0.0.1")],
)  # fmt: skip
def test_an_endpoint_on_an_embedded_ipv4_address_is_refused(
    host: str, shown: str, bus: Bus, push_service: PushService, connector: Callable[..., PushConnector],
    vapid: VapidKeys,
) -> None:  # fmt: skip
    """End to end: a stored endpoint naming an IPv6 address that carries a loopback IPv4 one (registered through
    an ``allow_endpoint`` that let it by, or a name resolving there) fails without a connection, not retried, and
    the reason names the IPv4 address judged."""
    c = connector(allow_address=public_address, max_attempts=3)
    dev = push_service.subscribe(vapid.public_key)
    dev["endpoint"] = dev["endpoint"].replace("127.0.0.1", host)
    body = {"subscription": dev, "topics": ["/s"]}
    c.store.add(parse_registration(body, 1, None, c.pushes, lambda _url: True, time.time()))
    c.start()
    wait_leading(c)
    bus.publish("/s", "internal?")
    (why,) = _settled_refusals(c, bus)
    assert "resolves to no allowed address" in why and shown in why, why
    assert c.stats()["failed"] == 1 and push_service.attempts == []


def test_a_push_to_another_port_is_refused(
    bus: Bus, push_service: PushService, connector: Callable[..., PushConnector], vapid: VapidKeys
) -> None:
    """The push service listens on a port of its own: with ``allow_ports`` 443 a device registered there before
    (or through an endpoint check that let it by) is refused at the connection, with the port in the reason."""
    c = connector(allow_ports=DEFAULT_PORTS)
    dev = push_service.subscribe(vapid.public_key)
    register(c, dev, 1, ["/p"])
    c.start()
    wait_leading(c)
    bus.publish("/p", "elsewhere?")
    (why,) = _settled_refusals(c, bus)
    assert why == f"port {endpoint_port(dev['endpoint'])} is not allowed (allow_ports: 443)"
    assert c.stats()["failed"] == 1 and push_service.attempts == []


def test_registration_refuses_another_port(
    push_service: PushService, connector: Callable[..., PushConnector], vapid: VapidKeys
) -> None:
    """The app refuses at registration the port the sender would refuse at every push, saying why (403)."""
    c = connector(channels=["/chat"], allow_ports=[443])
    app = PushApp(connector=c, user_id_lookup=lambda _scope: 5, allow_endpoint=lambda _url: True)
    sub: dict[str, Any] = push_service.subscribe(vapid.public_key)
    port = endpoint_port(sub["endpoint"])

    async def post(endpoint: str) -> httpx.Response:
        body = {"subscription": {**sub, "endpoint": endpoint}, "topics": ["/chat"]}
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as client:
            return await client.post("/push/subscriptions", json=body)

    refused = asyncio.run(post(sub["endpoint"]))
    assert refused.status_code == 403 and f"port {port} is not allowed (allow_ports: 443)" in refused.text
    assert c.store.all() == []
    assert asyncio.run(post("https://push.example.com/x")).status_code == 201
    assert asyncio.run(post("https://push.example.com:443/y")).status_code == 201
