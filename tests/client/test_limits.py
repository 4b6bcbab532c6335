"""Every read of the client is bounded, whatever the server sends: an endless streamed piece, a 1 GiB body, a
500 with a 1 GiB body, a gzip bomb, endless headers. The bounds are counted in bytes the client read (at its
transport) or held (tracemalloc's peak), never in time or RSS; the client closes the connection (the server
sees it hang up), counts the failure and backs off.
"""

from __future__ import annotations

import asyncio
import functools
import gzip
import logging
import tracemalloc
import zlib
from collections.abc import Callable
from typing import Any

import pytest

from shmbus.client import AsyncMessageBusClient, MessageBusClient

from .hostile import Conn, Counting, Hostile
from .recorder import Recorder, wait_until

MakeClient = Callable[..., MessageBusClient]
LIMIT = 64 * 1024
#: what may be read past a limit: one network read (httpcore's 64 KiB) and one inflated piece (64 KiB)
SLACK = 2 * 64 * 1024
GIB = 1 << 30
STREAM = b"Content-Type: text/plain; charset=utf-8\r\nTransfer-Encoding: chunked\r\n"
JSON = b"Content-Type: application/json; charset=utf-8\r\n"
BLOCK = b"a" * 65536


def endless_piece(n: int, conn: Conn) -> None:
    """A streamed answer whose first piece never ends (no separator), up to 1 GiB."""
    if conn.send(b"HTTP/1.1 200 OK\r\n" + STREAM + b"\r\n") and conn.send_chunk(b"[" + BLOCK):
        while conn.sent < GIB and conn.send_chunk(BLOCK):
            pass


def gib_json(n: int, conn: Conn) -> None:
    """A JSON answer that says it is 1 GiB long, and sends it."""
    if conn.send(b"HTTP/1.1 200 OK\r\n" + JSON + b"Content-Length: %d\r\n\r\n[" % GIB):
        while conn.sent < GIB and conn.send(BLOCK):
            pass


def endless_json(n: int, conn: Conn) -> None:
    """A JSON answer with no length, chunked, that never ends."""
    if conn.send(b"HTTP/1.1 200 OK\r\n" + JSON + b"Transfer-Encoding: chunked\r\n\r\n") and conn.send_chunk(b"["):
        while conn.sent < GIB and conn.send_chunk(BLOCK):
            pass


