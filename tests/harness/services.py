"""Real Redis and PostgreSQL for tests: use the machine's, or start a private one.

The machine normally runs Redis on 127.0.0.1:6379 and PostgreSQL on 127.0.0.1:5432, but a
fresh machine or CI may not; then the session fixtures start a throw-away server from the
installed binaries (in a temp dir, on a free port, nothing kept on disk) and stop it at the
end.  Only when even the binaries are missing does the test skip (or fail under
SHMBUS_REQUIRE_ALL).  Checks use raw sockets / CLI tools so they work without redis-py or
psycopg installed.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any

from .procs import free_port, kill_tree, proc_stats, spawn

__all__ = [
    "DEFAULT_DATABASE_URL",
    "DEFAULT_REDIS_URL",
    "PostgresServer",
    "RedisServer",
    "find_postgres_bindir",
    "signal_group",
    "postgres_problem",
    "redis_ping",
    "redis_url_problem",
]

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/test"


def redis_ping(host: str = "127.0.0.1", port: int = 6379, timeout: float = 1.0) -> str | None:
    """Send PING over a raw socket; return the first reply line (``"+PONG"``; ``"-NOAUTH ..."``
    still proves a Redis answers) or None if nothing Redis-like answered."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(b"*1\r\n$4\r\nPING\r\n")
            data = b""
            while b"\r\n" not in data:
                chunk = sock.recv(256)
                if not chunk:
                    break
                data += chunk
    except OSError:
        return None
    line = data.split(b"\r\n", 1)[0].decode(errors="replace")
    return line if line[:1] in ("+", "-") else None


def redis_url_problem(url: str, timeout: float = 1.0) -> str | None:
    """None if the Redis at ``url`` answers PING, else what is wrong (unix sockets are trusted)."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme not in ("redis", "rediss"):
        return None
    host, port = parsed.hostname or "127.0.0.1", parsed.port or 6379
    reply = redis_ping(host, port, timeout)
    if reply is None:
        return f"no Redis answers PING at {host}:{port} (from {url})"
    return None


def signal_group(proc: subprocess.Popen[Any] | None, sig: signal.Signals) -> None:
    """Send ``sig`` to ``proc``'s whole process group (a server and every process it forked): SIGSTOP freezes a
    server as a hung machine would, SIGCONT thaws it."""
    if proc is not None and proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)


def crash_group(proc: subprocess.Popen[Any], reap_timeout: float) -> None:
    """Crash a server: SIGKILL to its whole process group (no shutdown work; its files stay), then reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    kill_tree(proc, reap_timeout)


