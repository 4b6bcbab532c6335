#!/usr/bin/env python3
"""How far one host goes: N concurrent chunked streams, a 1 msg/s broadcast and a 50 msgs/s chat over 1,000 rooms.

Every stream is one browser as ``message-bus-client`` runs it: a chunked poll on the broadcast channel and one
chat room (``/chat/<i mod 1000>``), subscribed at ``-1`` (the server answers with the channels' positions as the
first chunk and keeps the stream). For ``--duration`` seconds two publisher processes post, each over its own
keep-alive connection, one broadcast message per second and 50 chat messages per second to random rooms, through
the app's own ``POST /publish`` route (Nchan: its ``/pub/<channel>`` publisher location): a site-wide notice and
direct messages come from different users' requests. Each message carries the time it was due, so a publisher
that falls behind (a slow answer to its previous publish) counts that wait in the latency. ``--one-publisher`` is
the first design: one process posts both kinds in turn and stamps each message when it sends it; Nchan answers a
broadcast's publish only once it has written it to its subscribers (about 100 ms at 10,000 streams), so the chat
messages due meanwhile wait in the publisher, unstamped, and never meet the broadcast in the server.
Figures, per server:

* delivery latency (due to receipt) p50 / p99 / max, broadcast and chat apart, from sampled streams; how long
  each publish took to be answered;
* server CPU per second and per delivery (every server process, from /proc, from the first publish until the
  last delivery, at most 30 s after the last publish); RSS per stream (every server process's RSS with the
  streams held, minus before);
* every delivery checked: each stream counts its broadcast and chat messages (``bytes.count`` of a marker in the
  message data: no JSON is decoded) and must have exactly what was published to its channels; lost, duplicated,
  refused and dropped streams are counted.

Servers, same clients and same publisher in the same run: shmbus (the ordinary app of ``_http_apps``: the
middleware with user, group, site and header lookups, on ``shmbus.adapters.server.GunicornWorker``, 2 workers);
the message_bus gem (the same app, ``perf/gem_app.ru``, puma with 2 workers, ``max_active_clients`` = N, its
PostgreSQL backend so that both workers see every message); Nchan (nginx 2 workers, ``http-chunked``
subscribers on two channels each). The gem and Nchan are skipped with a loud line when absent.

The load generator is several processes of raw asyncio sockets, each with its own loopback source address
(127.0.0.2, 127.0.0.3, ...: a source address has ~28k ports toward one server port), its file limit raised.
``--knee`` then raises N for shmbus until the broadcast p99 passes 1 s (or streams fail), and prints the largest
N that held. Sizes: ``--quick`` 500 streams for 10 s; default 2,000 streams for 20 s; ``--full`` 20,000 streams
for 60 s and the knee search. The load generator shares the machine's cores with the servers.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import random
import re
import signal
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import _common as c
import _http_load as load
import _scale_servers as servers

from shmbus import Bus
from shmbus.adapters.probe import load as probe_load
from shmbus.adapters.probe import report as probe_report

QUICK_TIMEOUT = 240
FULL_TIMEOUT = 3600
ROOMS = 1000
CHAT_RATE = 50.0
SEP = b"\r\n|\r\n"
HEAD_END = b"\r\n\r\n"
SAMPLE = re.compile(rb"@([BC])\d+:(\d+);")
TICKS = os.sysconf("SC_CLK_TCK")
LOADERS = 4
#: ``--probe``: the shmbus workers write their per-stage histograms here (shmbus.adapters.probe)
PROBE: dict[str, str] = {}


# ---------------------------------------------------------------------------------------------- /proc
def cpu_seconds(pids: Sequence[int]) -> float:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(x) for x in fields[11:15])
    return total / TICKS


def switches(pids: Sequence[int]) -> tuple[int, int]:
    """Context switches of every thread of ``pids``: (voluntary: it slept, involuntary: it was preempted)."""
    vol = invol = 0
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/status", "rb") as f:
                    for line in f:
                        if line.startswith(b"voluntary_ctxt_switches:"):
                            vol += int(line.split()[1])
                        elif line.startswith(b"nonvoluntary_ctxt_switches:"):
                            invol += int(line.split()[1])
            except OSError:
                continue
    return vol, invol


def pin_to_first_cpu(pids: Sequence[int]) -> None:
    """``--pin``: every thread of ``pids`` (the server) on the first CPU; the bench's own processes (load generator,
    publishers) run on the others: a woken load generator then never preempts the server on its CPU."""
    for pid in pids:
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(int(tid), {0})


def rss_kb(pids: Sequence[int]) -> int:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += load.rss_kb(pid)
    return total


# ---------------------------------------------------------------------------------------------- one stream
class Stream(asyncio.Protocol):
    """One browser's stream: parked once its first chunk (message_bus) or response head (Nchan) arrived; then
    counts the broadcast (``@B``) and chat (``@C``) markers of the message data it receives."""

    __slots__ = ("b", "buf", "c", "ended", "index", "lat", "lost", "mark", "parked", "request", "tail", "transport")

    def __init__(
        self, index: int, request: bytes, parked: asyncio.Future[None], mark: bytes, lat: list[Any] | None
    ) -> None:
        self.index = index
        self.request = request
        self.parked: asyncio.Future[None] | None = parked
        self.mark = mark
        self.lat = lat  # sampled: [1 for broadcast / 0 for chat, latency ns] of every message
        self.buf = b""
        self.tail = b""
        self.b = 0
        self.c = 0
        self.lost = False
        self.ended = False
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        if self.parked is not None:
            buf = self.buf + data
            i = buf.find(self.mark)
            if i < 0:
                self.buf = buf
                return
            if not buf.startswith(b"HTTP/1.1 200"):
                self.parked.set_exception(ConnectionError(buf[:200].decode("latin-1")))
                self.parked = None
                return
            self.parked.set_result(None)
            self.parked = None
            data = buf[i + len(self.mark) :]
            self.buf = b""
            if not data:
                return
        both = self.tail + data
        self.b += both.count(b"@B")
        self.c += both.count(b"@C")
        self.tail = data[-1:]
        if data.endswith(b"\r\n0\r\n\r\n") or data == b"0\r\n\r\n":
            self.ended = True
        if self.lat is not None:
            now = time.time_ns()
            buf = self.buf + data
            cut = buf.rfind(b";")
            if cut >= 0:
                self.lat.extend((k == b"B", now - int(t)) for k, t in SAMPLE.findall(buf, 0, cut + 1))
                buf = buf[cut + 1 :]
            self.buf = buf[-200:]

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.parked is not None and not self.parked.done():
            self.parked.set_exception(ConnectionError(f"closed before parking ({exc})"))


def stream_request(kind: str, i: int) -> tuple[bytes, bytes]:
    """The request of stream ``i`` and the bytes that say it is parked."""
    room = i % ROOMS
    if kind == "nchan":
        return b"GET /sub/chat%d HTTP/1.1\r\nHost: 127.0.0.1\r\nTE: chunked\r\n\r\n" % room, HEAD_END
    body = b"%%2Fbcast=-1&%%2Fchat%%2F%d=-1&__seq=1" % room
    return (
        b"POST /message-bus/c%dx%d/poll HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: %d\r\n\r\n%s" % (i, i, len(body), body),
        SEP,
    )


# ---------------------------------------------------------------------------------------------- a loader process
async def hold(
    port: int, kind: str, first: int, count: int, sample_every: int, src: str, ctl: int, out: int, timeout: float
) -> None:
    loop = asyncio.get_running_loop()
    sem = asyncio.Semaphore(300)
    streams: list[Stream] = []
    lat: list[Any] = []
    failed: list[str] = []

    async def one(i: int) -> None:
        req, mark = stream_request(kind, i)
        async with sem:
            for attempt in range(6):
                fut: asyncio.Future[None] = loop.create_future()
                s = Stream(i, req, fut, mark, lat if i % sample_every == 0 else None)
                try:
                    await loop.create_connection(lambda s=s: s, "127.0.0.1", port, local_addr=(src, 0) if src else None)  # type: ignore[misc]
                    await asyncio.wait_for(fut, timeout)
                    streams.append(s)
                    return
                except (OSError, asyncio.TimeoutError) as exc:
                    if s.transport is not None:
                        s.transport.abort()
                    if attempt == 5:
                        failed.append(repr(exc)[:200])
                        return
                    await asyncio.sleep(0.2 * (attempt + 1))

    await asyncio.gather(*(one(i) for i in range(first, first + count)))
    os.write(out, (json.dumps({"parked": len(streams), "failed": len(failed), "why": failed[:3]}) + "\n").encode())
    while (await loop.run_in_executor(None, os.read, ctl, 1)) == b"p":  # progress, until "report"
        os.write(out, (json.dumps({"count": sum(s.b + s.c for s in streams)}) + "\n").encode())
    res = {
        "rooms": [s.index % ROOMS for s in streams],
        "b": [s.b for s in streams],
        "c": [s.c for s in streams],
        "lost": sum(s.lost for s in streams),
        "ended": sum(s.ended for s in streams),
        "lat": lat,
        "failed": len(failed),
    }
    os.write(out, json.dumps(res).encode())
    for s in streams:
        if s.transport is not None:
            s.transport.abort()


def steady_malloc() -> None:
    """Keep the load generator's reads off ``mmap``: asyncio reads into a 256 KiB buffer, above glibc's default
    threshold for mapping a block of its own, and shrinks it to what arrived with ``mremap``, which never raises
    the threshold as a ``free`` would. A loader forked before its parent had freed such a block (the first run of
    an invocation) mapped and faulted in a fresh buffer on every read: 2 page faults per ``recv``, 2-3x the load
    generator's CPU, and that run's latencies doubled, whichever server it measured."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None)
        libc.mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD: blocks up to 1 MiB come from the heap
        libc.mallopt(-1, 64 << 20)  # M_TRIM_THRESHOLD: and the heap keeps its free top for the next read


