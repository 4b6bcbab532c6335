"""Tiny HTTP/1.x client over raw sockets for the real-server tests (exact bytes, streaming, HTTP/1.0)."""

from __future__ import annotations

import json
import socket
import time
from typing import Any
from urllib.parse import urlencode

SEP = b"\r\n|\r\n"


class RawResponse:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""
        self.head = b""
        self.status = 0
        self.headers: dict[str, str] = {}
        self.chunked = False
        self.length: int | None = None
        self.raw_body = b""  # body bytes as on the wire (chunk framing included)

    def _fill(self, deadline: float) -> bool:
        self.sock.settimeout(max(deadline - time.monotonic(), 0.01))
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return True
        if not data:
            return False
        self.buf += data
        return True

    def read_head(self, timeout: float = 15.0) -> RawResponse:
        deadline = time.monotonic() + timeout
        while b"\r\n\r\n" not in self.buf:
            if not self._fill(deadline) or time.monotonic() > deadline:
                raise AssertionError(f"no response head: {self.buf!r}")
        self.head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        lines = self.head.decode("latin-1").split("\r\n")
        self.status = int(lines[0].split()[1])
        for line in lines[1:]:
            k, _, v = line.partition(":")
            self.headers[k.strip().lower()] = v.strip()
        self.chunked = self.headers.get("transfer-encoding", "").lower() == "chunked"
        if "content-length" in self.headers:
            self.length = int(self.headers["content-length"])
        return self

    def read_until(self, needle: bytes, timeout: float = 15.0) -> bytes:
        """Raw body bytes read so far once ``needle`` appears in them."""
        deadline = time.monotonic() + timeout
        while needle not in self.buf:
            if not self._fill(deadline):
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"{needle!r} not seen within {timeout}s; got {self.buf!r}")
        return self.buf

    def read_all(self, timeout: float = 30.0) -> bytes:
        """The whole (de-chunked) body; closes the connection."""
        try:
            return self._read_all(timeout)
        finally:
            self.sock.close()

    def _read_all(self, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        if self.length is not None:
            while len(self.buf) < self.length:
                if not self._fill(deadline) or time.monotonic() > deadline:
                    break
            self.raw_body = self.buf
            return self.buf[: self.length]
        if self.chunked:
            while not self.buf.endswith(b"0\r\n\r\n"):
                if not self._fill(deadline) or time.monotonic() > deadline:
                    raise AssertionError(f"chunked body did not end: {self.buf!r}")
            self.raw_body = self.buf
            return dechunk(self.buf)
        while self._fill(deadline) and time.monotonic() < deadline:
            pass
        self.raw_body = self.buf
        return self.buf

    def close(self) -> None:
        self.sock.close()


def split_stream(data: bytes) -> list[bytes]:
    """A message_bus stream body -> its pieces (each ends with the separator, the last one included)."""
    parts = data.split(SEP)
    assert parts[-1] == b"", f"stream does not end with the separator: {data!r}"
    return parts[:-1]


def dechunk(data: bytes) -> bytes:
    out = []
    while True:
        size_line, _, rest = data.partition(b"\r\n")
        n = int(size_line.split(b";")[0], 16)
        if n == 0:
            return b"".join(out)
        out.append(rest[:n])
        assert rest[n : n + 2] == b"\r\n", data
        data = rest[n + 2 :]


def send(
    port: int,
    method: str,
    path: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    version: str = "1.1",
    close: bool = True,
) -> RawResponse:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    h = {"Host": "127.0.0.1"}
    if close:
        h["Connection"] = "close"
    h.update(headers or {})
    if body or method == "POST":
        h["Content-Length"] = str(len(body))
    head = f"{method} {path} HTTP/{version}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items()) + "\r\n"
    sock.sendall(head.encode("latin-1") + body)
    return RawResponse(sock)


def poll(
    port: int,
    client_id: str,
    channels: dict[str, Any],
    *,
    chunk: bool = False,
    dlp: bool = False,
    seq: int | None = 1,
    json_body: bool = False,
    version: str = "1.1",
    headers: dict[str, str] | None = None,
) -> RawResponse:
    data = dict(channels)
    if seq is not None:
        data["__seq"] = seq
    h = {"X-SILENCE-LOGGER": "true", **(headers or {})}
    if not chunk:
        h["Dont-Chunk"] = "true"
    if json_body:
        h["Content-Type"] = "application/json"
        body = json.dumps(data).encode()
    else:
        h["Content-Type"] = "application/x-www-form-urlencoded"
        body = urlencode(data).encode()
    return send(port, "POST", f"/message-bus/{client_id}/poll" + ("?dlp=t" if dlp else ""), body, h, version)
