"""The fault suite's NATS JetStream backend: a PRIVATE ``nats-server -js`` per scenario, reached through a TCP proxy
of the test's own (NATS cannot close its clients' connections on request; the proxy can)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from shmbus.adapters.nats import jetstream as js
from shmbus.adapters.nats.client import NatsConnection
from shmbus.adapters.nats.protocol import pub_op
from tests.harness import skip_or_fail
from tests.harness.nats import NATS_HOW, NatsServer, find_nats_server
from tests.harness.tcpproxy import TcpProxy

from .faults_backends import Backend

__all__ = ["NatsBackend", "nats_backend"]


class NatsBackend(Backend):
    kind = "nats"
    timeout_option = "command_timeout"

    def __init__(self, server: NatsServer, stream: str) -> None:
        self.server = server
        self.stream = stream
        self.proxy = TcpProxy("127.0.0.1", server.port)
        self._conn: NatsConnection | None = None

    def spec(self) -> dict[str, Any]:
        return {"kind": "nats", "url": f"nats://127.0.0.1:{self.proxy.port}", "channel": self.stream}

    def conn(self) -> NatsConnection:
        """Our own connection, straight to the server (never through the proxy the scenarios cut)."""
        if self._conn is None or self._conn.closed:
            self._conn = NatsConnection(self.server.url, timeout=10, connect_timeout=5)
        return self._conn

    def api(self, op: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        try:
            return js.api(self.conn(), op, body)
        except OSError:
            self._drop()
            raise

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None

    def crash_and_restart(self) -> bool:
        self._drop()
        self.server.kill()
        self.server.start()  # the file store is on disk: the stream and its messages come back
        return False

    def freeze(self) -> None:
        self.server.freeze()

    def thaw(self) -> None:
        self.server.thaw()

    def wipe(self, restart_ids: bool = False) -> None:
        """The stream deleted: the next publish or relay makes it again, ids start over (another history). A purge
        keeps the history (ids go on, the purged ones are lost): :meth:`purge`."""
        self.api(f"STREAM.DELETE.{self.stream}")

    def purge(self) -> None:
        self.api(f"STREAM.PURGE.{self.stream}")

    def retained(self) -> int:
        info = js.stream_info(self.conn(), self.stream)
        return int(info["state"]["messages"]) if info else 0

    def kill_connections(self) -> int:
        return self.proxy.kill_all()

    def kill_idle_connections(self) -> int:
        return self.proxy.kill_idle()

    def _bells(self) -> list[bytes]:
        """The relays' doorbell subjects, as anyone allowed to list the stream's consumers finds them."""
        listing = self.api(f"CONSUMER.LIST.{self.stream}")
        return [
            c["config"]["deliver_subject"].encode()
            for c in listing.get("consumers") or []
            if c["config"].get("deliver_subject")
        ]

    def ring(self, line: str) -> None:
        conn = self.conn()
        conn.send(b"".join(pub_op(bell, b"", line.encode()) for bell in self._bells()))

    def ring_with_seal(self, line: str, seal: str) -> None:
        conn = self.conn()
        conn.send(
            b"".join(pub_op(bell, b"", line.encode()) + pub_op(bell, b"", seal.encode()) for bell in self._bells())
        )

    def newest_lines(self, count: int) -> list[str]:
        info = js.stream_info(self.conn(), self.stream)
        last = int(info["state"]["last_seq"]) if info else 0
        lines = []
        for seq in range(max(1, last - count + 1), last + 1):
            found = js.get_message(self.conn(), self.stream, seq)
            if found is not None:
                lines.append(f"{seq}|{seq}|{found[1].decode()}")
        return lines

    def close(self) -> None:
        self._drop()
        self.proxy.close()
        with contextlib.suppress(Exception):
            self.server.thaw()


def nats_backend(stream: str) -> Iterator[NatsBackend]:
    """The ``backend`` fixture's NATS case: a private server and its proxy for one scenario."""
    binary = find_nats_server()
    if binary is None:
        skip_or_fail(f"no nats-server binary to start a private NATS ({NATS_HOW})")
    server = NatsServer(binary).start()
    backend = NatsBackend(server, stream)
    try:
        yield backend
    finally:
        backend.close()
        server.close()