def loader_main(port: int, kind: str, first: int, count: int, sample: int, src: str, ctl: int, out: int) -> None:
    try:
        steady_malloc()
        load.raise_nofile(count + 500)
        asyncio.run(hold(port, kind, first, count, sample, src, ctl, out, 60.0))
    except BaseException as exc:
        os.write(out, (json.dumps({"error": repr(exc)}) + "\n").encode())
    os._exit(0)


# ---------------------------------------------------------------------------------------------- the publisher
def read_response(sock: socket.socket) -> bytes:
    """One HTTP response with a Content-Length (the publish routes answer so)."""
    data = b""
    while HEAD_END not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("publisher: connection closed")
        data += chunk
    head, _, body = data.partition(HEAD_END)
    m = re.search(rb"(?i)content-length:\s*(\d+)", head)
    need = int(m.group(1)) if m else 0
    while len(body) < need:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("publisher: connection closed")
        body += chunk
    return head


def publisher_main(server: Any, duration: float, seed: int, part: str, go: int, out: int) -> None:
    """Publish ``part`` of the schedule, paced, over one keep-alive connection; report how many went to each
    channel and how long each publish took to be answered.

    ``part`` is ``"broadcast"`` (one per second) or ``"chat"`` (50 per second to random rooms), each run by its own
    process as different users' requests are, and each message stamped with the time it was due: a publisher held
    up by a slow answer does not hide that wait (coordinated omission). ``"both"`` is the first design: one process
    sends the whole schedule in turn and stamps each message when it sends it, so that the chat messages due while
    a server answers a broadcast's publish late are sent, and stamped, only after that answer."""
    try:
        rng = random.Random(seed)
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        events = [(k + 0.5, -1) for k in range(int(duration))] if part != "chat" else []
        if part != "broadcast":
            events += [(j / CHAT_RATE, rng.randrange(ROOMS)) for j in range(int(duration * CHAT_RATE))]
        events.sort()
        rooms = [0] * ROOMS
        bcast = errors = 0
        late = 0.0
        answered: tuple[list[float], list[float]] = ([], [])  # chat, broadcast: publish to answer (s)
        os.read(go, 1)
        t0 = time.monotonic()
        wall0 = time.time_ns() + round((t0 - time.monotonic()) * 1e9)
        for n, (at, room) in enumerate(events):
            delay = t0 + at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                late = max(late, -delay)
            stamp = time.time_ns() if part == "both" else wall0 + round(at * 1e9)
            if room < 0:
                req = server.publish_request("/bcast", f"@B{n}:{stamp};")
            else:
                req = server.publish_request(f"/chat/{room}", f"@C{n}:{stamp};")
            sent = time.monotonic()
            sock.sendall(req)
            head = read_response(sock)
            answered[room < 0].append(time.monotonic() - sent)
            if not head.startswith((b"HTTP/1.1 200", b"HTTP/1.1 201", b"HTTP/1.1 202")):
                errors += 1
                continue
            if room < 0:
                bcast += 1
            else:
                rooms[room] += 1
        res = {
            "bcast": bcast,
            "rooms": rooms,
            "errors": errors,
            "late": late,
            "answer_c": answered[0],
            "answer_b": answered[1],
        }
    except BaseException as exc:
        res = {"error": repr(exc)}
    os.write(out, json.dumps(res).encode())
    os._exit(0)


