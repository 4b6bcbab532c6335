"""The RabbitMQ relay's doorbell: its stream consumer (:mod:`.reader`), on a connection of its own."""

from __future__ import annotations

from typing import Protocol

from ..bridge.rows import DoorbellRing
from .connection import AmqpConnection
from .reader import StreamReader

__all__ = ["Opener", "RabbitDoorbell"]


class Opener(Protocol):
    """What the doorbell needs of its backend (:class:`~.backend.RabbitBackend`)."""

    stream: str
    command_timeout: float

    def connect_ready(self) -> AmqpConnection: ...
    def closed_bell(self, bell: RabbitDoorbell) -> None: ...


class RabbitDoorbell:
    """The relay's connection: the stream declared where missing, its consumer started by the first read."""

    def __init__(self, backend: Opener) -> None:
        self.backend = backend
        self.conn = backend.connect_ready()
        try:
            self.reader = StreamReader(self.conn, backend.stream, backend.command_timeout)
        except BaseException:
            self.conn.close(0.1)
            raise

    def ring(self, timeout: float) -> DoorbellRing:
        return self.reader.ring(timeout)

    def keepalive(self) -> None:
        """A round trip, a dead connection raises: the consumer attached again if it delivered nothing since the
        last keepalive (:meth:`.StreamReader.revive`), else a channel opened and closed."""
        if self.reader.revive():
            return
        timeout = self.backend.command_timeout
        self.conn.open_channel(3, timeout)
        self.conn.close_channel(3, timeout)

    def close(self) -> None:
        self.backend.closed_bell(self)
        self.conn.close(0.2)
