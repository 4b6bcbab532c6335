"""Real NATS JetStream for tests: the machine's (127.0.0.1:4222) or a private ``nats-server -js`` from the binary.

Checks use a raw socket (the server's ``INFO`` line), so they work without any client library.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from .procs import free_port, spawn
from .services import crash_group, signal_group

__all__ = ["DEFAULT_NATS_URL", "NatsServer", "find_nats_server", "nats_jetstream"]

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
NATS_HOW = "apt-get install nats-server"


def find_nats_server() -> str | None:
    """The ``nats-server`` binary (Debian puts it in /usr/sbin, off a user's PATH)."""
    return shutil.which("nats-server") or next(
        (p for p in ("/usr/sbin/nats-server", "/usr/bin/nats-server") if os.access(p, os.X_OK)), None
    )


def nats_jetstream(host: str = "127.0.0.1", port: int = 4222, timeout: float = 1.0) -> bool | None:
    """None: no NATS server answers there; else whether its ``INFO`` says JetStream is on."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            data = b""
            while b"\r\n" not in data:
                chunk = sock.recv(4096)
                if not chunk:
                    return None
                data += chunk
    except OSError:
        return None
    line = data.split(b"\r\n", 1)[0]
    if not line.startswith(b"INFO "):
        return None
    try:
        return bool(json.loads(line[5:]).get("jetstream"))
    except ValueError:
        return None


class NatsServer:
    """A private ``nats-server -js`` on 127.0.0.1:<port>, its JetStream store in a temp dir (kept across
    :meth:`kill` and :meth:`start`, as a crashed server's disk is)."""

    def __init__(self, binary: str, port: int | None = None, max_payload: int | None = None) -> None:
        self.binary = binary
        self.port = port if port is not None else free_port()
        self.max_payload = max_payload
        self.dir = Path(tempfile.mkdtemp(prefix="shmbus-nats-"))
        self.proc: subprocess.Popen[Any] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return (self.dir / "nats.log").read_text(errors="replace")
        return ""

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 15.0) -> NatsServer:
        if self.running():
            return self
        argv = [self.binary, "-js", "-a", "127.0.0.1", "-p", str(self.port), "-sd", str(self.dir / "js")]
        argv += ["-l", str(self.dir / "nats.log")]
        if self.max_payload is not None:
            conf = self.dir / "nats.conf"
            conf.write_text(f"max_payload: {self.max_payload}\n")
            argv += ["-c", str(conf)]
        self.proc = spawn(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if nats_jetstream("127.0.0.1", self.port, 0.5):
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"nats-server did not start on port {self.port}:\n{self.log()}")

    def kill(self) -> None:
        """Crash it: SIGKILL (its store stays on disk)."""
        if self.proc is not None:
            crash_group(self.proc, 1.0)
            self.proc = None

    def freeze(self) -> None:
        signal_group(self.proc, signal.SIGSTOP)

    def thaw(self) -> None:
        signal_group(self.proc, signal.SIGCONT)

    def close(self) -> None:
        self.thaw()
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)
