"""Per-process server state (:class:`Server`): the wrapped app, the middleware's engine, limits and the clock.

It knows its connections only through :class:`ServerConnection` (the clock and shutdown drive them), so this
module imports none of the connection's parts; :mod:`.serve` makes the connections."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, Protocol

from ..asgi import MessageBusMiddleware
from ..http import MessageBusProtocol, Options
from .lifespan import Lifespan
from .limits import Limits

log = logging.getLogger("shmbus.adapters.server")

#: A connection's ``due`` when it is on no tick of the server's clock.
NEVER = float("inf")
#: The due list's bucket of the connections whose second's tick has passed: the next tick visits them.
_NEXT = 0.0


class ServerConnection(Protocol):
    """What the server needs from a connection: its share of the 1 s clock and the steps of a shutdown."""

    #: The whole second (loop time) whose bucket of the server's clock holds it; :data:`NEVER`: none. Only the
    #: server changes it (:meth:`Server.visit_at`, :meth:`Server.visit_exactly`, :meth:`Server.forget`, a tick).
    due: float

    def tick(self, now: float, idle_cutoff: float) -> None:
        """Parked polls' ends, idle keep-alive, head and body deadlines, lingering closes (called only on the
        tick the connection asked for with :meth:`Server.visit_at`); then it asks for its next deadline."""

    def stop(self) -> None:
        """Shutdown begins: end a parked poll now, close an idle connection."""

    @property
    def responding(self) -> bool:
        """A wrapped app's response is under way (shutdown waits for it, up to its timeout)."""

    def close_now(self) -> None:
        """Shutdown ends: cancel the app's response, if any, and close."""


