"""A raw-socket HTTP/1.1 server for answers no real server sends: an endless piece, a 1 GiB body, endless headers,
a gzip bomb. It counts what it wrote and sees the client hang up; and an httpx transport that counts what the
client read of each body.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass
class Conn:
    """One request's connection: ``send`` until it returns False (the client hung up)."""

    sock: socket.socket
    sent: int = 0
    hung_up: bool = False

    def send(self, data: bytes) -> bool:
        try:
            self.sock.sendall(data)
        except OSError:
            self.hung_up = True
            return False
        self.sent += len(data)
        return True

    def send_chunk(self, data: bytes) -> bool:
        """One piece of a ``Transfer-Encoding: chunked`` body."""
        return self.send(b"%x\r\n%s\r\n" % (len(data), data))


class Hostile:
    """``Hostile(answer)``: ``answer(n, conn)`` writes the n-th request's whole answer (status line included); the
    connection is closed after it. ``conns`` in arrival order."""

    def __init__(self, answer: Callable[[int, Conn], None]) -> None:
        self.answer = answer
        self.conns: list[Conn] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.thread = threading.Thread(target=self._accept, name="hostile-server", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            conn = Conn(sock)
            self.conns.append(conn)
            n = len(self.conns) - 1
            threading.Thread(target=self._serve, args=(n, conn), name="hostile-conn", daemon=True).start()

    def _serve(self, n: int, conn: Conn) -> None:
        sock = conn.sock
        sock.settimeout(30)  # a client that stops reading without hanging up does not hold the thread forever
        try:
            head = b""
            while b"\r\n\r\n" not in head:
                data = sock.recv(65536)
                if not data:
                    return
                head += data
            head, _, body = head.partition(b"\r\n\r\n")
            lines = head.lower().split(b"\r\n")
            length = next((int(line.split(b":")[1]) for line in lines if line.startswith(b"content-length")), 0)
            while len(body) < length:
                body += sock.recv(65536)
            self.answer(n, conn)
        except OSError:
            conn.hung_up = True
        finally:
            sock.close()

    def __enter__(self) -> Hostile:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        # close() alone does not wake a thread blocked in accept() on Linux: the thread (and its socket) outlived
        # the test; shutdown() does (accept fails with EINVAL)
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        self.thread.join(5)
        assert not self.thread.is_alive(), "the hostile server's accept thread did not end"
        for c in self.conns:
            c.sock.close()


class Counting(httpx.AsyncBaseTransport):
    """httpx's own transport, counting the body bytes the client took of each response (``read``, in order)."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.read: list[int] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        index = len(self.read)
        self.read.append(0)
        stream: Any = response.stream
        counts = self.read

        class Stream(httpx.AsyncByteStream):
            async def __aiter__(self) -> AsyncIterator[bytes]:
                async for chunk in stream:
                    counts[index] += len(chunk)
                    yield chunk

            async def aclose(self) -> None:
                await stream.aclose()

        return httpx.Response(response.status_code, headers=response.headers, stream=Stream())

    async def aclose(self) -> None:
        await self.inner.aclose()
