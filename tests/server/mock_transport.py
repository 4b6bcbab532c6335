"""In-process doubles for driving the lean server's :class:`HttpConnection` without sockets or sleeping.

The approach is uvicorn's own protocol tests (a mock transport and a mock loop), written for our connection:

* :class:`FakeTransport` records what the connection writes, its ``pause_reading``/``resume_reading`` calls,
  the half-close (``write_eof``), ``close`` and ``abort``; it keeps a write buffer with high/low water marks and
  calls the protocol's ``pause_writing``/``resume_writing`` as asyncio's transports do (the "peer" reads with
  :meth:`FakeTransport.flush`).
* :class:`FakeLoop` is what :class:`~shmbus.adapters.server.Server` takes as its loop: a clock that moves only
  when the test says so (:meth:`FakeLoop.advance` fires the timers that fall due, in order: the server's 1 s
  tick, parked polls' ``long_polling_interval``; :meth:`FakeLoop.turn` fires those due now, as one turn of a
  loop), while tasks and futures go to the real running loop (the ASGI bridge's cycles and ``drain``), so an
  app runs for real and is awaited with :meth:`FakeLoop.settle`.
* :func:`responses` splits what was written into responses (content-length, chunked, or to the end).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import re
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

_DATE = re.compile(rb"date: [^\r]*\r\n")


class FakeTimer:
    """A timer of :class:`FakeLoop` (the part of ``asyncio.TimerHandle`` the server uses)."""

    def __init__(self, when: float, callback: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.when = when
        self.callback = callback
        self.args = args
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeLoop:
    """A loop whose clock the test moves (timers fire only in :meth:`advance`/:meth:`run_due`); tasks and
    futures are the running asyncio loop's."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self._timers: list[tuple[float, int, FakeTimer]] = []
        self._order = itertools.count()
        self.tasks: list[asyncio.Task[Any]] = []

    # ------------------------------------------------------------------ what the server calls
    def time(self) -> float:
        return self.now

    def is_closed(self) -> bool:
        return False

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any) -> FakeTimer:
        timer = FakeTimer(when, callback, args)
        heapq.heappush(self._timers, (when, next(self._order), timer))
        return timer

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> FakeTimer:
        return self.call_at(self.now + delay, callback, *args)

    def call_soon(self, callback: Callable[..., Any], *args: Any) -> FakeTimer:
        return self.call_at(self.now, callback, *args)

    def call_soon_threadsafe(self, callback: Callable[..., Any], *args: Any) -> FakeTimer:
        return self.call_at(self.now, callback, *args)

    def create_task(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.append(task)
        return task

    def create_future(self) -> asyncio.Future[Any]:
        return asyncio.get_running_loop().create_future()

    # ------------------------------------------------------------------ what the test calls
    def pending(self) -> list[FakeTimer]:
        """Timers not yet fired nor cancelled."""
        return [t for _, _, t in sorted(self._timers) if not t.cancelled]

    def run_due(self) -> None:
        """Fire every timer due by now (including ones they schedule for now)."""
        while self._timers and self._timers[0][0] <= self.now:
            _, _, timer = heapq.heappop(self._timers)
            if not timer.cancelled:
                timer.callback(*timer.args)

    def turn(self) -> None:
        """One turn of a loop: fire the timers due now that were scheduled before it (not those they add)."""
        due = []
        while self._timers and self._timers[0][0] <= self.now:
            due.append(heapq.heappop(self._timers))
        for _, _, timer in due:
            if not timer.cancelled:
                timer.callback(*timer.args)

    def advance(self, seconds: float) -> None:
        """Move the clock by ``seconds``, firing due timers at their own times, in order."""
        target = self.now + seconds
        while self._timers and self._timers[0][0] <= target:
            when, _, timer = heapq.heappop(self._timers)
            self.now = max(self.now, when)
            if not timer.cancelled:
                timer.callback(*timer.args)
        self.now = target

    async def settle(self, quiet: int = 10, limit: int = 10_000) -> None:
        """Let the real loop run the tasks (ASGI cycles) until they wait on something: no task created or
        finished for ``quiet`` iterations. Timers due now fire too; the clock does not move."""
        last, still = (-1, -1), 0
        for _ in range(limit):
            self.run_due()
            await asyncio.sleep(0)
            state = (len(self.tasks), sum(t.done() for t in self.tasks))
            still = still + 1 if state == last else 0
            if still >= quiet:
                break
            last = state
        self.run_due()

    async def cancel_tasks(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


class FakeTransport:
    """A transport recording what its protocol does to it; ``auto_flush`` off models a peer that reads slowly."""

    def __init__(
        self,
        loop: FakeLoop,
        *,
        high: int = 64 * 1024,
        low: int = 16 * 1024,
        auto_flush: bool = True,
        half_close: bool = True,
    ) -> None:
        self.loop = loop
        self.protocol: Any = None
        self.out = bytearray()  # everything written, in order
        self._taken = 0
        self.events: list[str] = []  # pause_reading, resume_reading, write_eof, close, abort, pause/resume_writing
        self.reading = True
        self.eof_written = False
        self.closed = False
        self.aborted = False
        self.high, self.low, self.auto_flush = high, low, auto_flush
        self.half_close = half_close  # can_write_eof (false: a transport that cannot shut only its write side)
        self.unsent = 0  # bytes in the write buffer the peer has not read yet
        self.writing_paused = False
        self.writes_while_paused = 0  # writes the protocol made after pause_writing (flow control ignored)

    def connect(self, protocol: Any) -> Any:
        self.protocol = protocol
        protocol.connection_made(self)
        return protocol

    # ------------------------------------------------------------------ asyncio.Transport surface
    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(name, default)

    def write(self, data: bytes) -> None:
        assert not self.eof_written, f"write after write_eof: {bytes(data)[:80]!r}"
        assert not self.closed, f"write after close: {bytes(data)[:80]!r}"
        self.writes_while_paused += self.writing_paused
        self.out += data
        if self.auto_flush:
            return
        self.unsent += len(data)
        if self.unsent > self.high and not self.writing_paused:
            self.writing_paused = True
            self.events.append("pause_writing")
            self.protocol.pause_writing()

    def pause_reading(self) -> None:
        self.events.append("pause_reading")
        self.reading = False

    def resume_reading(self) -> None:
        self.events.append("resume_reading")
        self.reading = True

    def can_write_eof(self) -> bool:
        return self.half_close

    def write_eof(self) -> None:
        self.events.append("write_eof")
        self.eof_written = True

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        if self.closed:
            return
        self.events.append("close")
        self.closed = True
        self.loop.call_soon(self.protocol.connection_lost, None)  # as asyncio does, on the next iteration

    def abort(self) -> None:
        self.events.append("abort")
        self.aborted = True
        self.close()

    # ------------------------------------------------------------------ the peer
    def receive(self, data: bytes) -> None:
        """The peer sent ``data`` (ignored once closed, as a closed socket delivers nothing)."""
        if not self.closed:
            self.protocol.data_received(data)

    def peer_eof(self) -> None:
        """The peer half-closed: asyncio closes the transport unless ``eof_received`` returns true."""
        if not self.closed and not self.protocol.eof_received():
            self.close()

    def flush(self, nbytes: int | None = None) -> None:
        """The peer read ``nbytes`` (all when None): below the low-water mark the protocol may write again."""
        self.unsent = 0 if nbytes is None else max(self.unsent - nbytes, 0)
        if self.writing_paused and self.unsent <= self.low:
            self.writing_paused = False
            self.events.append("resume_writing")
            self.protocol.resume_writing()

    def take(self) -> bytes:
        """Bytes written since the last ``take``."""
        data = bytes(self.out[self._taken :])
        self._taken = len(self.out)
        return data


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes  # de-chunked
    raw: bytes  # as written (head included)


def responses(data: bytes) -> list[Response]:
    """Split ``data`` into complete responses (a body without a length runs to the end)."""
    out: list[Response] = []
    while data:
        head, sep, rest = data.partition(b"\r\n\r\n")
        assert sep, f"incomplete response head: {data[:200]!r}"
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        if status < 200:
            body, used = b"", 0
        elif "content-length" in headers:
            used = int(headers["content-length"])
            assert len(rest) >= used, f"truncated body: {data[:200]!r}"
            body = rest[:used]
        elif headers.get("transfer-encoding") == "chunked":
            body, used = _dechunk(rest)
        else:
            body, used = rest, len(rest)
        out.append(Response(status, headers, body, data[: len(head) + 4 + used]))
        data = rest[used:]
    return out


def _dechunk(data: bytes) -> tuple[bytes, int]:
    pieces, pos = [], 0
    while True:
        end = data.index(b"\r\n", pos)
        n = int(data[pos:end].split(b";")[0], 16)
        pos = end + 2
        if n == 0:
            assert data[pos : pos + 2] == b"\r\n", data
            return b"".join(pieces), pos + 2
        pieces.append(data[pos : pos + n])
        assert data[pos + n : pos + n + 2] == b"\r\n", data
        pos += n + 2


def without_date(data: bytes) -> bytes:
    """``data`` with its Date headers removed (they follow the wall clock)."""
    return _DATE.sub(b"", data)
