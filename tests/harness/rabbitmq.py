"""Real RabbitMQ for tests: the machine's (127.0.0.1:5672, guest/guest), or a PRIVATE node started from the
installed binaries for tests that kill, freeze or restart it (never the machine's own).

A private node runs in its own temp dir: its own node name, AMQP port, distribution port, Mnesia and log
directories, crash dump (``ERL_CRASH_DUMP``: a node that dies at boot writes ``erl_crash.dump``, by default into
the current directory, the repository's), and an ``.erlang.cookie`` in its own ``HOME`` (so ``rabbitmqctl``
reaches it and nothing else). Checks use a raw AMQP handshake, so they work without any client library.

A node's first start leaves it as a broker that has run a while (:meth:`RabbitServer.settle_streams`): RabbitMQ
3.10 (Ra 2.2) records its stream coordinator, started by the node's first stream, in a DETS file it writes to disk
only after half a second without access; a node killed before then restarts without its coordinator
(``ra:restart_server`` answers ``name_not_registered``, taken for a first boot), and every stream it had stays
down for good ("home node ... of durable queue ... is down or inaccessible", even to ``queue.delete``). A crash
test on a fresh node would test that RabbitMQ bug, not the bridge (what the bridge does with a stream the broker
does not run is tested by removing that file while the node is down).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .procs import listen_port, spawn
from .services import crash_group

__all__ = ["DEFAULT_AMQP_URL", "RabbitServer", "amqp_problem", "find_rabbitmq_sbin", "private_node", "shared_broker"]

DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"


def amqp_problem(host: str = "127.0.0.1", port: int = 5672, timeout: float = 2.0) -> str | None:
    """None when an AMQP 0-9-1 broker answers the protocol header on ``host:port``; else what is wrong."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(b"AMQP\x00\x00\x09\x01")
            head = sock.recv(7)
    except OSError as exc:
        return f"nothing answers AMQP on {host}:{port} ({exc})"
    if len(head) < 7 or head[0] != 1:  # a connection.start method frame on channel 0
        return f"{host}:{port} does not speak AMQP 0-9-1"
    return None


def find_rabbitmq_sbin() -> Path | None:
    """The directory of the real ``rabbitmq-server`` script (not Debian's wrapper, which switches users)."""
    for path in sorted(glob.glob("/usr/lib/rabbitmq/lib/rabbitmq_server-*/sbin"), reverse=True):
        if os.access(os.path.join(path, "rabbitmq-server"), os.X_OK):
            return Path(path)
    return None


