"""A keep-alive HTTP/1.1 client over one raw socket: send exact bytes, read responses one by one."""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field
from urllib.parse import urlencode


@dataclass
class Resp:
    status: int
    headers: dict[str, str]
    body: bytes
    raw: bytes = b""  # the body as on the wire (chunk framing included)
    head: bytes = b""
    chunks: list[bytes] = field(default_factory=list)


class Conn:
    def __init__(self, port: int, timeout: float = 15.0, rcvbuf: int | None = None) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout)
        self.sock.connect(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.timeout = timeout
        self.eof = False

    def send(self, data: bytes) -> Conn:
        self.sock.sendall(data)
        return self

    def _fill(self, deadline: float) -> None:
        if self.eof:
            raise EOFError(f"connection closed; buffered {self.buf[:300]!r}")
        self.sock.settimeout(max(deadline - time.monotonic(), 0.01))
        try:
            data = self.sock.recv(1 << 16)
        except TimeoutError:
            raise AssertionError(f"timed out; buffered {self.buf[:500]!r}") from None
        if not data:
            self.eof = True
            raise EOFError(f"connection closed; buffered {self.buf[:300]!r}")
        self.buf += data

    def read_exact(self, n: int, deadline: float) -> bytes:
        while len(self.buf) < n:
            self._fill(deadline)
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def read_line(self, deadline: float) -> bytes:
        while b"\r\n" not in self.buf:
            self._fill(deadline)
        line, _, self.buf = self.buf.partition(b"\r\n")
        return line

    def read_head(self, timeout: float | None = None) -> tuple[int, dict[str, str], bytes]:
        deadline = time.monotonic() + (timeout or self.timeout)
        while b"\r\n\r\n" not in self.buf:
            self._fill(deadline)
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        return int(lines[0].split()[1]), headers, head

    def read_response(self, timeout: float | None = None, head_request: bool = False) -> Resp:
        deadline = time.monotonic() + (timeout or self.timeout)
        status, headers, head = self.read_head(timeout)
        if status == 100:
            return Resp(status, headers, b"", head=head)
        if head_request or status in (204, 304):
            return Resp(status, headers, b"", head=head)
        if "content-length" in headers:
            body = self.read_exact(int(headers["content-length"]), deadline)
            return Resp(status, headers, body, body, head)
        if headers.get("transfer-encoding") == "chunked":
            raw = b""
            chunks = []
            while True:
                line = self.read_line(deadline)
                n = int(line.split(b";")[0], 16)
                data = self.read_exact(n + 2, deadline)
                raw += line + b"\r\n" + data
                if n == 0:
                    return Resp(status, headers, b"".join(chunks), raw, head, chunks)
                chunks.append(data[:-2])
        body = b""
        while True:  # delimited by the close
            try:
                self._fill(deadline)
            except EOFError:
                body, self.buf = self.buf, b""
                return Resp(status, headers, body, body, head)

    def read_until(self, needle: bytes, timeout: float | None = None) -> bytes:
        deadline = time.monotonic() + (timeout or self.timeout)
        while needle not in self.buf:
            self._fill(deadline)
        return self.buf

    def closed_by_peer(self, timeout: float = 10.0) -> bool:
        """True once the server closed (EOF or reset) within ``timeout``; buffered data is discarded."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self._fill(deadline)
            except EOFError:
                return True
            except ConnectionResetError:
                return True
            except AssertionError:
                return False
            self.buf = b""
        return False

    def close(self) -> None:
        self.sock.close()


def request(
    method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None, version: str = "1.1"
) -> bytes:
    h = {"Host": "127.0.0.1", **(headers or {})}
    if (body or method == "POST") and "Transfer-Encoding" not in h:
        h.setdefault("Content-Length", str(len(body)))
    return (f"{method} {path} HTTP/{version}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items()) + "\r\n").encode(
        "latin-1"
    ) + body


def poll(
    client_id: str,
    channels: dict[str, object],
    *,
    chunk: bool = False,
    dlp: bool = False,
    seq: int = 1,
    version: str = "1.1",
    headers: dict[str, str] | None = None,
) -> bytes:
    data = {**channels, "__seq": seq}
    h = {"Content-Type": "application/x-www-form-urlencoded", **(headers or {})}
    if not chunk:
        h["Dont-Chunk"] = "true"
    return request(
        "POST", f"/message-bus/{client_id}/poll" + ("?dlp=t" if dlp else ""), urlencode(data).encode(), h, version
    )


def wire_chunk(payload: bytes) -> bytes:
    """The HTTP chunk carrying one streamed piece (the size counts the 5 separator bytes)."""
    return b"%x\r\n%s\r\n|\r\n\r\n" % (len(payload) + 5, payload)
