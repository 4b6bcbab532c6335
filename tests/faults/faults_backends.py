"""The two backends of the fault suite, behind one small interface the scenarios drive.

A :class:`Backend` is a PRIVATE server the suite started (never the machine's own): it makes engines for hosts
(``spec()`` is the same recipe as plain data, for child processes), and it breaks: crash and restart, freeze,
wipe the history, kill every client connection, ring the notification doorbell with a line of its own.

:func:`make_engine` is the only code child processes import from here (it needs shmbus and the driver, nothing
of the test harness).
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["Backend", "PostgresBackend", "RabbitBackend", "RedisBackend", "make_engine"]


def make_engine(spec: dict[str, Any], **options: Any) -> Any:
    """A bridge engine from ``spec`` (``{"kind": "redis"|"postgres"|"nats"|"rabbitmq", "url", "channel"}``)."""
    options.setdefault("election_interval", 0.05)
    if spec["kind"] == "nats":
        from shmbus.adapters.nats import NatsBridge

        return NatsBridge(spec["url"], stream=spec["channel"], connect_timeout=2, **options)
    if spec["kind"] == "rabbitmq":
        from shmbus.adapters.rabbitmq import RabbitBridge

        return RabbitBridge(spec["url"], stream=spec["channel"], connect_timeout=2, **spec["retention"], **options)
    if spec["kind"] == "redis":
        from shmbus.adapters.redis import RedisBridge

        return RedisBridge(spec["url"], pubsub_channel=spec["channel"], **options)
    from shmbus.adapters.postgres import PostgresBridge

    return PostgresBridge(spec["url"], notify_channel=spec["channel"], connect_timeout=2, **options)


class Backend:
    """What a scenario may do to the backend every host shares."""

    kind = ""
    timeout_option = ""  #: the engine's keyword for how long a command may wait for the server

    def spec(self) -> dict[str, Any]:
        raise NotImplementedError

    def engine(self, **options: Any) -> Any:
        return make_engine(self.spec(), **options)

    def crash_and_restart(self) -> bool:
        """SIGKILL the server and start it again; True when its history is gone (a reset is then justified)."""
        raise NotImplementedError

    def freeze(self) -> None:
        raise NotImplementedError

    def thaw(self) -> None:
        raise NotImplementedError

    def wipe(self, restart_ids: bool = False) -> None:
        """Empty the history under the hosts' feet (FLUSHDB; TRUNCATE, with RESTART IDENTITY when asked: the
        gem's ``reset!``): a real history change."""
        raise NotImplementedError

    def retained(self) -> int:
        """How many messages the backend's global backlog holds now."""
        raise NotImplementedError

    def kill_connections(self) -> int:
        """Close every client connection but our own (the relays' included); how many."""
        raise NotImplementedError

    def kill_idle_connections(self) -> int:
        """Close every idle client connection but our own, and return once the server has closed them all."""
        raise NotImplementedError

    def ring(self, line: str) -> None:
        """Send ``line`` on the notification channel (a PUBLISH; a pg_notify) as any client could."""
        raise NotImplementedError

    def ring_with_seal(self, line: str, seal: str) -> None:
        """Send ``line`` on the notification channel and ``seal`` on the seal channel (``<channel>_shmbus_seals``)
        in one delivery, as the publish code sends a run and its seal, as any client that may notify could."""
        raise NotImplementedError

    def newest_lines(self, count: int) -> list[str]:
        """Up to ``count`` of the newest real lines, as the backend announced them (for stale repeats)."""
        raise NotImplementedError

    def close(self) -> None:
        """Give back what this object opened (the server itself belongs to its fixture)."""


def _envelope(data_json: str) -> str:
    return '{"data":' + data_json + ',"user_ids":null,"group_ids":null,"client_ids":null}'


