"""Which push-service addresses and ports the sender may connect to (the SSRF guard's policy), sans-IO.

Why a module of its own: an endpoint is a URL a user chose, so every address its host resolves to is judged here
before a socket connects to it. An IPv6 address can carry an IPv4 one (IPv4-mapped and -translated,
IPv4-compatible, NAT64, 6to4, Teredo): a NAT64 gateway or a 6to4/Teredo relay delivers a packet to that IPv4
address, so ``64:ff9b::7f00:1`` is ``127.0.0.1`` to whatever sits behind the gateway. Such an address is judged
as the IPv4 addresses it carries.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from urllib.parse import urlsplit

__all__ = [
    "DEFAULT_PORTS",
    "IPAddress",
    "describe_address",
    "embedded_ipv4",
    "endpoint_port",
    "ports_of",
    "public_address",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPv4 = ipaddress.IPv4Address

#: The ports a push may go to unless ``allow_ports`` says otherwise: push services listen on HTTPS's port only.
DEFAULT_PORTS: frozenset[int] = frozenset({443})

_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # RFC 6052's well-known prefix: the IPv4 address in the last 32 bits
# RFC 8215's local-use prefix: an operator picks the prefix length, so where the IPv4 address sits is unknown; it is
# not globally routable (Python before 3.11.10/3.12.4 calls it global), so it is refused whole
_NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")
_TRANSLATED = ipaddress.IPv6Network("::ffff:0:0:0/96")  # RFC 2765 (SIIT) IPv4-translated
_COMPATIBLE = ipaddress.IPv6Network("::/96")  # RFC 4291's deprecated IPv4-compatible (``::`` and ``::1`` included)


def embedded_ipv4(ip: ipaddress.IPv6Address) -> tuple[str, tuple[IPv4, ...]] | None:
    """The name of the form and the IPv4 addresses ``ip`` carries (Teredo: its server and its client, whose
    address is XOR-ed into the last 32 bits); None when it carries none."""
    low = IPv4(int(ip) & 0xFFFFFFFF)
    if ip.ipv4_mapped is not None:
        return "IPv4-mapped", (ip.ipv4_mapped,)
    if ip in _TRANSLATED:
        return "IPv4-translated", (low,)
    if ip in _COMPATIBLE:
        return "IPv4-compatible", (low,)
    if ip in _NAT64:
        return "NAT64", (low,)
    if ip.sixtofour is not None:
        return "6to4", (ip.sixtofour,)
    if ip.teredo is not None:
        return "Teredo", ip.teredo
    return None


def _public(ip: IPAddress) -> bool:
    return ip.is_global and not ip.is_multicast


def public_address(ip: IPAddress) -> bool:
    """The sender's default address policy: a globally routable unicast address (not loopback, private,
    link-local, shared, reserved or multicast). An IPv6 address that carries IPv4 addresses is public only when
    each of those is; the IPv4-mapped form is its IPv4 address to the socket layer and is judged as that alone,
    the others must be global IPv6 addresses as well (the stdlib counts Teredo's ``2001::/23`` as not global)."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip in _NAT64_LOCAL:
            return False
        carried = embedded_ipv4(ip)
        if carried is not None:
            form, v4s = carried
            return all(_public(v4) for v4 in v4s) and (form == "IPv4-mapped" or _public(ip))
    return _public(ip)


def describe_address(ip: IPAddress) -> str:
    """``ip`` as a refusal shows it: with the IPv4 addresses it carries (``64:ff9b::7f00:1 (NAT64 of
    127.0.0.1)``), so the reason names what the policy judged."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip in _NAT64_LOCAL:
            return f"{ip} (local-use NAT64)"
        carried = embedded_ipv4(ip)
        if carried is not None:
            return f"{ip} ({carried[0]} of {', '.join(map(str, carried[1]))})"
    return str(ip)


def endpoint_port(url: str) -> int:
    """The port a push to ``url`` connects to (the scheme's when the URL names none)."""
    parts = urlsplit(url)
    return parts.port or (443 if parts.scheme == "https" else 80)


def ports_of(allow_ports: Iterable[int] | None) -> frozenset[int] | None:
    """``allow_ports`` checked: None (any port) or a non-empty set of ports 1-65535."""
    if allow_ports is None:
        return None
    ports = frozenset(allow_ports)
    if not ports or any(isinstance(p, bool) or not isinstance(p, int) or not 0 < p < 65536 for p in ports):
        raise ValueError(f"allow_ports must be None or TCP ports 1-65535, got {sorted(ports, key=str)!r}")
    return ports
