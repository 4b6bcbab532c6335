"""The real servers the client is tested against, behind one small interface.

``shmbus`` under gunicorn with the lean worker, gunicorn's UvicornWorker and gthread (tests/web/webapps.py), and
the message_bus gem's own server under puma (``gem_server.ru``, memory backend) where the harness finds the gem.
Each :class:`Target` can publish (shmbus: straight to the shared bus; the gem: its ``/publish`` route) and be
stopped and started again on the same port (the client's URL stays valid).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from shmbus import Bus
from tests import harness
from tests.harness.procs import _gunicorn_argv, free_port, kill_tree, spawn, wait_http
from tests.web.web_servers import GUNICORN_CONFIG, WEB_DIR, app_spec, env_for

CLIENT_DIR = Path(__file__).resolve().parent
GEM_SERVER = CLIENT_DIR / "gem_server.ru"
WORKER_CLASSES = {
    "lean": "shmbus.adapters.server.GunicornWorker",
    "uvicorn": "uvicorn.workers.UvicornWorker",
    "gthread": "gthread",
}
KINDS = [*WORKER_CLASSES, "gem"]
#: the servers' long-poll interval in these tests (seconds)
LONG_POLL = 1.0


@dataclass
class Target:
    """A server of one ``kind`` on ``port``; ``bus`` is the shared bus of a shmbus server (None for the gem)."""

    kind: str
    port: int
    argv: list[str]
    env: dict[str, str]
    bus: Bus | None
    proc: subprocess.Popen[Any] | None = None
    log_path: Path = field(default_factory=lambda: Path(tempfile.mkstemp(prefix="shmbus-client-srv-")[1]))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Target:
        with self.log_path.open("ab") as log:
            self.proc = spawn(self.argv, env=self.env, app_dir=WEB_DIR, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_http(self.url + "/", timeout=30, proc=self.proc)
        except Exception as exc:
            raise RuntimeError(f"{self.kind} did not start: {exc}\n{self.log_path.read_text(errors='replace')}")
        return self

    def stop(self) -> None:
        if self.proc is not None:
            kill_tree(self.proc, 5.0, group_sigterm=False)
            self.proc = None

    def kill(self) -> None:
        """SIGKILL the whole server (no graceful end)."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            kill_tree(self.proc)
            self.proc = None

    def close(self) -> None:
        self.stop()
        with contextlib.suppress(OSError):
            self.log_path.unlink()

    def publish(self, channel: str, data: Any, **targets: Any) -> int:
        """Publish; the message id (on the gem's memory backend message ids are global ids)."""
        if self.bus is not None:
            mid = self.bus.publish(channel, data, **targets)
            assert mid is not None
            return mid
        r = httpx.post(self.url + "/publish", json={"channel": channel, "data": data, **targets}, timeout=10)
        r.raise_for_status()
        return int(r.json())

    def global_id(self, channel: str, message_id: int) -> int:
        if self.bus is None:
            return message_id
        return next(m.global_id for m in self.bus.backlog(channel, message_id - 1) if m.message_id == message_id)


def make_target(kind: str, bus: Bus | None, port: int | None = None, **opts: Any) -> Target:
    """A (not yet started) server of ``kind``; ``opts``: ``long_polling_interval`` (default 1 s),
    ``long_polling_enabled``, ``chunked_encoding_enabled``, ``lookups_from_headers``."""
    port = port or free_port()
    opts.setdefault("long_polling_interval", LONG_POLL)
    if kind == "gem":
        gem_dir = harness.message_bus_gem("the same cases against the three shmbus servers")
        puma = harness.require_binary("puma", "apt-get install puma")
        env = {
            "MESSAGE_BUS_GEM_DIR": str(gem_dir),
            "MB_LONG_POLLING_MS": str(int(opts["long_polling_interval"] * 1000)),
            "MB_LONG_POLLING": "0" if opts.get("long_polling_enabled") is False else "1",
            "MB_CHUNKED": "0" if opts.get("chunked_encoding_enabled") is False else "1",
        }
        argv = [puma, "-b", f"tcp://127.0.0.1:{port}", "-t", "4:64", "--quiet", str(GEM_SERVER)]
        return Target(kind, port, argv, env, None)
    assert bus is not None
    worker = WORKER_CLASSES[kind]
    extra = ("--threads", "16") if kind == "gthread" else ()
    argv = _gunicorn_argv(app_spec(worker), 1, worker, GUNICORN_CONFIG, 5.0, extra)(port)
    return Target(kind, port, argv, env_for(bus.name, **opts), bus)


def shared_bus(name: str) -> Bus:
    """The bus a shmbus server serves, created before it attaches (destroy it at the end)."""
    bus = Bus(name, keepalive_interval=0, create=True)
    bus.last_id("/x")
    return bus