class RedisBackend(Backend):
    kind = "redis"
    timeout_option = "socket_timeout"

    def __init__(self, server: Any, channel: str) -> None:
        import redis

        self.server = server
        self.channel = channel
        self._redis = redis
        self.client = redis.Redis.from_url(server.url, protocol=2, socket_timeout=5)

    def spec(self) -> dict[str, Any]:
        return {"kind": "redis", "url": self.server.url, "channel": self.channel}

    def crash_and_restart(self) -> bool:
        self.server.kill()
        self.server.start()  # no persistence: it comes back empty
        self.client = self._redis.Redis.from_url(self.server.url, protocol=2, socket_timeout=5)
        return True

    def freeze(self) -> None:
        self.server.freeze()

    def thaw(self) -> None:
        self.server.thaw()

    def wipe(self, restart_ids: bool = False) -> None:
        self.client.flushdb()  # ids restart either way

    def retained(self) -> int:
        return int(self.client.zcard("__mb_global_backlog_n"))

    def kill_connections(self) -> int:
        n = int(self.client.execute_command("CLIENT", "KILL", "TYPE", "pubsub"))
        return n + int(self.client.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"))

    def kill_idle_connections(self) -> int:
        return int(self.client.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"))  # synchronous

    def ring(self, line: str) -> None:
        self.client.publish(self.channel, line)

    def ring_with_seal(self, line: str, seal: str) -> None:
        pipe = self.client.pipeline(transaction=True)
        pipe.publish(self.channel, line)
        pipe.publish(f"{self.channel}_shmbus_seals", seal)
        pipe.execute()

    def newest_lines(self, count: int) -> list[str]:
        lines = []
        for member in self.client.zrange("__mb_global_backlog_n", -count, -1):  # "<channel id>|<channel>"
            mid, _, chan = member.decode().partition("|")
            lines += [raw.decode() for raw in self.client.zrangebyscore(f"__mb_backlog_n_{chan}", mid, mid)]
        return lines

    def close(self) -> None:
        self.client.close()


class PostgresBackend(Backend):
    kind = "postgres"
    timeout_option = "command_timeout"

    def __init__(self, server: Any, schema: str, channel: str) -> None:
        import psycopg

        self.server = server
        self.schema = schema
        self.channel = channel
        self._psycopg = psycopg
        self.dsn = str(psycopg.conninfo.make_conninfo(server.url, options=f"-c search_path={schema}"))
        self._ringer: Any = None

    def spec(self) -> dict[str, Any]:
        return {"kind": "postgres", "url": self.dsn, "channel": self.channel}

    def connect(self) -> Any:
        return self._psycopg.connect(self.dsn, autocommit=True, connect_timeout=5)

    def run(self, statement: str, *params: Any) -> list[tuple[Any, ...]]:
        with self.connect() as conn:
            cur = conn.execute(statement, params or None)
            return list(cur.fetchall()) if cur.description else []

    def crash_and_restart(self) -> bool:
        self.server.kill()
        self.server.restart()  # crash recovery: every committed row is still there
        return False

    def freeze(self) -> None:
        self.server.freeze()

    def thaw(self) -> None:
        self.server.thaw()

    def wipe(self, restart_ids: bool = False) -> None:
        # without RESTART IDENTITY ids go on: only the storage changes (the harder case to notice)
        self.run("TRUNCATE message_bus" + (" RESTART IDENTITY" if restart_ids else ""))

    def retained(self) -> int:
        return int(self.run("SELECT count(*) FROM message_bus")[0][0])

    def kill_connections(self) -> int:
        rows = self.run(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE pid <> pg_backend_pid() AND datname = current_database()"
        )
        return int(rows[0][0])

    def kill_idle_connections(self) -> int:
        import time

        pids = [
            int(r[0])
            for r in self.run(
                "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity "  # in the select list: after WHERE
                "WHERE pid <> pg_backend_pid() AND datname = current_database() AND state = 'idle'"
            )
        ]
        deadline = time.monotonic() + 30
        while pids and time.monotonic() < deadline:  # the backends exit after sending their FATAL
            if not self.run("SELECT 1 FROM pg_stat_activity WHERE pid = ANY(%s)", pids):
                break
            time.sleep(0.01)
        return len(pids)

    def ring(self, line: str) -> None:
        if self._ringer is None or self._ringer.closed:
            self._ringer = self.connect()  # one connection for a storm of notices
        self._ringer.execute("SELECT pg_notify(%s, %s)", (self.channel, line))

    def ring_with_seal(self, line: str, seal: str) -> None:
        if self._ringer is None or self._ringer.closed:
            self._ringer = self.connect()
        statement = "SELECT pg_notify(%s, %s), pg_notify(%s, %s)"  # one transaction: one delivery
        self._ringer.execute(statement, (self.channel, line, f"{self.channel}_shmbus_seals", seal))

    def newest_lines(self, count: int) -> list[str]:
        rows = self.run("SELECT id, channel, value FROM message_bus ORDER BY id DESC LIMIT %s", count)
        return [f"{i}|{i}|{chan}|{value}" for i, chan, value in reversed(rows)]

    def skip_ids(self, count: int) -> list[int]:
        """Take ``count`` ids from the table's sequence that no row will have (as rolled-back inserts leave)."""
        rows = self.run(
            "SELECT nextval(pg_get_serial_sequence('message_bus', 'id')) FROM generate_series(1, %s)", count
        )
        return [int(r[0]) for r in rows]

    def close(self) -> None:
        if self._ringer is not None:
            self._ringer.close()

    def hold_row(self, channel: str, data_json: str) -> tuple[Any, int]:
        """A writer as the gem's (or any SQL client): INSERT a row and keep the transaction open. Returns the
        connection (``commit`` it, then :meth:`ring` the line) and the row's id."""
        conn = self._psycopg.connect(self.dsn, connect_timeout=5)
        row = conn.execute(
            "INSERT INTO message_bus (channel, value) VALUES (%s, %s) RETURNING id", (channel, _envelope(data_json))
        ).fetchone()
        return conn, int(row[0])


class RabbitBackend(Backend):
    """A private RabbitMQ node; the history is one stream (retention: about 650 of the suite's messages)."""

    kind = "rabbitmq"
    timeout_option = "command_timeout"
    retention = {"max_length_bytes": 100_000, "max_segment_size_bytes": 10_000}

    def __init__(self, server: Any, stream: str) -> None:
        self.server = server
        self.stream = stream

    def spec(self) -> dict[str, Any]:
        return {"kind": "rabbitmq", "url": self.server.url, "channel": self.stream, "retention": self.retention}

    def connect(self) -> Any:
        from shmbus.adapters.rabbitmq.connection import AmqpConnection

        return AmqpConnection("127.0.0.1", self.server.port, "guest", "guest", "/", 10)

    def crash_and_restart(self) -> bool:
        self.server.kill()
        self.server.start()  # a stream is on disk: every confirmed message is still there
        return False

    def freeze(self) -> None:
        self.server.freeze()

    def thaw(self) -> None:
        self.server.thaw()

    def wipe(self, restart_ids: bool = False) -> None:
        """Delete the stream (RabbitMQ refuses to purge one): its recreation restarts the offsets at 0."""
        conn = self.connect()
        try:
            conn.open_channel(1, 10)
            conn.delete(1, self.stream, 10)
        finally:
            conn.close()

    def _entries(self, offset: Any, until: Any, limit: int = 100_000) -> list[Any]:
        """The stream's deliveries from ``offset`` while ``until(delivery)`` is false (and that one)."""
        conn = self.connect()
        out: list[Any] = []
        try:
            conn.open_channel(1, 10)
            conn.consume(1, self.stream, "faults", offset, 1000, 10)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and len(out) < limit:
                if not conn.deliveries:
                    conn.pump(0.5)
                    continue
                got, conn.deliveries = conn.deliveries, []
                conn.ack(1, got[-1].tag)
                for d in got:
                    out.append(d)
                    if until(d):
                        return out
        finally:
            conn.close()
        return out

    def _newest_offset(self) -> int:
        return int(self._entries("last", lambda d: False, limit=1)[-1].offset)

    def retained(self) -> int:
        first = self._entries("first", lambda d: True)[0].offset
        return self._newest_offset() - int(first) + 1

    def kill_connections(self) -> int:
        # one rabbitmqctl run (each starts an Erlang VM: about 1 s of CPU) lists and closes them, as
        # list_connections then close_all_connections did in two
        closed = self.server.ctl(
            "eval",
            "Ps = rabbit_networking:connections(), "
            '[rabbit_networking:close_connection(P, "shmbus fault suite") || P <- Ps], length(Ps).',
        )
        return int(closed.strip().splitlines()[-1])

    def kill_idle_connections(self) -> int:
        return self.kill_connections()  # rabbitmqctl closes them before it returns

    def _raw(self, bodies: list[bytes]) -> None:
        from shmbus.adapters.rabbitmq.publisher import StreamPublisher

        conn = self.connect()
        try:
            StreamPublisher(conn, self.stream, 10).send(bodies)
        finally:
            conn.close()

    def ring(self, line: str) -> None:
        """The stream is the notification path: anyone who may write it appends ``line`` as an entry."""
        self._raw([line.encode()])

    def ring_with_seal(self, line: str, seal: str) -> None:
        self._raw([line.encode(), seal.encode()])

    def newest_lines(self, count: int) -> list[str]:
        newest = self._newest_offset()
        entries = self._entries(max(0, newest - 3 * count), lambda d: d.offset >= newest)
        lines = []
        for d in entries:
            chan, sep, envelope = d.body.partition(b"|")
            if sep and chan.startswith(b"/"):
                lines.append(f"{d.offset + 1}|{d.offset + 1}|{chan.decode()}|{envelope.decode()}")
        return lines[-count:]


def forged_line(gid: int, channel: str, text: str) -> str:
    """A line in the gem's format (``gid|id|channel|envelope``) announcing a message no publisher wrote."""
    import json

    return f"{gid}|{gid}|{channel}|{_envelope(json.dumps(text))}"


def line_for(gid: int, channel: str, data_json: str) -> str:
    """The line the gem's publisher sends for a row it committed."""
    return f"{gid}|{gid}|{channel}|{_envelope(data_json)}"