def gib_error(n: int, conn: Conn) -> None:
    """A 500 with a 1 GiB body."""
    if conn.send(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: %d\r\n\r\n" % GIB):
        while conn.sent < GIB and conn.send(BLOCK):
            pass


@functools.cache
def bomb() -> bytes:
    """1 GiB of ``a`` (no separator, no end of JSON), gzipped: about 1 MiB."""
    z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = b"[" + b"a" * ((1 << 20) - 1)
    return b"".join(z.compress(block if i == 0 else BLOCK * 16) for i in range(1024)) + z.flush()


def gzip_bomb(content_type: bytes) -> Callable[[int, Conn], None]:
    def answer(n: int, conn: Conn) -> None:
        body = bomb()
        head = b"HTTP/1.1 200 OK\r\n" + content_type + b"Content-Encoding: gzip\r\nContent-Length: %d\r\n\r\n"
        conn.send(head % len(body)) and conn.send(body)

    return answer


def endless_headers(n: int, conn: Conn) -> None:
    if conn.send(b"HTTP/1.1 200 OK\r\n" + JSON + b"X-Endless: "):
        while conn.sent < 64 << 20 and conn.send(BLOCK):
            pass


CASES = {
    "an endless streamed piece": (endless_piece, "too_large"),
    "a 1 GiB JSON answer": (gib_json, "too_large"),
    "an endless JSON answer": (endless_json, "too_large"),
    "a 500 with a 1 GiB body": (gib_error, "PollFailed"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_body_without_end_is_read_to_the_limit_then_closed(
    make_client: MakeClient, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    answer, outcome = CASES[case]
    counting = Counting()
    with Hostile(answer) as server:
        client = make_client(server.url, max_body_bytes=LIMIT, transport=counting)
        client.subscribe("/a", Recorder())
        wait_until(lambda: client.stats.failures >= 2 and len(server.conns) >= 2, what="two failed polls")
        wait_until(lambda: server.conns[0].hung_up, what="the client to hang up")
        stats = client.stats
        client.stop()
    bound = 4096 if outcome == "PollFailed" else LIMIT
    assert counting.read and max(counting.read) <= bound + SLACK, counting.read
    assert server.conns[0].sent < GIB  # it stopped because the client hung up
    if outcome == "too_large":
        assert stats.too_large >= 2 and "max_body_bytes" in (stats.last_error or ""), stats
        assert any(r.levelno == logging.WARNING and "max_body_bytes" in r.getMessage() for r in caplog.records)
    else:
        assert stats.too_large == 0 and "PollFailed: 500" in (stats.last_error or ""), stats


@pytest.mark.parametrize("content_type", [STREAM.split(b"\r\n")[0] + b"\r\n", JSON], ids=["streamed", "whole"])
def test_a_gzip_bomb_inflates_no_further_than_the_limit(make_client: MakeClient, content_type: bytes) -> None:
    """1 MiB that inflates to 1 GiB: the client holds at most the limit and a few pieces (httpx alone would
    inflate each 64 KiB read to 64 MiB at once)."""
    bomb()
    with Hostile(gzip_bomb(content_type)) as server:
        tracemalloc.start()
        try:
            client = make_client(server.url, max_body_bytes=LIMIT)
            client.subscribe("/a", Recorder())
            wait_until(lambda: client.stats.too_large >= 1, what="the bomb refused")
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        client.stop()
    assert peak < 16 << 20, peak


def test_endless_headers_are_bounded_by_httpx(make_client: MakeClient) -> None:
    """h11 (under httpx) refuses a head over 100 KiB: a failure, the connection closed."""
    with Hostile(endless_headers) as server:
        client = make_client(server.url)
        client.subscribe("/a", Recorder())
        wait_until(lambda: client.stats.failures >= 1 and server.conns[0].hung_up, what="the head refused")
        stats = client.stats
        client.stop()
    assert "RemoteProtocolError" in (stats.last_error or "") and server.conns[0].sent < 64 << 20, stats


def test_the_async_client_is_bounded_too() -> None:
    async def run(url: str, counting: Counting) -> Any:
        async with AsyncMessageBusClient(url, max_body_bytes=LIMIT, transport=counting, min_poll_interval=0.05) as c:
            c.subscribe("/a", lambda m: None)
            while c.stats.too_large < 2:
                await asyncio.sleep(0.02)
            return c.stats

    counting = Counting()
    with Hostile(endless_piece) as server:
        stats = asyncio.run(asyncio.wait_for(run(server.url, counting), 60))
        wait_until(lambda: server.conns[0].hung_up, what="the client to hang up")
    assert stats.failures >= 2 and max(counting.read) <= LIMIT + SLACK, (stats, counting.read)


def test_compressed_answers_are_read(make_client: MakeClient) -> None:
    """gzip and deflate, whole and streamed (each piece flushed as it is sent), under the limit: delivered."""
    msg = b'{"global_id":%d,"message_id":%d,"channel":"/a","data":"%s"}'
    status = b'[{"global_id":-1,"message_id":-1,"channel":"/__status","data":{"/a":0}}]'

    def answer(n: int, conn: Conn) -> None:
        if n == 0:
            body = gzip.compress(status)
            conn.send(b"HTTP/1.1 200 OK\r\n" + JSON + b"Content-Encoding: gzip\r\n")
            conn.send(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        elif n == 1:
            z = zlib.compressobj()
            conn.send(b"HTTP/1.1 200 OK\r\n" + STREAM + b"Content-Encoding: deflate\r\n\r\n")
            for i in (1, 2):
                piece = b"[" + msg % (i, i, b"x" * 1000) + b"]\r\n|\r\n"
                conn.send_chunk(z.compress(piece) + z.flush(zlib.Z_SYNC_FLUSH))
            conn.send_chunk(z.flush())
            conn.send(b"0\r\n\r\n")
        else:
            conn.send(b"HTTP/1.1 200 OK\r\n" + JSON + b"Content-Length: 2\r\nConnection: close\r\n\r\n[]")

    with Hostile(answer) as server:
        client = make_client(server.url, max_body_bytes=LIMIT)
        rec = Recorder()
        client.subscribe("/a", rec, 0)
        rec.wait(2)
        assert client.stats.failures == 0, client.stats
    assert rec.ids == [1, 2] and rec.data == ["x" * 1000] * 2
