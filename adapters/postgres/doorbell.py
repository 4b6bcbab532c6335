"""The PostgreSQL relay's doorbell: the LISTEN connection to the gem's notify channel and the seal channel."""

from __future__ import annotations

import select
from typing import Protocol

import psycopg
from psycopg import sql as pgsql

from ..bridge.backend import DoorbellRing
from ..bridge.seals import NO_RING, seal_of
from ..bridge.wire import parse_id, unescape_channel
from . import sql
from .connection import TimedConnection

__all__ = ["NotificationListener", "PostgresDoorbell"]

_NOTICED_MAX = 10_000  # channels named by notices kept for one trim pass (bounds what forged notices can cost)


class NotificationListener(Protocol):
    """What the doorbell needs of its backend (:class:`~.backend.PostgresBackend`)."""

    notify_channel: str
    noticed: set[str]  #: channels named by notices since the last trim pass

    def connect(self) -> TimedConnection: ...
    def check_server(self, conn: psycopg.Connection[object]) -> None: ...
    def read_seal_key(self, conn: psycopg.Connection[object]) -> None: ...


class PostgresDoorbell:
    """The LISTEN connection, to the gem's channel and the seal channel: a notice's id is a hint; the relay reads
    the table unless the line came sealed (the bridge kit's ``seals``).

    The wake-up path is the bridge's cross-host latency, so it waits on the socket itself and takes the notices
    from libpq (one ``poll``, one ``PQconsumeInput``, ``PQnotifies`` until empty) instead of psycopg's
    ``notifies()`` generator (a lock, a generator and a ``Notify`` per notice, each payload decoded and encoded
    again). Notices psycopg reads during a statement on this connection (LISTEN, the keepalive) reach
    ``_pending`` through a notify handler."""

    def __init__(self, backend: NotificationListener) -> None:
        self.backend = backend
        self.conn = backend.connect()
        self.seals = backend.notify_channel + sql.SEAL_SUFFIX
        self._pending: list[psycopg.Notify] = []
        self.conn.add_notify_handler(self._pending.append)
        try:
            backend.check_server(self.conn)  # a standby refuses LISTEN: say read-only, not only "reconnecting"
            self.conn.execute(pgsql.SQL("LISTEN {}").format(pgsql.Identifier(backend.notify_channel)))
            if len(self.seals.encode()) <= 63:  # else the procedures send no seals
                self.conn.execute(pgsql.SQL("LISTEN {}").format(pgsql.Identifier(self.seals)))
            backend.read_seal_key(self.conn)
        except BaseException:
            self.conn.close()
            raise
        self._channel_raw = backend.notify_channel.encode()
        self._seals_raw = self.seals.encode()
        # raw payloads are the text's bytes only when the connection speaks UTF-8 (psycopg's default)
        self._utf8 = self.conn.info.encoding in ("utf-8", "utf8")
        self._poller = select.poll()
        self._poller.register(self.conn.pgconn.socket, select.POLLIN)

    def _notices(self, timeout: float) -> list[tuple[bytes, bytes]]:
        """``(channel, payload)`` of the notices one wait brought (none: ``timeout`` s passed)."""
        if self._pending:
            pending = self._pending[:]
            del self._pending[:]  # the same list: the handler appends to it
            return [(n.channel.encode(), n.payload.encode()) for n in pending]
        if not self._poller.poll(timeout * 1000):
            return []
        pgconn = self.conn.pgconn
        pgconn.consume_input()  # a closed connection raises psycopg.OperationalError here
        out: list[tuple[bytes, bytes]] = []
        n = pgconn.notifies()
        while n is not None:
            out.append((n.relname, n.extra) if self._utf8 else self._recoded(n.relname, n.extra))
            n = pgconn.notifies()
        return out

    def _recoded(self, channel: bytes, payload: bytes) -> tuple[bytes, bytes]:
        enc = self.conn.info.encoding
        return channel.decode(enc).encode(), payload.decode(enc).encode()

    def ring(self, timeout: float) -> DoorbellRing:
        top = 0
        lines: list[bytes] = []
        seals: dict[int, tuple[int, bytes]] = {}
        noticed = self.backend.noticed
        for channel, payload in self._notices(timeout):
            if channel == self._seals_raw:
                seal = seal_of(payload)
                if seal is not None:
                    seals[seal[0]] = seal[1:]
                continue
            if channel != self._channel_raw:
                continue
            lines.append(payload)
            parts = payload.split(b"|", 3)
            gid = parse_id(parts[0])  # anyone may notify: an id as the table writes it, or none
            if gid is None:
                continue  # not one of ours
            top = max(top, gid)
            if len(parts) == 4 and len(noticed) < _NOTICED_MAX:  # a channel to trim: the gem's rule for any
                try:  # try, not contextlib.suppress: this runs per notice, on the wake-up path
                    noticed.add(unescape_channel(parts[2]))
                except UnicodeDecodeError:  # a channel that is not UTF-8
                    continue
        return DoorbellRing(top, lines, seals) if lines or seals else NO_RING

    def keepalive(self) -> None:
        self.conn.execute("SELECT 1")

    def close(self) -> None:
        self.conn.close()