class RabbitServer:
    """A private RabbitMQ node on 127.0.0.1:<port> (see the module doc). ``kill()`` is a crash (SIGKILL of the
    whole node), ``start()`` brings it back on the same port with its data, ``freeze()``/``thaw()`` SIGSTOP and
    SIGCONT it, ``ctl(...)`` runs ``rabbitmqctl`` against it, ``close()`` stops it and removes its directory."""

    def __init__(self, sbin: Path) -> None:
        self.sbin = sbin
        self.port = listen_port()
        self.dist_port = listen_port()
        self.dir = Path(tempfile.mkdtemp(prefix="shmbus-rabbit-"))
        self.node = f"shmbus{self.port}@localhost"
        self.proc: subprocess.Popen[Any] | None = None
        self.started_once = False
        (self.dir / "home").mkdir()
        cookie = self.dir / "home" / ".erlang.cookie"
        cookie.write_text(f"SHMBUS{os.urandom(8).hex().upper()}")
        cookie.chmod(0o400)
        (self.dir / "rabbitmq.conf").write_text("loopback_users = none\ndisk_free_limit.absolute = 1MB\n")
        (self.dir / "enabled_plugins").write_text("[].\n")

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    def env(self) -> dict[str, str]:
        d = self.dir
        return {
            **os.environ,
            "HOME": str(d / "home"),
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(d / "mnesia"),
            "RABBITMQ_LOG_BASE": str(d / "log"),
            "RABBITMQ_LOGS": str(d / "log" / "rabbit.log"),
            "RABBITMQ_CONFIG_FILE": str(d / "rabbitmq.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(d / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(d / "rabbit.pid"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(d / "advanced.config"),
            "ERL_CRASH_DUMP": str(d / "erl_crash.dump"),
        }

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return (self.dir / "log" / "rabbit.log").read_text(errors="replace")[-4000:]
        return ""

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 90.0) -> RabbitServer:
        """Start the node (no-op if running) and wait until it completes an AMQP handshake. A port taken between
        choosing it and the node binding it (other tests pick free ports too) is chosen again: the distribution
        port always, the AMQP port (and the node's name) only before the node first ran. The first start settles
        the node's streams (:meth:`settle_streams`)."""
        if self.running():
            return self
        problem = ""
        for attempt in range(3):
            if attempt:
                self.dist_port = listen_port()
                if not self.started_once:
                    self.port = listen_port()
                    self.node = f"shmbus{self.port}@localhost"
            problem = self._start_once(timeout)
            if not problem:
                first, self.started_once = not self.started_once, True
                if first:
                    self.settle_streams()
                return self
            if "already_used" not in problem and "eaddrinuse" not in problem.lower():
                break
        raise RuntimeError(f"rabbitmq-server did not start on port {self.port}:\n{problem}")

    def _start_once(self, timeout: float) -> str:
        """Start the node once: "" when it answers, else what its logs say."""
        log = open(self.dir / "startup.log", "ab")  # noqa: SIM115 - the node writes it for its whole life
        try:
            self.proc = spawn([str(self.sbin / "rabbitmq-server")], env=self.env(), stdout=log, stderr=log)
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._ready():
                return ""
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        text = (self.dir / "startup.log").read_text(errors="replace")[-3000:]
        self.kill()
        return f"{text}\n{self.log()}"

    def _ready(self) -> bool:
        if amqp_problem("127.0.0.1", self.port, 1.0) is not None:
            return False
        try:
            from shmbus.adapters.rabbitmq.connection import AmqpConnection

            AmqpConnection("127.0.0.1", self.port, "guest", "guest", "/", 3.0).close()
            return True
        except Exception:
            return False

    def settle_streams(self) -> None:
        """Start the node's stream coordinator (a stream declared and deleted) and write its registration to disk
        (see the module doc), so that a crash at any later moment leaves the node's streams recoverable."""
        from shmbus.adapters.rabbitmq.connection import AmqpConnection

        conn = AmqpConnection("127.0.0.1", self.port, "guest", "guest", "/", 30.0)
        try:
            conn.open_channel(1, 30.0)
            conn.declare(1, "shmbus-harness-settle", {"x-queue-type": "stream"}, False, 30.0)
            conn.delete(1, "shmbus-harness-settle", 30.0)
        finally:
            conn.close()
        names = "maps:get(names, ra_system:fetch(coordination))"
        try:
            self.ctl("eval", f"ok = dets:sync(maps:get(directory_rev, {names})).")
        except subprocess.CalledProcessError:  # another Ra: a clean stop closes (writes) every DETS file
            self.ctl("stop")
            if self.proc is not None:
                self.proc.wait(60)
            self.kill()  # reaps it
            problem = self._start_once(90.0)
            if problem:
                raise RuntimeError(f"rabbitmq-server did not start again on port {self.port}:\n{problem}") from None

    def ctl(self, *args: str, timeout: float = 60.0) -> str:
        """``rabbitmqctl -n <node> args...``: its output (raises on failure)."""
        out = subprocess.run(
            [str(self.sbin / "rabbitmqctl"), "-n", self.node, *args],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=True,
        )
        return out.stdout

    def kill(self) -> None:
        """Crash it: SIGKILL to the node's whole process group."""
        if self.proc is not None:
            crash_group(self.proc, 2.0)
            self.proc = None

    def freeze(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGCONT)

    def close(self) -> None:
        self.thaw()
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def shared_broker() -> Iterator[str]:
    """The broker the tests that do not fault it share (each on streams of its own): ``AMQP_URL``, else the
    machine's on 5672, else a private node started from the binaries (a missing one skips loudly). As a
    generator, for a fixture to ``yield from``: a private node is closed after."""
    from tests import harness

    url = os.environ.get("AMQP_URL")
    if url is None and amqp_problem("127.0.0.1", 5672) is None:
        url = DEFAULT_AMQP_URL
    if url is not None:
        parts = urlsplit(url)
        problem = amqp_problem(parts.hostname or "127.0.0.1", parts.port or 5672)
        if problem:
            harness.skip_or_fail(f"RabbitMQ: {problem} (AMQP_URL={url})")
        yield url
        return
    with private_node("no RabbitMQ on 5672 and no rabbitmq-server binaries") as server:
        yield server.url


@contextlib.contextmanager
def private_node(missing: str = "no rabbitmq-server binaries for a private node") -> Iterator[RabbitServer]:
    """A private node from the installed binaries, started, and closed on leaving; without the binaries the test
    skips loudly (fails under ``SHMBUS_REQUIRE_ALL``), saying ``missing``."""
    from tests import harness

    sbin = find_rabbitmq_sbin()
    if sbin is None:
        harness.skip_or_fail(f"{missing} (apt-get install rabbitmq-server)")
    server = RabbitServer(sbin)
    try:
        server.start()
        yield server
    finally:
        server.close()
