"""A small synchronous NATS connection: the bridge's own client (no asyncio, no thread of its own).

One blocking socket per thread that uses it (:class:`NatsConnection`): requests go out with reply subjects under
the connection's own inbox (``_INBOX.<random>.<n>``, one ``SUB`` with a wildcard), so a *batch* of requests is one
``sendall`` and its replies are read as they come, matched by ``n``; a late reply to an abandoned request
(a timeout) carries an ``n`` nobody waits for and is dropped. The server's ``PING`` is answered while reading.
Failures are :class:`OSError` (refused, reset, timed out) or :class:`~.protocol.NatsProtocolError`; after either the
connection is closed and must be replaced.
"""

from __future__ import annotations

import contextlib
import secrets
import socket
import time
import urllib.parse
from typing import Any

from .protocol import OK, PING, PONG, Msg, NatsProtocolError, Parser, connect_op, pub_op, sub_op

__all__ = ["NatsConnection", "ServerAddress", "parse_url"]

_READ = 256 * 1024
_INBOX_SID = 1


class ServerAddress:
    """``nats://[user:password@|token@]host[:port]`` as its parts."""

    def __init__(self, host: str, port: int, user: str | None, password: str | None, token: str | None) -> None:
        self.host, self.port, self.user, self.password, self.token = host, port, user, password, token


def parse_url(url: str) -> ServerAddress:
    parts = urllib.parse.urlsplit(url if "://" in url else f"nats://{url}")
    if parts.scheme not in ("nats", ""):
        raise ValueError(f"unsupported NATS URL scheme {parts.scheme!r} (only nats://; TLS is not supported)")
    user = urllib.parse.unquote(parts.username) if parts.username else None
    password = urllib.parse.unquote(parts.password) if parts.password is not None else None
    token = None
    if user is not None and password is None:
        token, user = user, None
    return ServerAddress(parts.hostname or "127.0.0.1", parts.port or 4222, user, password, token)


class NatsConnection:
    """One connection to a NATS server (see the module doc). ``timeout``: seconds any read may wait."""

    def __init__(self, url: str, *, timeout: float, connect_timeout: float, name: str = "shmbus") -> None:
        addr = parse_url(url)
        self.timeout = timeout
        self.parser = Parser()
        self.closed = False
        self.inbox = b"_INBOX." + secrets.token_hex(11).encode()
        self._next = 0  # the next reply number
        self.held: list[Msg] = []  # messages for other subscriptions read while waiting for replies
        self.sock = socket.create_connection((addr.host, addr.port), timeout=connect_timeout)
        try:
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.sock.settimeout(connect_timeout)
            self.info = self._read_info()
            options: dict[str, Any] = {
                "verbose": False,
                "pedantic": False,
                "headers": True,
                "no_responders": True,
                "protocol": 1,
                "lang": "python-shmbus",
                "version": "1",
                "name": name,
            }
            if addr.user is not None:
                options["user"], options["pass"] = addr.user, addr.password or ""
            if addr.token is not None:
                options["auth_token"] = addr.token
            self.sock.sendall(connect_op(options) + b"PING\r\n" + sub_op(self.inbox + b".*", _INBOX_SID))
            self._until_pong(time.monotonic() + connect_timeout)
            self.sock.settimeout(timeout)
        except BaseException:
            self.close()
            raise
        self.max_payload = int(self.info.get("max_payload", 1 << 20))

    def _read_info(self) -> dict[str, Any]:
        while True:
            for op in self._read_once():
                if op[0] == "INFO":
                    info: dict[str, Any] = op[1]
                    return info
                raise NatsProtocolError(f"expected INFO, got {op!r}")

    def _until_pong(self, deadline: float) -> None:
        while True:
            for op in self._read_once(deadline):
                if op is PONG:
                    return
                self._take(op)

    def _read_once(self, deadline: float | None = None) -> list[Any]:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no reply from the NATS server in time")
            self.sock.settimeout(left)
        data = self.sock.recv(_READ)
        if not data:
            raise ConnectionResetError("the NATS server closed the connection")
        return self.parser.feed(data)

    def _take(self, op: Any) -> None:
        """An operation that is not what the reader waits for: answer PING, keep messages for others."""
        if op is PING:
            self.sock.sendall(b"PONG\r\n")
        elif isinstance(op, Msg):
            if op.sid != b"1":
                self.held.append(op)
        elif op is OK or op is PONG or op[0] == "INFO":
            return
        elif op[0] == "ERR":
            raise NatsProtocolError(op[1])

    # ------------------------------------------------------------------ requests
    def reply_subjects(self, count: int) -> tuple[int, list[bytes]]:
        """``count`` fresh reply subjects and the number of the first."""
        first = self._next
        self._next += count
        inbox = self.inbox
        return first, [b"%s.%d" % (inbox, n) for n in range(first, first + count)]

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def pump(self, deadline: float) -> list[Msg]:
        """Read once (until ``deadline``): the replies that came (messages on the inbox); the rest is handled."""
        out: list[Msg] = []
        for op in self._read_once(deadline):
            if isinstance(op, Msg) and op.sid == b"1":
                out.append(op)
            else:
                self._take(op)
        return out

    def replies(self, first: int, count: int, timeout: float | None = None) -> list[Msg]:
        """The replies to requests ``first`` .. ``first + count - 1`` (sent already), in that order; a reply to
        any other request (abandoned earlier) is dropped."""
        got: list[Msg | None] = [None] * count
        missing = count
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        prefix_len = len(self.inbox) + 1
        while missing:
            for msg in self.pump(deadline):
                tail = msg.subject[prefix_len:]
                if not tail.isdigit():
                    continue
                i = int(tail) - first
                if 0 <= i < count and got[i] is None:
                    got[i] = msg
                    missing -= 1
        return got  # type: ignore[return-value]  # every slot was filled

    def request(self, subject: bytes, payload: bytes, timeout: float | None = None) -> Msg:
        first, (reply,) = self.reply_subjects(1)
        self.send(pub_op(subject, reply, payload))
        return self.replies(first, 1, timeout)[0]

    def ping(self) -> None:
        self.send(b"PING\r\n")
        self._until_pong(time.monotonic() + self.timeout)

    def read_messages(self, timeout: float) -> list[Msg]:
        """Messages of other subscriptions (a doorbell's): those held, else what one wait of ``timeout`` brings."""
        if self.held:
            held, self.held = self.held, []
            return held
        try:
            ops = self._read_once(time.monotonic() + timeout) if timeout > 0 else []
        except TimeoutError:
            return []
        for op in ops:
            self._take(op)
        held, self.held = self.held, []
        return held

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self.sock.close()
