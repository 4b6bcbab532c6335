"""A WebSocket frame over ``max_frame`` is refused with close code 1009 when its length is read, not buffered.

The hostile round sent one 16 MiB frame: uvicorn (16 MiB ``ws_max_size`` by default) read and buffered it all before
the app's 64 KiB check answered with an error frame, and the worker's RSS went from 63 to 472 MB. Now shmbus's
UvicornWorker gives uvicorn the same 64 KiB limit, so the frame is refused from its header alone; and a message
that a more generous server does hand over closes the socket with 1009 too (no more error frame and carry on).
"""

from __future__ import annotations

import base64
import os
import socket
import struct
from pathlib import Path
from typing import Any

from shmbus import Bus

HUGE = 16 << 20
APP_DIR = Path(__file__).resolve().parent


def _handshake(port: int) -> tuple[socket.socket, bytes]:
    """A raw WebSocket connection to /ws: the socket and the bytes read past the 101 response."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=20)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        f"GET /ws HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        assert chunk, f"closed during the handshake: {head!r}"
        head += chunk
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock, head.split(b"\r\n\r\n", 1)[1]


def _frames_until_close(sock: socket.socket, pending: bytes) -> tuple[list[bytes], int]:
    """Read server frames (unmasked) until a close frame: (the text payloads before it, the close code)."""
    buf = bytearray(pending)
    texts: list[bytes] = []

    def need(n: int) -> None:
        while len(buf) < n:
            chunk = sock.recv(65536)
            assert chunk, "connection ended without a close frame"
            buf.extend(chunk)

    while True:
        need(2)
        opcode, length = buf[0] & 0x0F, buf[1] & 0x7F
        start = 2
        if length == 126:
            need(4)
            length, start = struct.unpack(">H", buf[2:4])[0], 4
        elif length == 127:
            need(10)
            length, start = struct.unpack(">Q", buf[2:10])[0], 10
        need(start + length)
        payload = bytes(buf[start : start + length])
        del buf[: start + length]
        if opcode == 0x8:
            return texts, struct.unpack(">H", payload[:2])[0]
        texts.append(payload)


def _send_header_only(sock: socket.socket, length: int) -> None:
    """A masked text frame's header announcing ``length`` bytes, and not one byte of the payload."""
    sock.sendall(bytes([0x81, 0x80 | 127]) + struct.pack(">Q", length) + os.urandom(4))


def test_the_uvicorn_worker_refuses_a_huge_frame_from_its_header(bus: Bus, procs: Any, bus_name: str) -> None:
    srv = procs.gunicorn_server(
        "transport_apps:app",
        workers=1,
        worker_class="shmbus.adapters.server.uvicorn_worker.UvicornWorker",
        env={"SHMBUS_TEST_BUS": bus_name},
        app_dir=APP_DIR,
        health_path="/health",
    )
    sock, pending = _handshake(srv.port)
    with sock:
        while b'"connected"' not in pending:  # the app's hello: the socket is open
            pending += sock.recv(4096)
        _send_header_only(sock, HUGE)
        _, code = _frames_until_close(sock, pending)  # the payload is never sent: the close answers the header
    assert code == 1009


def test_a_message_over_max_frame_that_reaches_the_app_closes_with_1009(bus: Bus, server: Any) -> None:
    srv = server()  # plain uvicorn: its 16 MiB limit hands the app a 70 kB message
    sock, pending = _handshake(srv.port)
    with sock:
        payload = b"x" * 70_000
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        sock.sendall(bytes([0x81, 0x80 | 127]) + struct.pack(">Q", len(payload)) + mask + masked)
        texts, code = _frames_until_close(sock, pending)
    assert code == 1009
    assert b"message too big (70000 > max_frame 65536)" in texts[-1]