def kill_children(pids: Sequence[int]) -> None:
    """SIGKILL the bench's forked children (loaders, publishers) and reap them."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def publish(server: Any, duration: float, parts: Sequence[str]) -> dict[str, Any]:
    """Run one publisher process per part at once; their reports merged."""
    go_r, go_w = os.pipe()
    pids: list[int] = []
    outs: list[int] = []
    try:
        for part in parts:
            pub_r, pub_w = os.pipe()
            pids.append(c.fork(publisher_main, server, duration, 27, part, go_r, pub_w))
            os.close(pub_w)
            outs.append(pub_r)
        os.write(go_w, b"g" * len(parts))
        reports = [json.loads(read_all(fd)) for fd in outs]
    finally:
        for fd in (go_r, go_w, *outs):
            os.close(fd)
        kill_children(pids)
    for r in reports:
        if "error" in r:
            raise RuntimeError(f"publisher failed: {r['error']}")
    return {
        "bcast": sum(r["bcast"] for r in reports),
        "rooms": [sum(counts) for counts in zip(*(r["rooms"] for r in reports), strict=True)],
        "errors": sum(r["errors"] for r in reports),
        "late": max(r["late"] for r in reports),
        "answer_c": [a for r in reports for a in r["answer_c"]],
        "answer_b": [a for r in reports for a in r["answer_b"]],
    }


# ---------------------------------------------------------------------------------------------- one run
def read_all(fd: int) -> bytes:
    data = b""
    while chunk := os.read(fd, 1 << 20):
        data += chunk
    return data


def read_line(fd: int, timeout: float) -> bytes:
    import select

    data = b""
    deadline = time.monotonic() + timeout
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise TimeoutError("a loader did not report in time")
        chunk = os.read(fd, 1)
        if not chunk:
            raise RuntimeError("a loader died")
        data += chunk
    return data


def start(kind: str, streams: int, interval: float) -> tuple[Any, Bus | None]:
    if kind == "shmbus":
        bus = Bus(c.unique_name("scale"), keepalive_interval=0, create=True)
        return servers.ShmbusServer(bus.name, streams, interval), bus
    if kind == "gem":
        return servers.GemCluster(streams, interval), None
    return servers.Nchan(streams, interval), None


def run(
    kind: str,
    streams: int,
    duration: float,
    sample_every: int,
    settle: float = 30.0,
    publishers: Sequence[str] = ("broadcast", "chat"),
    pin: bool = False,
) -> dict[str, Any]:
    """Hold ``streams`` streams on server ``kind``, publish for ``duration`` s, check every delivery.

    After the last publish the streams get up to ``settle`` seconds to receive what is still on its way: until
    their total count stops growing for a second (a late message is late, not lost; what never arrives is)."""
    interval = duration + 120  # no stream ends (and re-polls) while we measure
    probe = ""
    if kind == "shmbus" and PROBE:
        probe = os.path.join(tempfile.mkdtemp(prefix="probe-", dir=PROBE["dir"]), "stage")
        os.environ["SHMBUS_PROBE"] = probe  # the workers inherit it
    try:
        server, bus = start(kind, streams, interval)
    finally:
        os.environ.pop("SHMBUS_PROBE", None)
    kids: list[int] = []
    ctls: list[int] = []
    try:
        pids = server.pids()
        if pin:
            pin_to_first_cpu(pids)
        idle_rss = rss_kb(pids)
        outs = []
        loaders = max(2, min(LOADERS, -(-streams // 5000)))
        per = -(-streams // loaders)
        wire = "nchan" if kind == "nchan" else "mb"
        for k in range(loaders):
            out_r, out_w = os.pipe()
            ctl_r, ctl_w = os.pipe()
            first, count = k * per, min(per, streams - k * per)
            src = f"127.0.0.{2 + k}"
            kids.append(c.fork(loader_main, server.port, wire, first, count, sample_every, src, ctl_r, out_w))
            os.close(out_w)
            os.close(ctl_r)
            outs.append(out_r)
            ctls.append(ctl_w)
        t_connect = time.monotonic()
        parked = failed = 0
        why: list[str] = []
        for fd in outs:
            line = json.loads(read_line(fd, 60 + streams / 200))
            if "error" in line:
                raise RuntimeError(f"loader failed: {line['error']}")
            parked += line["parked"]
            failed += line["failed"]
            why += line["why"]
        connect_s = time.monotonic() - t_connect
        if kind == "nchan":
            deadline = time.monotonic() + 10
            while server.subscribers() < parked and time.monotonic() < deadline:
                time.sleep(0.1)
        time.sleep(1.0)
        held_rss = rss_kb(pids)
        probe_before = probe_load(probe) if probe else None  # the connections' part is not the publishing's
        loader_pids = list(kids)
        cpu0 = cpu_seconds(pids)
        lcpu0 = cpu_seconds(loader_pids)
        sw0, lsw0 = switches(pids), switches(loader_pids)
        t0 = time.monotonic()
        pub = publish(server, duration, publishers)
        published_at = time.monotonic()
        last = -1
        while time.monotonic() < published_at + settle:
            time.sleep(1.0)
            total = 0
            for ctl, fd in zip(ctls, outs, strict=True):
                os.write(ctl, b"p")
                total += json.loads(read_line(fd, 30))["count"]
            if total == last:
                break
            last = total
        drain_s = time.monotonic() - published_at - 1.0  # the last second saw nothing new
        cpu1 = cpu_seconds(pids)
        lcpu1 = cpu_seconds(loader_pids)
        sw1, lsw1 = switches(pids), switches(loader_pids)
        wall = time.monotonic() - t0
        for ctl in ctls:
            os.write(ctl, b"r")
        results = [json.loads(read_all(fd)) for fd in outs]
        for r in results:
            if "error" in r:
                raise RuntimeError(f"loader failed: {r['error']}")
        lost = dup = deliveries = 0
        for r in results:
            for room, b, ch in zip(r["rooms"], r["b"], r["c"], strict=True):
                want_b, want_c = pub["bcast"], pub["rooms"][room]
                lost += max(0, want_b - b) + max(0, want_c - ch)
                dup += max(0, b - want_b) + max(0, ch - want_c)
                deliveries += b + ch
        expected = parked * pub["bcast"] + sum(pub["rooms"][room] for r in results for room in r["rooms"])
        lat_b = sorted(ns for r in results for is_b, ns in r["lat"] if is_b)
        lat_c = sorted(ns for r in results for is_b, ns in r["lat"] if not is_b)
        cpu = cpu1 - cpu0

        def pct(v: list[int], p: float) -> float:
            return c.percentile(v, p) / 1e6 if v else float("nan")

        def pct_s(v: list[float], p: float) -> float:
            return c.percentile(sorted(v), p) * 1e3 if v else float("nan")

        if probe:
            time.sleep(1.5)  # the workers write their histograms once a second

        return {
            "probe": probe_report(probe, probe_before) if probe else "",
            "server": kind,
            "streams": streams,
            "parked": parked,
            "failed": streams - parked,
            "why": why[:3],
            "connect_s": connect_s,
            "lost_streams": sum(r["lost"] for r in results),
            "ended_streams": sum(r["ended"] for r in results),
            "published": pub["bcast"] + sum(pub["rooms"]),
            "publish_errors": pub["errors"],
            "publisher_late_s": pub["late"],
            "answer_b_p50": pct_s(pub["answer_b"], 50),
            "answer_b_max": max(pub["answer_b"], default=0.0) * 1e3,
            "answer_c_p99": pct_s(pub["answer_c"], 99),
            "drain_s": drain_s,
            "deliveries": deliveries,
            "expected": expected,
            "lost": lost,
            "duplicated": dup,
            "cpu_s": cpu,
            "wall_s": wall,
            "cpu_per_s": cpu / wall,
            "loader_cpu_per_s": (lcpu1 - lcpu0) / wall,
            "us_per_delivery": cpu * 1e6 / max(deliveries, 1),
            # per 1,000 deliveries: the server's threads preempted, and the load generator's sleeps (each ended by
            # a wake-up that some process's send paid for, often the server's)
            "server_preempted_per_k": (sw1[1] - sw0[1]) * 1e3 / max(deliveries, 1),
            "server_slept_per_k": (sw1[0] - sw0[0]) * 1e3 / max(deliveries, 1),
            "loader_slept_per_k": (lsw1[0] - lsw0[0]) * 1e3 / max(deliveries, 1),
            "rss_kb_per_stream": (held_rss - idle_rss) / max(parked, 1),
            "rss_mb": held_rss / 1024,
            "b_p50": pct(lat_b, 50),
            "b_p99": pct(lat_b, 99),
            "b_max": lat_b[-1] / 1e6 if lat_b else float("nan"),
            "c_p50": pct(lat_c, 50),
            "c_p99": pct(lat_c, 99),
            "c_max": lat_c[-1] / 1e6 if lat_c else float("nan"),
        }
    finally:
        kill_children(kids)
        for ctl in ctls:
            with contextlib.suppress(OSError):
                os.close(ctl)
        server.stop()
        if bus is not None:
            bus.destroy()


# ---------------------------------------------------------------------------------------------- main
def problem(kind: str) -> str:
    if kind == "gem":
        return servers.gem_problem()
    if kind == "nchan":
        return servers.nchan_problem()
    return ""


def describe(r: dict[str, Any]) -> str:
    return (
        f"{r['server']} {r['parked']:,}/{r['streams']:,} streams held (connected in {r['connect_s']:.1f} s), "
        f"{r['deliveries']:,}/{r['expected']:,} deliveries, lost {r['lost']}, duplicated {r['duplicated']}, "
        f"failed streams {r['failed']}, closed {r['lost_streams']}, ended {r['ended_streams']}, "
        f"publish errors {r['publish_errors']} (publisher late by up to {r['publisher_late_s'] * 1e3:.0f} ms, "
        f"all in within {r['drain_s']:.0f} s of the last publish, 1 s resolution; a broadcast's publish answered "
        f"in {r['answer_b_p50']:.1f} ms p50, {r['answer_b_max']:.1f} max, a chat's {r['answer_c_p99']:.1f} p99); "
        f"broadcast p50 {r['b_p50']:.1f} p99 {r['b_p99']:.1f} max {r['b_max']:.1f} ms, chat p50 {r['c_p50']:.1f} "
        f"p99 {r['c_p99']:.1f} max {r['c_max']:.1f} ms; server CPU {r['cpu_per_s']:.2f} s/s (load generator "
        f"{r['loader_cpu_per_s']:.2f} s/s), "
        f"{r['us_per_delivery']:.1f} us/delivery; per 1,000 deliveries the server's threads were preempted "
        f"{r['server_preempted_per_k']:.0f} times and slept {r['server_slept_per_k']:.0f} times, the load "
        f"generator slept {r['loader_slept_per_k']:.0f} times; "
        f"RSS {r['rss_mb']:.0f} MB, {r['rss_kb_per_stream']:.2f} KB/stream"
        + (f"; why: {r['why']}" if r["why"] else "")
        + (f"\nper stage (SHMBUS_PROBE, every worker):\n{r['probe']}" if r.get("probe") else "")
    )


def clean(r: dict[str, Any]) -> bool:
    return not (r["failed"] or r["lost"] or r["duplicated"] or r["lost_streams"] or r["publish_errors"])


def main(argv: Sequence[str] | None = None) -> int:
    def extra(p: Any) -> None:
        p.add_argument("--full", action="store_true", help="20,000 streams for 60 s, then the knee search")
        p.add_argument("--streams", type=int, default=0, help="streams (default 2,000; --quick 500; --full 20,000)")
        p.add_argument("--duration", type=float, default=0, help="seconds of publishing (20; --quick 10; --full 60)")
        p.add_argument("--servers", default="shmbus,gem,nchan", help="comma-separated: shmbus, gem, nchan")
        p.add_argument("--knee", action="store_true", help="search the largest N with broadcast p99 <= 1 s")
        p.add_argument("--knee-max", type=int, default=38000, help="stop the knee search there (file limits)")
        p.add_argument(
            "--pin",
            action="store_true",
            help="the server on the first CPU, the load generator and publishers on the others (a diagnostic)",
        )
        p.add_argument(
            "--one-publisher",
            action="store_true",
            help="the first design: one process publishes broadcasts and chat messages in turn, each stamped when sent",
        )
        p.add_argument(
            "--probe", action="store_true", help="shmbus: where messages waited, per stage (a 10 ms timer per worker)"
        )

    args = c.parse_args(__doc__.split("\n")[0], argv, extra)
    load.exit_on_sigterm()
    load.raise_nofile(20000)
    if args.pin:
        if (os.cpu_count() or 1) < 2:
            raise SystemExit("--pin needs 2 CPUs or more")
        os.sched_setaffinity(0, set(range(1, os.cpu_count() or 2)))  # the loaders and publishers inherit it
    if args.probe:
        PROBE["dir"] = tempfile.mkdtemp(prefix="shmbus-probe-")
    streams = args.streams or (500 if args.quick else 20000 if args.full else 2000)
    duration = args.duration or (10.0 if args.quick else 60.0 if args.full else 20.0)
    report = c.Report("bench_http_scale", f"{streams:,} chunked streams, 1 broadcast/s + 50 chat msgs/s", args)
    kinds = [k for k in args.servers.split(",") if k]
    for kind in list(kinds):
        why = problem(kind)
        if why:
            report.log(f"LOUD SKIP of {kind}: {why}")
            report.note(f"{kind} was not measured: {why}")
            kinds.remove(kind)
    sample_every = max(1, streams // 500)
    publishers = ["both"] if args.one_publisher else ["broadcast", "chat"]
    got: dict[str, list[dict[str, Any]]] = {}
    for _ in range(args.repeats or 1):
        for kind in kinds:
            try:
                r = run(kind, streams, duration, sample_every, publishers=publishers, pin=args.pin)
            except Exception as exc:  # a server that cannot hold the load is a figure, not a crash of the bench
                report.log(f"{kind}: FAILED: {exc!r}")
                report.note(f"{kind} failed at {streams:,} streams: {exc!r}"[:300])
                continue
            report.log(describe(r))
            got.setdefault(kind, []).append(r)
    rows = [
        ("b_p50", "broadcast p50 latency", "ms"),
        ("b_p99", "broadcast p99 latency", "ms"),
        ("b_max", "broadcast max latency", "ms"),
        ("c_p50", "chat p50 latency", "ms"),
        ("c_p99", "chat p99 latency", "ms"),
        ("c_max", "chat max latency", "ms"),
        ("cpu_per_s", "server CPU per second", "s"),
        ("us_per_delivery", "server CPU per delivery", "us"),
        ("server_preempted_per_k", "server threads preempted per 1k deliveries", "n"),
        ("loader_slept_per_k", "load generator sleeps per 1k deliveries", "n"),
        ("rss_kb_per_stream", "server RSS per stream", "KB"),
    ]
    for key, what, unit in rows:
        for kind, rs in got.items():
            base = [f"{o} {what}" for o in ("nchan", "gem") if o != kind and o in got] if kind == "shmbus" else []
            report.add(f"{kind} {what}", [r[key] for r in rs], unit, higher_is_better=False, baselines=base)
    for kind, rs in got.items():
        bad = sum(r["lost"] + r["duplicated"] + r["failed"] + r["lost_streams"] for r in rs)
        report.add(f"{kind} lost + duplicated + failed + closed", [float(bad)], "n", higher_is_better=False)
    if "shmbus" in got:
        med = {k: {key: statistics.median(r[key] for r in rs) for key, _, _ in rows} for k, rs in got.items()}
        s = med["shmbus"]
        bad = sum(r["lost"] + r["duplicated"] + r["failed"] + r["lost_streams"] for r in got["shmbus"])
        report.target(f"shmbus {streams:,} streams: errors + lost", float(bad), 0.0, at_least=False)
        report.target("shmbus broadcast p99", s["b_p99"], 250.0, at_least=False, unit=" ms")
        report.target("shmbus RSS per stream", s["rss_kb_per_stream"], 5.0, at_least=False, unit=" KB")
        if "nchan" in med:
            n = med["nchan"]
            report.target("shmbus / Nchan broadcast p99", s["b_p99"] / n["b_p99"], 1.5, at_least=False, unit="x")
            report.target("shmbus / Nchan chat p99", s["c_p99"] / n["c_p99"], 3.0, at_least=False, unit="x")
            report.target(
                "shmbus / Nchan CPU per delivery", s["us_per_delivery"] / n["us_per_delivery"], 2.0, at_least=False
            )
        if "gem" in med:
            report.target(
                "gem / shmbus CPU per delivery", med["gem"]["us_per_delivery"] / s["us_per_delivery"], 5.0, unit="x"
            )
    if (args.knee or args.full) and "shmbus" in kinds:
        main_run = got.get("shmbus", [None])[0]
        knee(report, streams, args.knee_max, min(duration, 20.0), sample_every, main_run)
    report.note(
        "server CPU = every server process (gunicorn master + 2 workers; puma master + 2 workers; nginx master + 2 "
        "workers) from the first publish to the last delivery (at most 30 s after the last publish; deliveries "
        "that arrive later are counted lost); RSS per stream = (RSS with the streams held - before) / "
        "streams; the load generator and the publisher share the 2 cores with the server; the gem's workers share "
        "its bus through PostgreSQL (its memory backend is per process), whose own CPU is not counted"
    )
    report.emit()
    # shmbus failing, or losing or duplicating a message, is an error (a slow figure never is); the others are figures
    shmbus_bad = "shmbus" in kinds and (
        "shmbus" not in got or any(r["lost"] or r["duplicated"] or r["lost_streams"] for r in got["shmbus"])
    )
    return 1 if shmbus_bad else 0


def knee(
    report: c.Report, start: int, cap: int, duration: float, sample_every: int, first: dict[str, Any] | None = None
) -> None:
    """The largest N where shmbus's broadcast p99 stays <= 1 s with every delivery made: from ``start`` up by
    x1.25 while it holds (``cap``: the 2 workers' file limits), or down by halves while it does not (not below
    1,000), then two bisections of the bracket; each step is a fresh server and fresh clients (``first``: the main
    run's result at ``start``, reused)."""

    def holds(n: int) -> bool:
        if first is not None and n == start:
            return clean(first) and first["b_p99"] <= 1000.0
        try:
            r = run("shmbus", n, duration, max(sample_every, n // 500))
        except Exception as exc:
            report.log(f"knee: {n:,} streams FAILED: {exc!r}")
            return False
        report.log("knee: " + describe(r))
        return clean(r) and r["b_p99"] <= 1000.0

    best, fail, n = 0, 0, start
    if holds(n):
        best = n
        while n < cap:
            n = min(cap, int(n * 1.25))
            if not holds(n):
                fail = n
                break
            best = n
    else:
        fail = n
        while n > 1000 and not best:
            n = max(1000, n // 2)
            if holds(n):
                best = n
            else:
                fail = n
    for _ in range(2):  # narrow the bracket [best, fail) twice
        if not best or not fail or fail - best < 1000:
            break
        n = (best + fail) // 2
        if holds(n):
            best = n
        else:
            fail = n
    report.note(f"knee: the largest N tried with broadcast p99 <= 1 s and every delivery made: {best:,} (cap {cap:,})")
    report.add("shmbus knee: streams with p99 <= 1 s", [float(best)], "streams", higher_is_better=True)


if __name__ == "__main__":
    sys.exit(main())
