"""The built-in HTTP parser (used when httptools is missing): framing, keep-alive, and what it refuses."""

from __future__ import annotations

from typing import Any

import pytest

from shmbus.adapters.server.parser import HttpParserError, HttpRequestParser


class Rec:
    def __init__(self) -> None:
        self.events: list[Any] = []

    def on_message_begin(self) -> None:
        self.events.append("begin")

    def on_url(self, url: bytes) -> None:
        self.events.append(("url", url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self.events.append(("h", name, value))

    def on_headers_complete(self) -> None:
        self.events.append("headers")

    def on_body(self, body: bytes) -> None:
        self.events.append(("body", body))

    def on_message_complete(self) -> None:
        self.events.append("done")


def feed(data: bytes, step: int = 0) -> tuple[Rec, HttpRequestParser]:
    r = Rec()
    p = HttpRequestParser(r)
    if step:
        for i in range(0, len(data), step):
            p.feed_data(data[i : i + step])
    else:
        p.feed_data(data)
    return r, p


def bodies(r: Rec) -> bytes:
    return b"".join(e[1] for e in r.events if isinstance(e, tuple) and e[0] == "body")


@pytest.mark.parametrize("step", [0, 1, 3, 7])
def test_pipelined_requests_split_anywhere(step: int) -> None:
    data = (
        b"POST /a?x=1 HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello"
        b"POST /b HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nT: x\r\n\r\n"
        b"GET /c HTTP/1.0\r\n\r\n"
    )
    r, p = feed(data, step)
    assert r.events.count("done") == 3
    assert [e[1] for e in r.events if isinstance(e, tuple) and e[0] == "url"] == [b"/a?x=1", b"/b", b"/c"]
    assert bodies(r) == b"helloabcde"
    assert (p.get_method(), p.get_http_version(), p.should_keep_alive()) == (b"GET", "1.0", False)


def test_keep_alive_rules() -> None:
    assert feed(b"GET / HTTP/1.1\r\n\r\n")[1].should_keep_alive()
    assert not feed(b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n")[1].should_keep_alive()
    assert feed(b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n")[1].should_keep_alive()


@pytest.mark.parametrize(
    "bad",
    [
        b"GET / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",  # smuggling
        b"GET / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
        b"GET / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
        b"GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
        b"GET / HTTP/1.1\r\nX: a\r\n folded\r\n\r\n",
        b"GET / HTTP/2.0\r\n\r\n",
        b"GET /\r\n\r\n",
        b"GET / HTTP/1.1\r\nBad Name: x\r\n\r\n",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcXX",
    ],
)
def test_refused(bad: bytes) -> None:
    with pytest.raises(HttpParserError):
        feed(bad)


def test_head_size_limit() -> None:
    with pytest.raises(HttpParserError):
        feed(b"GET / HTTP/1.1\r\nX: " + b"a" * 70_000)


def test_message_begin_comes_with_the_first_byte_of_a_head() -> None:
    # as httptools: the server's header_timeout runs from here, so a head trickled forever gets its 408
    r, _ = feed(b"\r\nGET / HTTP/1.1\r\nHo")
    assert r.events == ["begin"]
    r, _ = feed(b"GET /a HTTP/1.1\r\n\r\nG")
    assert r.events == ["begin", ("url", b"/a"), "headers", "done", "begin"]