class RedisServer:
    """A private ``redis-server`` on 127.0.0.1:<port> in its own temp dir, nothing saved.

    ``stop()`` shuts it down (SIGTERM), ``kill()`` simulates a crash (SIGKILL), ``start()``
    brings it back on the same port with an empty dataset, ``restart()`` is stop + start.
    ``close()`` stops it for good and removes the temp dir.
    """

    def __init__(self, binary: str, port: int | None = None) -> None:
        self.binary = binary
        self._fixed_port = port is not None
        self.port = port if port is not None else free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="shmbus-redis-"))
        self.proc: subprocess.Popen[Any] | None = None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0`` (stable across stop/start)."""
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self.dir / "redis.log"

    def log(self) -> str:
        """The server's log, for assertion messages."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start (or no-op if running) and wait until it answers PING."""
        if self.running():
            return self
        attempts = 1 if self._fixed_port else 3
        for attempt in range(attempts):
            if attempt:
                self.port = free_port()
            if self._start_once(timeout):
                self._fixed_port = True  # later start()s must reuse this port
                return self
        raise RuntimeError(f"redis-server did not start on port {self.port}:\n{self.log()}")

    def _start_once(self, timeout: float) -> bool:
        argv = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ]
        argv += ["--dir", str(self.dir), "--logfile", str(self.log_path), "--daemonize", "no"]
        self.proc = spawn(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if redis_ping("127.0.0.1", self.port, 0.5) == "+PONG":
                return True
            if self.proc.poll() is not None:
                return False
            time.sleep(0.05)
        kill_tree(self.proc)
        return False

    def stop(self) -> None:
        """Graceful shutdown (SIGTERM, SIGKILL after 10 s); the port is free afterwards."""
        if self.proc is not None:
            kill_tree(self.proc, 10.0)
            self.proc = None

    def kill(self) -> None:
        """Crash it: SIGKILL, no shutdown work."""
        if self.proc is not None:
            crash_group(self.proc, 1.0)
            self.proc = None

    def freeze(self) -> None:
        """SIGSTOP the server: connections stay open, nothing answers (until :meth:`thaw`)."""
        signal_group(self.proc, signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT after :meth:`freeze`."""
        signal_group(self.proc, signal.SIGCONT)

    def restart(self) -> RedisServer:
        """stop() then start() on the same port."""
        self.stop()
        return self.start()

    def close(self) -> None:
        """Stop for good and remove the temp dir."""
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def postgres_problem(url: str, timeout: int = 3) -> str | None:
    """None if PostgreSQL at ``url`` accepts a connection, else what went wrong.

    Uses psycopg (a real login) when installed, else ``pg_isready``.
    """
    try:
        import psycopg
    except ImportError:
        psycopg = None  # type: ignore[assignment]
    if psycopg is not None:
        try:
            psycopg.connect(url, connect_timeout=timeout).close()
            return None
        except Exception as exc:
            return f"cannot connect to {url}: {str(exc).strip()}"
    pg_isready = shutil.which("pg_isready")
    if pg_isready is None:
        return f"cannot check {url}: neither psycopg nor pg_isready is installed"
    res = subprocess.run(
        [pg_isready, "-d", url, "-t", str(timeout)], capture_output=True, text=True, timeout=timeout + 5
    )
    if res.returncode == 0:
        return None
    return f"pg_isready says {url} is not accepting connections: {(res.stdout + res.stderr).strip()}"


def find_postgres_bindir() -> Path | None:
    """Directory with ``initdb`` and ``postgres`` (Debian keeps them off PATH), newest first."""
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"),
        key=lambda p: int(Path(p).parent.name) if Path(p).parent.name.isdigit() else 0,
        reverse=True,
    )
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(str(Path(initdb).parent))
    for cand in candidates:
        if (Path(cand) / "initdb").exists() and (Path(cand) / "postgres").exists():
            return Path(cand)
    return None


class PostgresServer:
    """A private PostgreSQL cluster (trust auth, database ``test``) in a temp dir on a free port.

    PostgreSQL refuses to run as root, so as root the cluster is created and run as the
    ``postgres`` user that Debian's package creates.
    """

    def __init__(self, bindir: Path, **settings: str) -> None:
        self.bindir = bindir
        # fast and throw-away by default; ``synchronous_commit="on"`` makes every commit survive a SIGKILL of the
        # server (fsync=off loses only what the OS had not written, which a killed process does not)
        self.settings = {
            "listen_addresses": "127.0.0.1",
            "fsync": "off",
            "full_page_writes": "off",
            "synchronous_commit": "off",
            **settings,
        }
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="shmbus-pg-"))
        self.proc: subprocess.Popen[Any] | None = None
        self._user: dict[str, Any] = {}
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")  # KeyError: no postgres user, caller reports it
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
            self._user = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/test"

    def log(self) -> str:
        try:
            return (self.dir / "postgres.log").read_text(errors="replace")
        except OSError:
            return ""

    def _argv(self) -> list[str]:
        data = self.dir / "data"
        argv = [str(self.bindir / "postgres"), "-D", str(data), "-p", str(self.port), "-k", str(self.dir)]
        for name, value in self.settings.items():
            argv += ["-c", f"{name}={value}"]
        return argv

    def start(self, timeout: float = 30.0) -> PostgresServer:
        """initdb, start the postmaster as our child, create database ``test``."""
        data = self.dir / "data"
        initdb = [str(self.bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust"]
        res = subprocess.run(
            [*initdb, "--no-sync", "-E", "UTF8", "--locale=C"],
            capture_output=True,
            text=True,
            cwd=self.dir,
            timeout=120,
            **self._user,
        )
        if res.returncode != 0:
            raise RuntimeError(f"initdb failed:\n{res.stdout}\n{res.stderr}")
        log_fh = open(self.dir / "postgres.log", "wb")  # noqa: SIM115 - the child keeps writing to it
        if self._user:
            os.fchown(log_fh.fileno(), self._user["user"], self._user["group"])
        argv = self._argv()
        with log_fh:
            self.proc = spawn(argv, cwd=self.dir, stdout=log_fh, stderr=subprocess.STDOUT, **self._user)
        deadline = time.monotonic() + timeout
        createdb = [
            str(self.bindir / "createdb"),
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-U",
            "postgres",
            "test",
        ]
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"postgres exited with {self.proc.returncode}:\n{self.log()}")
            res = subprocess.run(createdb, capture_output=True, text=True, timeout=30)
            if res.returncode == 0:
                return self
            if time.monotonic() > deadline:
                raise RuntimeError(f"postgres did not come up: {res.stderr}\n{self.log()}")
            time.sleep(0.2)

    def stop(self) -> None:
        """Fast shutdown of the postmaster (SIGINT), keeping the data directory for :meth:`restart`."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            self.proc.wait(timeout=30)

    def processes(self) -> list[int]:
        """The postmaster and every process it started (backends call setsid(): they are not in its group)."""
        if self.proc is None or self.proc.poll() is not None:
            return []
        root = self.proc.pid
        return [root] + [pid for pid, f in proc_stats() if len(f) > 1 and int(f[1]) == root]

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the postmaster and every backend and auxiliary process."""
        for pid in self.processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def kill(self) -> None:
        """Crash the server: SIGKILL to the postmaster and every backend at once (its data directory stays, so
        :meth:`restart` runs crash recovery)."""
        if self.proc is not None:
            self.signal(signal.SIGKILL)
            kill_tree(self.proc, 5.0)
            deadline = time.monotonic() + 10  # orphaned backends exit once they notice (none should be left)
            while self.processes() and time.monotonic() < deadline:
                time.sleep(0.05)

    def freeze(self) -> None:
        """SIGSTOP the postmaster and every backend: connections stay open, nothing answers (until :meth:`thaw`)."""
        self.signal(signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT after :meth:`freeze`."""
        self.signal(signal.SIGCONT)

    def restart(self, timeout: float = 30.0) -> None:
        """Start the postmaster again on the same port and data (after :meth:`stop`); wait until it answers."""
        argv = self._argv()
        with open(self.dir / "postgres.log", "ab") as log_fh:
            self.proc = spawn(argv, cwd=self.dir, stdout=log_fh, stderr=subprocess.STDOUT, **self._user)
        deadline = time.monotonic() + timeout
        probe = [str(self.bindir / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres"]
        while subprocess.run(probe, capture_output=True, timeout=30).returncode != 0:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"postgres did not come back:\n{self.log()}")
            time.sleep(0.1)

    def close(self) -> None:
        """Fast shutdown (SIGINT: disconnect clients), SIGKILL after 15 s; remove the temp dir."""
        if self.proc is not None:
            self.thaw()  # a frozen postmaster would not act on SIGINT
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGINT)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=15)
            kill_tree(self.proc, 2.0)
            self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)
