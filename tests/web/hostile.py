"""A hostile HTTP client: floods, slowloris, and a corpus of generated malformed requests (stdlib only).

Used by tests/server/test_hostile.py against real servers (the lean gunicorn worker and uvicorn). Everything is
bounded in count and time, and talks to 127.0.0.1 only.
"""

from __future__ import annotations

import random
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import quote


def rss_kb(pid: int) -> int:
    """Anonymous resident memory of ``pid`` (not the shared bus segment it maps)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    raise AssertionError("no RssAnon")


def connect(port: int, timeout: float = 10.0) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def http_get(port: int, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
    """One plain request on a new connection: ``(status, body)``."""
    with connect(port, timeout) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while True:
            piece = s.recv(65536)
            if not piece:
                break
            data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def poll_request(
    client_id: str,
    body: bytes,
    *,
    dlp: bool = True,
    content_type: str = "application/x-www-form-urlencoded",
    extra: str = "",
) -> bytes:
    path = f"/message-bus/{client_id}/poll" + ("?dlp=t" if dlp else "")
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {content_type}\r\nDont-Chunk: true\r\n"
        f"Content-Length: {len(body)}\r\n{extra}\r\n"
    ).encode() + body


def read_statuses(s: socket.socket, deadline: float, quiet: float = 0.5) -> tuple[list[int], bool, bytes]:
    """Read until EOF, ``deadline``, or ``quiet`` seconds without data once a response has arrived (a kept-alive
    connection): the status codes of every response seen, whether EOF came, the raw tail."""
    data = b""
    eof = False
    while time.monotonic() < deadline:
        wait = deadline - time.monotonic()
        if b"HTTP/1." in data:
            wait = min(wait, quiet)
        s.settimeout(max(wait, 0.01))
        try:
            piece = s.recv(65536)
        except TimeoutError:
            break
        except ConnectionResetError:
            eof = True
            data += b"<RESET>"
            break
        if not piece:
            eof = True
            break
        data += piece
    statuses = []
    for line in data.split(b"\r\n"):
        if line.startswith(b"HTTP/1.") and len(line) >= 12 and line[9:12].isdigit():
            statuses.append(int(line[9:12]))
    return statuses, eof, data[-300:]


# ------------------------------------------------------------------ flood
@dataclass
class FloodResult:
    offered: int = 0
    seconds: float = 0.0
    peak_rss_kb: int = 0
    normal_polls_ok: int = 0
    normal_polls_failed: int = 0
    errors: list[str] = field(default_factory=list)


def flood(port: int, pid: int, *, seconds: float = 12.0, max_bytes: int = 1 << 30) -> FloodResult:
    """Park a long poll, then pipeline 60 KB poll requests behind it on the same connection for ``seconds``
    (at most ``max_bytes``), while other connections keep polling. Samples the worker's RSS."""
    res = FloodResult(peak_rss_kb=rss_kb(pid))
    body = b"/flood=0&pad=" + b"p" * 60_000
    one = poll_request("flooder", body, dlp=True)
    s = connect(port)
    s.sendall(poll_request("flooder", b"/flood=0", dlp=False))  # parks: everything after it is pipelined
    time.sleep(0.3)
    s.setblocking(False)
    stop = threading.Event()

    def normal_polls() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            try:
                with connect(port, 10) as c:
                    c.sendall(poll_request(f"normal{i}", b"/flood=0", extra="Connection: close\r\n"))
                    statuses, _, _ = read_statuses(c, time.monotonic() + 10)
                if statuses[:1] == [200]:
                    res.normal_polls_ok += 1
                else:
                    res.normal_polls_failed += 1
            except OSError as exc:
                res.normal_polls_failed += 1
                res.errors.append(repr(exc))
            stop.wait(0.2)

    poller = threading.Thread(target=normal_polls, daemon=True)
    poller.start()
    t0 = time.monotonic()
    view = memoryview(one * 16)  # whole requests: wrapping at its end keeps the stream well-formed
    pos = 0
    try:
        while time.monotonic() - t0 < seconds and res.offered < max_bytes:
            _, writable, _ = select.select([], [s], [], 0.2)
            res.peak_rss_kb = max(res.peak_rss_kb, rss_kb(pid))
            if not writable:
                continue  # the server stopped reading: keep offering until the time is up
            try:
                n = s.send(view[pos:])
            except BlockingIOError:
                continue
            except OSError as exc:
                res.errors.append(f"flood connection: {exc!r}")
                break
            res.offered += n
            pos += n
            if pos == len(view):
                pos = 0
    finally:
        res.seconds = time.monotonic() - t0
        for _ in range(10):  # keep sampling a moment: memory grows while the server parses what it read
            res.peak_rss_kb = max(res.peak_rss_kb, rss_kb(pid))
            time.sleep(0.1)
        stop.set()
        poller.join(15)
        s.close()
    return res


