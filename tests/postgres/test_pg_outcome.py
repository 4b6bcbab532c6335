"""A PostgreSQL publish's outcome (issue 31, items 3, 4 and 7): a connection the server closed while idle
(``pg_terminate_backend``, ``idle_session_timeout``) is replaced before the CALL; an interrupted publish says its
outcome is unknown; health says "stalled" while a publish waits on a frozen server."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

import pytest

from shmbus import Bus, PublishOutcomeUnknown
from tests import harness
from tests.harness.services import PostgresServer
from tests.harness.wait import wait_for

psycopg = harness.require_module("psycopg")

from .pg_util import dsn_for  # noqa: E402

pytestmark = pytest.mark.postgres


def _gone(sql: Any, pid: int) -> bool:
    return not sql.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchall()


@pytest.mark.parametrize("how", ["pg_terminate_backend", "idle_session_timeout"])
def test_a_connection_closed_by_the_server_while_idle_is_replaced(
    make_host: Callable[..., Bus], pg: dict[str, str], sql: Any, how: str
) -> None:
    """The server ends the publisher's idle session between publishes: every publish still succeeds (5 of 10
    failed with idle_session_timeout=1s), single and batched, and none is sent twice."""
    dsn = pg["dsn"]
    if how == "idle_session_timeout":
        dsn = psycopg.conninfo.make_conninfo(dsn, options=f"-c search_path={pg['schema']} -c idle_session_timeout=200")
    a = make_host("a", dsn=dsn, relay=False)
    ids = []
    for i in range(3):
        ids.append(a.publish("/idle", i))
        pid = a.default.backend.conn().info.backend_pid
        if how == "pg_terminate_backend":
            sql.execute("SELECT pg_terminate_backend(%s)", (pid,))
        wait_for(lambda p=pid: _gone(sql, p), timeout=30, what=f"backend {pid} gone")
    ids += a.default.publish_many(a, [("/idle", 3), ("/idle", 4)])
    assert all(isinstance(i, int) for i in ids) and ids == sorted(ids), ids
    rows = sql.execute("SELECT value FROM message_bus WHERE channel = '/idle' ORDER BY id").fetchall()
    assert len(rows) == 5


class Alarm(Exception):
    """What a worker's SIGALRM handler raises (a request timeout)."""


@pytest.mark.parametrize("interrupt", [Alarm, KeyboardInterrupt])
def test_a_publish_interrupted_while_waiting_for_its_reply(
    private_pg: PostgresServer, make_host: Callable[..., Bus], interrupt: type[BaseException]
) -> None:
    """The cluster frozen, so the CALL is sent and its reply cannot come; SIGALRM raises. An ``Exception`` becomes
    PublishOutcomeUnknown naming it (it was "refused the publish: " with an empty reason); KeyboardInterrupt
    propagates. The CALL runs on thaw (the message was stored), and the next publish works on a new connection."""
    dsn = dsn_for(private_pg.url, "public")
    a = make_host("a", dsn=dsn, relay=False, command_timeout=60)
    first = a.publish("/i", "warm")
    previous = signal.getsignal(signal.SIGALRM)

    def handler(signum: int, frame: Any) -> None:
        raise interrupt()

    private_pg.signal(signal.SIGSTOP)
    try:
        signal.signal(signal.SIGALRM, handler)
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(BaseException) as info:
            a.publish("/i", "interrupted")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        private_pg.signal(signal.SIGCONT)
    if interrupt is Alarm:
        exc = info.value
        assert isinstance(exc, PublishOutcomeUnknown), repr(exc)
        assert (exc.channel, exc.backend, exc.sent) == ("/i", "postgres", True)
        assert isinstance(exc.cause, Alarm) and "Alarm" in str(exc)
    else:
        assert type(info.value) is KeyboardInterrupt
    last = a.publish("/i", "next")
    assert isinstance(first, int) and isinstance(last, int) and last > first
    with psycopg.connect(dsn, autocommit=True) as conn:
        wait_for(
            lambda: conn.execute("SELECT count(*) FROM message_bus WHERE channel = '/i'").fetchone()[0] == 3,
            timeout=30,
            what="the interrupted CALL ran on thaw",
        )


def test_health_says_stalled_while_a_publish_waits(private_pg: PostgresServer, make_host: Callable[..., Bus]) -> None:
    """A frozen cluster: health() reported the last outcome ("ok") until command_timeout; now "stalled" once the
    oldest waiting publish passed ``stall_after``, and "ok" again once it returned."""
    a = make_host("a", dsn=dsn_for(private_pg.url, "public"), relay=False, command_timeout=60)
    engine = a.default
    engine.status.calls.stall_after = 0.2
    a.publish("/s", 0)
    got: list[Any] = []
    private_pg.signal(signal.SIGSTOP)
    try:
        t = threading.Thread(target=lambda: got.append(a.publish("/s", 1)))
        t.start()
        wait_for(lambda: engine.health()["state"] == "stalled", timeout=30, what="health says stalled")
        assert engine.health()["calls_waiting"] == 1
    finally:
        private_pg.signal(signal.SIGCONT)
    t.join(60)
    assert len(got) == 1 and isinstance(got[0], int)
    assert engine.health()["state"] == "ok"
