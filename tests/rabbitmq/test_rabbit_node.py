"""A private RabbitMQ node crashed and restarted (issue 36): the harness's node keeps its streams whenever it is
killed, writes its crash dumps into its own directory, and the bridge says clearly what a stream RabbitMQ does not
run means, retries, and carries on without loss or reset once RabbitMQ runs it again."""

from __future__ import annotations

import shutil
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from shmbus import Bus
from shmbus.adapters.rabbitmq import RabbitBridge, RabbitUnavailable
from shmbus.adapters.rabbitmq.connection import AmqpConnection, Closed
from tests import harness
from tests.harness.rabbitmq import RabbitServer, find_rabbitmq_sbin
from tests.harness.wait import wait_for

pytestmark = pytest.mark.slow


def _declare(server: RabbitServer, stream: str, passive: bool) -> None:
    conn = AmqpConnection("127.0.0.1", server.port, "guest", "guest", "/", 30)
    try:
        conn.open_channel(1, 30)
        conn.declare(1, stream, {} if passive else {"x-queue-type": "stream"}, passive, 30)
    finally:
        conn.close()


def _running(server: RabbitServer, stream: str) -> bool:
    try:
        _declare(server, stream, passive=True)
        return True
    except Closed as exc:  # not running (404), or not yet (541: its leader is not known yet, RabbitMQ 3.10)
        assert exc.code in (404, 541), exc
        return False


def test_a_stream_declared_just_before_a_crash_comes_back(rabbit_server: RabbitServer) -> None:
    """The node's first stream, then kill -9 at once: RabbitMQ 3.10 on a fresh node would lose it for good (its
    stream coordinator not yet on disk: every declare answers "home node ... is down or inaccessible"); the
    harness's node is started as one that ran a while, so the stream comes back as it does on any broker."""
    _declare(rabbit_server, "s_first", passive=False)
    rabbit_server.kill()
    rabbit_server.start()
    wait_for(lambda: _running(rabbit_server, "s_first"), 60, "the stream running again after the restart")


def test_a_node_that_dies_at_boot_leaves_its_crash_dump_in_its_own_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node whose distribution port is taken dies at boot with an ``erl_crash.dump``: in the node's directory,
    never the current one (one landed in the repository's root)."""
    sbin = find_rabbitmq_sbin()
    if sbin is None:
        harness.skip_or_fail("no rabbitmq-server binaries for a private node (apt-get install rabbitmq-server)")
    monkeypatch.chdir(tmp_path)
    server = RabbitServer(sbin)
    taken = socket.socket()
    try:
        taken.bind(("127.0.0.1", server.dist_port))
        taken.listen()
        server.start()  # the first try dies; the next one gets another distribution port
        assert (server.dir / "erl_crash.dump").exists(), list(server.dir.iterdir())
        assert not list(tmp_path.iterdir())
    finally:
        taken.close()
        server.close()


def test_a_stream_rabbitmq_does_not_run_is_a_clear_error_until_it_runs_again(
    rabbit_server: RabbitServer, bus_name: str
) -> None:
    """The broker restarts without running the bus's stream (as RabbitMQ 3.10 does when its stream coordinator's
    registration was not on disk: forced here by removing it), then restarts running it again. Meanwhile a publish
    raises RabbitUnavailable saying what the broker's 404 means, health says so, nothing is acknowledged, and the
    relays keep retrying; afterwards every host gets everything confirmed, without a reset."""
    url, stream = rabbit_server.url, f"s_{bus_name}"
    hosts: list[Bus] = []

    def host(suffix: str) -> Bus:
        engine = RabbitBridge(url, stream=stream, election_interval=0.05, connect_timeout=2, command_timeout=3)
        hosts.append(Bus(f"{bus_name}{suffix}", keepalive_interval=0, engine=engine, create=True))
        return hosts[-1]

    def got(bus: Bus) -> list[object]:
        return [m.data for m in bus.backlog("/c")]

    try:
        a, b = host("a"), host("b")
        epochs = (a.segment.read_epoch(), b.segment.read_epoch())
        sent = [a.publish("/c", f"before {i}") and f"before {i}" for i in range(5)]
        wait_for(lambda: got(b) == sent, 30, "b has what a published")

        registry = Path(rabbit_server.dir, "mnesia", rabbit_server.node, "coordination", rabbit_server.node)
        rabbit_server.kill()
        shutil.move(registry / "names.dets", registry.parent / "names.dets.saved")
        rabbit_server.start()
        with pytest.raises(RabbitUnavailable, match="exists but RabbitMQ does not run it") as refused:
            a.publish("/c", "while down")
        assert stream in str(refused.value)
        health = a.health()["engine_health"]
        assert health["state"] == "error" and "does not run it" in health["error"], health
        wait_for(lambda: b.health()["engine_health"]["relay_state"] == "reconnecting", 30, "b's relay retrying")

        rabbit_server.kill()
        shutil.move(registry.parent / "names.dets.saved", registry / "names.dets")
        rabbit_server.start()
        publish_again: Callable[[], object] = lambda: _publish_when_running(a, "after")  # noqa: E731
        wait_for(publish_again, 60, "a publish once RabbitMQ runs the stream again", interval=0.2)
        sent.append("after")
        wait_for(lambda: got(a) == sent and got(b) == sent, 30, "every host has everything confirmed")
        assert (a.segment.read_epoch(), b.segment.read_epoch()) == epochs  # the same history: no reset
        assert a.health()["engine_health"]["state"] == "ok"
    finally:
        for bus in hosts:
            bus.destroy()


def _publish_when_running(bus: Bus, data: str) -> bool:
    """Publish once the stream runs: meanwhile a definite refusal (RabbitMQ restarting the stream answers a few
    ways: not running, no replica here yet, 541 while its leader is not known), never an unknown outcome."""
    try:
        bus.publish("/c", data)
        return True
    except RabbitUnavailable:
        return False