# ------------------------------------------------------------------ slowloris
def slowloris(port: int, n: int, wait: float) -> tuple[list[int], int]:
    """Open ``n`` connections that send half a request head; return the status each got and how many were
    closed by the server within ``wait`` seconds."""
    socks = []
    for i in range(n):
        s = connect(port)
        s.sendall(f"GET /pid?{i} HTTP/1.1\r\nHost: x\r\nX-Slow: ".encode())
        socks.append(s)
    deadline = time.monotonic() + wait
    statuses: dict[int, int] = {}
    closed: set[int] = set()
    data: dict[int, bytes] = {i: b"" for i in range(n)}
    while len(closed) < n and time.monotonic() < deadline:
        open_socks = [s for i, s in enumerate(socks) if i not in closed]
        readable, _, _ = select.select(open_socks, [], [], 0.5)
        for s in readable:
            i = socks.index(s)
            try:
                piece = s.recv(65536)
            except ConnectionResetError:
                piece = b""
            if not piece:
                closed.add(i)
                continue
            data[i] += piece
            if data[i].startswith(b"HTTP/1.1 ") and i not in statuses:
                statuses[i] = int(data[i][9:12])
    for s in socks:
        s.close()
    return [statuses.get(i, 0) for i in range(n)], len(closed)


# ------------------------------------------------------------------ the corpus
@dataclass
class Case:
    name: str
    chunks: list[bytes]  # sent one after another
    half_close: bool = False


def _valid_poll(rng: random.Random) -> bytes:
    return poll_request(f"c{rng.randrange(10**6)}", b"/corpus=0&__seq=1")


