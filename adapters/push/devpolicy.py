"""Letting an app push to a development push service (:mod:`.devservice`) as well as to the real ones.

Why: the SSRF guard's defaults refuse exactly where a development push service listens: ``PushApp``'s
``allow_endpoint`` takes ``https`` to a host name only (never ``http``, an IP address or ``localhost``), the
sender's ``allow_address`` takes public addresses only (never loopback) and ``allow_ports`` takes 443 only. A
:class:`DevAllowance` widens each by that one service and nothing else it can name: its scheme, host and port for
endpoints, its addresses for connections, its port for ports. For development: on a server that users reach, leave
the defaults alone.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from .addresses import DEFAULT_PORTS, IPAddress, endpoint_port, public_address
from .subscriptions import default_endpoint_allowed

__all__ = ["DevAllowance"]

Resolve = Callable[[str, int], list[Any]]


def _resolve(host: str, port: int) -> list[Any]:
    return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)


class DevAllowance:
    """The default policies plus the development push service at ``url`` (``http://127.0.0.1:8030``).

    ``allow_endpoint`` (for ``PushApp``), ``allow_address`` and ``allow_ports`` (for ``PushConnector``; both in
    :meth:`connector_options`). The service's addresses are resolved once, here (OSError when its host has
    none). The sender judges address and port apart, so the service's address is allowed on port 443 too: what
    listens there on a developer's machine is theirs."""

    def __init__(self, url: str, resolve: Resolve = _resolve) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"a development push service is an http(s)://host:port URL, got {url!r}")
        self.url = f"{parts.scheme}://{parts.netloc}"
        self.scheme = parts.scheme
        self.host = parts.hostname.lower()
        self.port = endpoint_port(url)
        self.addresses = frozenset(_address(info[4][0]) for info in resolve(self.host, self.port))
        if not self.addresses:
            raise OSError(f"{self.host} resolves to no address")

    def allow_endpoint(self, url: str) -> bool:
        """The default policy's endpoints, and those of the service (by its name or one of its addresses)."""
        if default_endpoint_allowed(url):
            return True
        try:
            parts = urlsplit(url)
            host, port = (parts.hostname or "").lower(), endpoint_port(url)
        except ValueError:
            return False
        if parts.scheme != self.scheme or port != self.port or not parts.path.startswith("/push/"):
            return False
        if host == self.host:
            return True
        try:
            return _address(host) in self.addresses
        except ValueError:
            return False

    def allow_address(self, ip: IPAddress) -> bool:
        return public_address(ip) or ip in self.addresses

    @property
    def allow_ports(self) -> frozenset[int]:
        return DEFAULT_PORTS | {self.port}

    def connector_options(self) -> dict[str, Any]:
        """``PushConnector(..., **allowance.connector_options())``."""
        return {"allow_address": self.allow_address, "allow_ports": self.allow_ports}


def _address(text: str) -> IPAddress:
    return ipaddress.ip_address(str(text).split("%", 1)[0])