class Server:
    """Per-process server state: the wrapped app, the middleware and its protocol engine, limits, the clock."""

    def __init__(
        self,
        app: Any,
        loop: asyncio.AbstractEventLoop,
        *,
        options: dict[str, Any] | None = None,
        keepalive: float = 5.0,
        max_requests: int = 0,
        on_max_requests: Callable[[], Any] | None = None,
        limits: Limits | None = None,
    ) -> None:
        self.loop = loop
        self.root_app = app
        mw: MessageBusMiddleware | None = None
        if isinstance(app, MessageBusMiddleware):
            mw = app
            self.app = app.app
        elif options:
            opts = dict(options)
            bus = opts.pop("bus", None)
            if isinstance(bus, str):
                from shmbus import Bus

                bus = Bus(bus, create=True)  # the server is the app: it makes the bus it names
            mw = MessageBusMiddleware(app, bus=bus, **opts)
            self.app = app
        else:
            self.app = app
        self.mw = mw
        self.native = False
        if mw is not None:
            o = mw.options
            lookups = (
                o.user_id_lookup,
                o.group_ids_lookup,
                o.site_id_lookup,
                o.extra_response_headers_lookup,
                o.on_middleware_error,
                o.subscribe_allowed,
            )
            if any(f is not None and _is_async(f) for f in lookups):
                log.warning("shmbus server: async lookups: message-bus requests go through the ASGI bridge")
                self.app = mw  # the middleware's own (coroutine) path for everything
            else:
                self.native = True
            self.options = o
            self.prefix = o.prefix
        else:
            self.options = Options()
            self.prefix = "\x00"
        self._proto: MessageBusProtocol | None = None
        self.keepalive = keepalive
        self.max_requests = max_requests
        self.on_max_requests = on_max_requests
        self.limits = limits or Limits()
        self.connections: set[ServerConnection] = set()
        self.requests = 0
        self.stopping = False
        self.state: dict[str, Any] | None = None
        self._status: dict[int, bytes] = {}
        self.date = b""
        self.now = loop.time()
        self._lifespan: Lifespan | None = None
        self._chunks: dict[int, tuple[bytes, bytes]] = {}
        #: the clock's due list: whole second -> the connections whose earliest deadline falls in it
        self._due: dict[float, set[ServerConnection]] = {}
        self._swept = self.now // 1.0  # the first second the next tick looks at (earlier ones are done)
        self._tick()

    @property
    def proto(self) -> MessageBusProtocol:
        p = self._proto
        if p is None:
            assert self.mw is not None
            p = self._proto = self.mw.protocol()  # this loop's engine (and the bus tap) of the middleware
        return p

    def _tick(self) -> None:
        """Every second: the Date header, the coarse clock, and the connections with a deadline by now (parked
        polls' ends, idle keep-alive, head and body deadlines, lingering closes).

        Why a due list: tens of thousands of parked streams wait 25 s or more with nothing due, and visiting
        each every second cost about 0.3 us a stream. A connection is in the bucket of the whole second its
        earliest deadline falls in (or in :data:`_NEXT`'s, when that second's tick has passed), so no tick that
        finds it due misses it; visited, it asks for its next deadline (one that moved later is found not due
        and asked for again)."""
        self.date = b"date: %s\r\n" % formatdate(usegmt=True).encode()
        self.now = now = self.loop.time()
        cutoff = now - self.keepalive
        first, last = self._swept, now // 1.0
        if last >= first:
            self._swept = last + 1.0  # a connection asking during this tick waits for the next one
        due = self._due
        if due:
            conns = due.pop(_NEXT, None)
            if conns:
                self._visit(conns, now, cutoff)
            if last - first < 64:
                second = first
                while second <= last:
                    conns = due.pop(second, None)
                    if conns:
                        self._visit(conns, now, cutoff)
                    second += 1.0
            else:  # the loop stalled for a while: the seconds that have connections
                for second in sorted(s for s in due if first <= s <= last):
                    conns = due.pop(second, None)
                    if conns:
                        self._visit(conns, now, cutoff)
        if not self.loop.is_closed():
            self.loop.call_at(now + 1.0, self._tick)

    @staticmethod
    def _visit(conns: set[ServerConnection], now: float, cutoff: float) -> None:
        for conn in conns:
            conn.due = NEVER
            conn.tick(now, cutoff)

    def visit_at(self, conn: ServerConnection, when: float) -> None:
        """Have the tick visit ``conn`` by ``when`` (loop time), unless it will visit it by then anyway."""
        second = when // 1.0
        if second < self._swept:
            second = _NEXT  # its second's tick has passed: the next tick
        old = conn.due
        if second >= old:
            return
        if old != NEVER:
            self._drop(conn, old)
        conn.due = second
        conns = self._due.get(second)
        if conns is None:
            self._due[second] = {conn}
        else:
            conns.add(conn)

    def visit_exactly(self, conn: ServerConnection, when: float) -> None:
        """Like :meth:`visit_at`, also when ``when`` is later than the visit asked for before (0: no visit)."""
        second = when // 1.0 if when else NEVER
        if second < self._swept:
            second = _NEXT
        old = conn.due
        if second == old:
            return
        if old != NEVER:
            self._drop(conn, old)
        conn.due = NEVER
        if second != NEVER:
            self.visit_at(conn, when)

    def forget(self, conn: ServerConnection) -> None:
        """``conn`` closed: off the clock (nothing of a closed connection stays in the due list)."""
        old = conn.due
        if old != NEVER:
            conn.due = NEVER
            self._drop(conn, old)

    def _drop(self, conn: ServerConnection, second: float) -> None:
        conns = self._due.get(second)
        if conns is not None:
            conns.discard(conn)
            if not conns:
                del self._due[second]

    def status_line(self, code: int) -> bytes:
        b = self._status.get(code)
        if b is None:
            try:
                phrase = HTTPStatus(code).phrase
            except ValueError:
                phrase = "Unknown"
            b = self._status[code] = b"HTTP/1.1 %d %s\r\n" % (code, phrase.encode())
        return b

    def error_response(self, status: int, reason: str) -> bytes:
        """A whole plain-text error response that closes the connection."""
        body = reason.encode()
        return b"%scontent-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\nconnection: close\r\n%s\r\n%s" % (
            self.status_line(status),
            len(body),
            self.date,
            body,
        )

    @staticmethod
    def lookup(fn: Callable[..., Any] | None, *args: Any) -> Any:
        if fn is None:
            return None
        v = fn(*args)
        if inspect.isawaitable(v):
            if inspect.iscoroutine(v):
                v.close()
            raise TypeError("a lookup returned an awaitable on the native path (declare it 'async def')")
        return v

    def http_chunk(self, piece: bytes) -> bytes:
        """``piece`` framed as one HTTP/1.1 chunk. The registry hands every client of a visibility class the
        same bytes object, so the framing is made once per class and batch and reused by identity (the newest
        pieces, keyed by ``id``; each entry holds its piece, so an id is never reused while it is cached)."""
        framed = self._chunks.get(id(piece))
        if framed is None or framed[0] is not piece:
            if len(self._chunks) >= 64:
                self._chunks.clear()
            framed = self._chunks[id(piece)] = (piece, b"%x\r\n%s\r\n" % (len(piece), piece))
        return framed[1]

    # ------------------------------------------------------------------ lifecycle
    async def startup(self) -> None:
        """Run the app's lifespan startup (if it speaks lifespan) and create this loop's protocol engine."""
        if self.mw is not None and self.native:
            _ = self.proto
        if self.root_app is not None:
            self._lifespan = Lifespan(self.root_app)
            self.state = await self._lifespan.startup()

    async def shutdown(self, timeout: float = 5.0) -> None:
        """Graceful: end parked polls now (clients re-poll elsewhere), close idle connections, wait for
        in-flight ASGI responses up to ``timeout`` seconds, then close everything."""
        self.stopping = True
        for conn in list(self.connections):
            conn.stop()
        deadline = time.monotonic() + timeout
        while any(c.responding for c in self.connections) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for conn in list(self.connections):
            conn.close_now()
        if self._lifespan is not None:
            await self._lifespan.shutdown()
        await asyncio.sleep(0)


def _is_async(fn: Any) -> bool:
    call = type(fn).__call__ if not inspect.isfunction(fn) and not inspect.ismethod(fn) else None
    return inspect.iscoroutinefunction(fn) or (call is not None and inspect.iscoroutinefunction(call))