def _cases(rng: random.Random) -> Iterator[Case]:
    """An endless stream of hostile requests (one kind after another, parameters drawn from ``rng``)."""
    big = rng.choice([10**18, 2**63, 2**64, 10**30, -1, -(2**63)])
    garbage = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))
    cid = rng.choice(["abc", "x" * 300, "%00", "..%2f..", "é", "a b", "<script>", "-1", "0" * 50])
    kinds: list[Callable[[], Case]] = [
        lambda: Case("garbage", [garbage + b"\r\n\r\n"]),
        lambda: Case("no version", [b"GET /\r\n\r\n"]),
        lambda: Case("bad method", [b"G\x00T / HTTP/1.1\r\nHost: x\r\n\r\n"]),
        lambda: Case("lower method", [b"get /pid HTTP/1.1\r\nHost: x\r\n\r\n"]),
        lambda: Case("http/2.0 line", [b"GET /pid HTTP/2.0\r\nHost: x\r\n\r\n"]),
        lambda: Case("long url", [b"GET /" + b"a" * rng.choice([5000, 70_000, 200_000]) + b" HTTP/1.1\r\n\r\n"]),
        lambda: Case("header no colon", [b"GET /pid HTTP/1.1\r\nHost x\r\n\r\n"]),
        lambda: Case("space before colon", [b"GET /pid HTTP/1.1\r\nHost : x\r\n\r\n"]),
        lambda: Case("obs fold", [b"GET /pid HTTP/1.1\r\nHost: x\r\n  folded\r\n\r\n"]),
        lambda: Case(
            "many headers",
            [b"GET /pid HTTP/1.1\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(rng.choice([100, 2000]))) + b"\r\n"],
        ),
        lambda: Case(
            "huge header", [b"GET /pid HTTP/1.1\r\nX-Big: " + b"b" * rng.choice([9000, 80_000]) + b"\r\n\r\n"]
        ),
        lambda: Case("bare CR", [b"GET /pid HTTP/1.1\rHost: x\r\n\r\n"]),
        lambda: Case("NUL in header", [b"GET /pid HTTP/1.1\r\nX-A: a\x00b\r\n\r\n"]),
        lambda: Case(
            "content-length huge",
            [b"POST /message-bus/a/poll HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % abs(big) + b"x" * 100],
        ),
        lambda: Case(
            "content-length negative", [b"POST /message-bus/a/poll HTTP/1.1\r\nContent-Length: -5\r\n\r\nabc"]
        ),
        lambda: Case("content-length text", [b"POST /echo HTTP/1.1\r\nContent-Length: ten\r\n\r\n"]),
        lambda: Case(
            "conflicting lengths", [b"POST /echo HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 5\r\n\r\nabcde"]
        ),
        lambda: Case(
            "te and cl",
            [b"POST /echo HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"],
        ),
        lambda: Case(
            "chunk size",
            [
                b"POST /message-bus/a/poll HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                + rng.choice([b"ffffffffffffffff", b"-1", b"zz", b"1" * 40, b"8;ext=1"])
                + b"\r\nabc"
            ],
        ),
        lambda: Case(
            "chunk size bridged",
            [
                b"POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                + rng.choice([b"-1", b"zz", b"1" * 40, b"g"])
                + b"\r\nabc\r\n"
            ],
        ),
        lambda: Case(
            "short body, half-close",
            [
                b"POST /message-bus/a/poll HTTP/1.1\r\nContent-Length: 100\r\n"
                b"Content-Type: application/x-www-form-urlencoded\r\n\r\n/a=0"
            ],
            half_close=True,
        ),
        lambda: Case(
            "deep json",
            [
                poll_request(
                    cid, b'{"a":' * rng.choice([100, 5000, 20000]) + b"1" + b"}" * 10, content_type="application/json"
                )
            ],
        ),
        lambda: Case(
            "json not object",
            [
                poll_request(
                    "j",
                    rng.choice([b"[1,2]", b"null", b'"s"', b"1e999", b"{", b'{"/a": [1]}', b'{"/a": {"b": 1}}']),
                    content_type="application/json",
                )
            ],
        ),
        lambda: Case("huge ids", [poll_request("h", f"/a={big}&/b=1e9&/c=NaN&__seq={big}".encode())]),
        lambda: Case("bad percent", [poll_request("p", b"/a%=0&%zz=1&%ff%fe=2&" + garbage.replace(b"\r", b""))]),
        lambda: Case("invalid utf8", [poll_request("u", b"\xff\xfe/a=0")]),
        lambda: Case(
            "many channels", [poll_request("m", "&".join(f"/c{i}=0" for i in range(rng.choice([100, 5000]))).encode())]
        ),
        lambda: Case("weird client id", [poll_request(quote(cid, safe="%"), b"/a=0")]),
        lambda: Case(
            "content type",
            [
                poll_request(
                    "t",
                    b"/a=0",
                    content_type=rng.choice(
                        ["text/plain", "multipart/form-data; boundary=x", "application/json; charset=utf-16", "\x01"]
                    ),
                )
            ],
        ),
        lambda: Case(
            "expect",
            [
                b"POST /message-bus/e/poll HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 4\r\n"
                b"Content-Type: application/x-www-form-urlencoded\r\n\r\n/a=0"
            ],
        ),
        lambda: Case("expect odd", [b"POST /echo HTTP/1.1\r\nExpect: 200-ok\r\nContent-Length: 0\r\n\r\n"]),
        lambda: Case(
            "pipelined mix",
            [
                b"".join(
                    rng.choice(
                        [
                            _valid_poll(rng),
                            b"GET /pid HTTP/1.1\r\nHost: x\r\n\r\n",
                            poll_request("q", b"/a=" + str(big).encode()),
                        ]
                    )
                    for _ in range(rng.randrange(2, 8))
                )
            ],
        ),
        lambda: Case("pipelined then garbage", [_valid_poll(rng) + garbage + b"\r\n\r\n"]),
        lambda: Case("valid, half-close", [_valid_poll(rng)], half_close=True),
        lambda: Case("split bytes", [bytes([b]) for b in _valid_poll(rng)[:60]] + [_valid_poll(rng)[60:]]),
        lambda: Case("upgrade", [b"GET /pid HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n"]),
        lambda: Case("broadcast", [b"POST /message-bus/broadcast HTTP/1.1\r\nContent-Length: 0\r\n\r\n"]),
        lambda: Case("options", [b"OPTIONS /message-bus/a/poll HTTP/1.1\r\nHost: x\r\n\r\n"]),
        lambda: Case("head", [b"HEAD /message-bus/a/poll HTTP/1.1\r\nHost: x\r\n\r\n"]),
        lambda: Case("http/1.0", [b"POST /message-bus/a/poll?dlp=t HTTP/1.0\r\nContent-Length: 4\r\n\r\n/a=0"]),
    ]
    while True:
        yield rng.choice(kinds)()


def generate(n: int, seed: int = 20261124) -> list[Case]:
    rng = random.Random(seed)
    gen = _cases(rng)
    return [next(gen) for _ in range(n)]


@dataclass
class CorpusResult:
    requests: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    server_errors: list[str] = field(default_factory=list)  # a 5xx
    no_response: list[str] = field(default_factory=list)  # closed, reset or silent without a status line


def run_corpus(port: int, cases: list[Case], *, wait: float = 12.0, workers: int = 64) -> CorpusResult:
    """Send every case on its own connection, ``workers`` at a time, and collect what came back.

    A case's time is mostly waiting (for the server to close, or ``read_statuses``' quiet 0.5 s on a kept-alive
    connection, or a 408 after the header timeout), not work: 64 at a time ran the 2,000 cases in 8 s where 16 took
    31 s, and the server (``max_connections`` 10,000 by default) sees more hostile connections at once."""
    res = CorpusResult()
    lock = threading.Lock()

    def one(case: Case) -> None:
        try:
            s = connect(port)
        except OSError as exc:
            with lock:
                res.no_response.append(f"{case.name}: connect {exc!r}")
            return
        try:
            try:
                for chunk in case.chunks:
                    s.sendall(chunk)
                if case.half_close:
                    s.shutdown(socket.SHUT_WR)
            except OSError:
                pass  # the server may answer and close before reading everything: the answer is what counts
            statuses, eof, tail = read_statuses(s, time.monotonic() + wait)
        finally:
            s.close()
        with lock:
            res.requests += 1
            for st in statuses:
                res.statuses[st] = res.statuses.get(st, 0) + 1
            if not statuses:
                res.no_response.append(f"{case.name}: eof={eof} tail={tail!r} sent={case.chunks[0][:120]!r}")
            bad = [st for st in statuses if st >= 500]
            if bad:
                res.server_errors.append(f"{case.name}: {bad} sent={case.chunks[0][:160]!r} tail={tail!r}")

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, cases))
    return res
