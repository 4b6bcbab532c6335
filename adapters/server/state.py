"""The state of one lean-server connection, declared once for the parts that share it (:class:`HttpConnection`,
its parser callbacks and its native message-bus routes): slots keep a parked poll's connection small."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..http import Client
    from .asgi_bridge import Cycle
    from .bus_routes import ParkedKind
    from .request import Request
    from .serve import Server

__all__ = ["ConnectionState"]


class ConnectionState:
    """Every attribute of a connection (set in ``HttpConnection.__init__``)."""

    __slots__ = (
        "buffered",
        "client",
        "closing",
        "cur",
        "cycle",
        "deadline",
        "drain_fut",
        "eof",
        "expires",
        "feeding",
        "head",
        "idle",
        "inbox",
        "kind",
        "linger_until",
        "parser",
        "paused_r",
        "paused_w",
        "phase",
        "pumping",
        "queue",
        "req",
        "srv",
        "timer",
        "transport",
    )

    srv: Server
    transport: Any
    parser: Any
    req: Request | None  # being parsed
    cur: Request | None  # being answered
    queue: list[Request] | None  # parsed, waiting for cur to finish
    client: Client | None  # the parked poll, if any
    kind: ParkedKind | None  # what the parked poll waits to send
    head: bytes | None  # a parked long poll's response head (None: the common one)
    timer: asyncio.TimerHandle | None  # the parked poll's long_polling_interval, when shorter than COARSE_EXPIRY
    expires: float  # when the parked poll ends (loop time; 0: none): the server's 1 s clock ends it
    idle: float  # when the connection became idle (0: busy); the server's clock sweeps idle ones
    cycle: Cycle | None  # the request being answered by the wrapped ASGI app
    drain_fut: asyncio.Future[None] | None
    paused_r: bool
    paused_w: bool
    pumping: bool
    closing: bool
    buffered: int  # body bytes of a bridged request not yet taken by the app
    inbox: bytearray  # pipelined input held (not parsed) while a request is answered
    feeding: bool
    deadline: float  # when the request being read must be complete (0: none); the tick enforces it
    phase: str  # what the deadline waits for
    linger_until: float  # a lingering close ends then at the latest
    eof: bool  # the client half-closed: answer what it sent, then close
