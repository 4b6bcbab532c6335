"""Real child processes for tests: Python snippets, gunicorn and uvicorn servers.

Every child starts in its own session (``start_new_session=True``), so its pid is also its
process-group id and killing the group also kills whatever it forked (gunicorn workers,
grandchildren of a snippet).  Every child is recorded in ``_REGISTRY`` so a session-end
fixture can kill stragglers that a test forgot; the ``procs`` fixture (``ProcessTracker``)
kills its own children at the end of each test.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from subprocess import STDOUT
from typing import Any

_REPO_ROOT = Path(__file__).resolve().parents[2]

__all__ = [
    "ProcessTracker",
    "Server",
    "free_port",
    "listen_port",
    "group_alive",
    "gunicorn_server",
    "kill_tree",
    "kill_stragglers",
    "spawn",
    "spawn_python",
    "uvicorn_server",
    "wait_http",
    "wait_port",
]

# env overlays (None removes a variable) and path arguments, as the helpers accept them.
Env = Mapping[str, str | None]
PathArg = str | os.PathLike[str]

# Every Popen the harness started; kill_stragglers() empties it at session end.
_REGISTRY: list[subprocess.Popen[Any]] = []

# urllib honours http_proxy; a loopback probe must never go through a proxy.
_NO_PROXY_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that was free a moment ago (the kernel picks it, so xdist workers differ)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def listen_port(host: str = "127.0.0.1") -> int:
    """A TCP port free now, BELOW the kernel's ephemeral range, for a server that must bind it seconds later, or
    again after a restart. A port of :func:`free_port` is in that range, where every outgoing connection takes its
    local port: on a machine making thousands of connections (other tests' clients, a bridge reconnecting to the
    very server that is down) one takes it before the server binds it (RabbitMQ's ``dist_port_already_used``,
    ``eaddrinuse``). Below it only a server binding that number on purpose competes."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(max(1024, low - 12000), low) if low > 2048 else 0
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    return free_port(host)


def _exited_message(proc: subprocess.Popen[Any] | None, what: str) -> str | None:
    """Describe ``proc`` if it already exited, so a wait can fail fast instead of timing out."""
    if proc is None or proc.poll() is None:
        return None
    return f"{what}: process {proc.pid} ({_argv_str(proc)}) exited with code {proc.returncode}"


def _argv_str(proc: subprocess.Popen[Any]) -> str:
    args = proc.args
    text = " ".join(str(a) for a in args) if isinstance(args, (list, tuple)) else str(args)
    return text if len(text) < 300 else text[:297] + "..."


def wait_port(
    port: int,
    timeout: float = 10.0,
    host: str = "127.0.0.1",
    proc: subprocess.Popen[Any] | None = None,
) -> None:
    """Wait until ``host:port`` accepts a TCP connection; raise TimeoutError (or RuntimeError
    at once if ``proc`` exits meanwhile, since then nothing will ever listen)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError as exc:
            last = exc
        msg = _exited_message(proc, f"waiting for {host}:{port}")
        if msg:
            raise RuntimeError(msg)
        if time.monotonic() >= deadline:
            raise TimeoutError(f"nothing accepted connections on {host}:{port} within {timeout}s ({last})")
        time.sleep(0.05)


def wait_http(url: str, timeout: float = 10.0, proc: subprocess.Popen[Any] | None = None) -> int:
    """Wait until ``url`` answers with any HTTP status (a 404 still proves the server is up);
    return that status.  Raise TimeoutError, or RuntimeError at once if ``proc`` exits."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with _NO_PROXY_OPENER.open(url, timeout=2.0) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except (urllib.error.URLError, OSError) as exc:
            last: Exception = exc
        msg = _exited_message(proc, f"waiting for {url}")
        if msg:
            raise RuntimeError(msg)
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{url} did not answer within {timeout}s ({last})")
        time.sleep(0.05)


def _child_env(env: Env | None, app_dir: PathArg | None = None) -> dict[str, str]:
    """os.environ overlaid with ``env`` (a None value removes a variable), plus ``app_dir`` and the repo root on
    PYTHONPATH so ``module:app`` specs written to a tmp dir are importable and import ``tests.*`` helpers."""
    merged = dict(os.environ)
    for key, value in (env or {}).items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    # app_dir first (``module:app`` specs), then the repo root so that apps import test helpers as ``tests.x``
    parts = [str(app_dir)] if app_dir is not None else []
    parts += [str(_REPO_ROOT)] + [p for p in merged.get("PYTHONPATH", "").split(os.pathsep) if p]
    merged["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(parts))
    merged.setdefault("PYTHONUNBUFFERED", "1")
    return merged


def spawn(
    argv: Sequence[PathArg],
    *,
    env: Env | None = None,
    app_dir: PathArg | None = None,
    **popen_kwargs: Any,
) -> subprocess.Popen[Any]:
    """Start ``argv`` in a new session (own process group) and register it for cleanup.

    ``env`` is merged into os.environ (None removes a key); ``app_dir`` is prepended to
    PYTHONPATH.  Other keyword arguments go to Popen unchanged (stdout/stderr are inherited
    unless given).
    """
    popen_kwargs.setdefault("start_new_session", True)
    popen_kwargs.setdefault("stdin", subprocess.DEVNULL)
    cmd = [str(a) for a in argv]
    proc: subprocess.Popen[Any] = subprocess.Popen(cmd, env=_child_env(env, app_dir), **popen_kwargs)
    _REGISTRY.append(proc)
    return proc


def spawn_python(
    code: str,
    *args: str,
    env: Env | None = None,
    **popen_kwargs: Any,
) -> subprocess.Popen[Any]:
    """Run ``sys.executable -c code *args`` as a real child process (own process group).

    stdout and stderr default to text pipes so the test can read what the child printed; pass
    ``stdout=subprocess.DEVNULL`` (or a file) for chatty long-lived children, since an unread
    pipe fills up and blocks the child.
    """
    popen_kwargs.setdefault("stdout", subprocess.PIPE)
    popen_kwargs.setdefault("stderr", subprocess.PIPE)
    popen_kwargs.setdefault("text", True)
    return spawn([sys.executable, "-c", code, *args], env=env, **popen_kwargs)


def proc_stats() -> Iterator[tuple[int, list[bytes]]]:
    """Every process's pid and its ``/proc/<pid>/stat`` fields after the ")" that closes comm (state, ppid, pgrp,
    ...); processes that end while being read are skipped."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        yield int(entry.name), stat[stat.rfind(b")") + 2 :].split()


def group_alive(pgid: int) -> bool:
    """True if a live (non-zombie) process is still in process group ``pgid`` (reads /proc)."""
    return any(len(f) >= 3 and f[0] != b"Z" and int(f[2]) == pgid for _, f in proc_stats())


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def kill_tree(proc: subprocess.Popen[Any], term_timeout: float = 5.0, *, group_sigterm: bool = True) -> None:
    """Stop ``proc`` and its whole process group: SIGTERM, wait up to ``term_timeout`` seconds
    for the group to empty, then SIGKILL.  ``group_sigterm=False`` sends the SIGTERM to the
    leader only (a gunicorn master shuts its workers down itself)."""
    pgid = proc.pid
    if proc.poll() is None or group_alive(pgid):
        if group_sigterm:
            _killpg(pgid, signal.SIGTERM)
        elif proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + term_timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None and not group_alive(pgid):
                break
            time.sleep(0.05)
        else:
            _killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
    if group_alive(pgid):
        _killpg(pgid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.05)
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()
    with contextlib.suppress(ValueError):
        _REGISTRY.remove(proc)


def kill_stragglers() -> list[str]:
    """Kill every harness-started process still running; return a description of each."""
    found = []
    for proc in list(_REGISTRY):
        if proc.poll() is None or group_alive(proc.pid):
            found.append(f"pid {proc.pid}: {_argv_str(proc)}")
        kill_tree(proc, term_timeout=2.0)
    _REGISTRY.clear()
    return found


@dataclass
class Server:
    """A running HTTP server child: ``url`` (no trailing slash), ``port``, ``proc``, and its
    combined stdout/stderr in ``log_path`` (read with ``log()`` when an assertion fails)."""

    url: str
    port: int
    proc: subprocess.Popen[Any]
    log_path: Path
    stop_timeout: float = 10.0
    _stopped: bool = field(default=False, repr=False)

    def log(self) -> str:
        """What the server printed so far (empty once stopped and cleaned up)."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM the master (graceful shutdown), SIGKILL the group after ``stop_timeout``."""
        if self._stopped:
            return
        self._stopped = True
        kill_tree(self.proc, self.stop_timeout, group_sigterm=False)
        with contextlib.suppress(OSError):
            self.log_path.unlink()


_BIND_ERRORS = ("Address already in use", "Connection in use", "error while attempting to bind")


def _start_server(
    argv_for_port: Any,
    what: str,
    env: Env | None,
    app_dir: PathArg | None,
    timeout: float,
    health_path: str,
    attempts: int = 3,
) -> Server:
    """Start a server on a free port, retrying on a new port if another worker grabbed it."""
    last_log = ""
    for _ in range(attempts):
        port = free_port()
        fd, log_name = tempfile.mkstemp(prefix=f"shmbus-{what}-", suffix=".log")
        log_path = Path(log_name)
        with os.fdopen(fd, "wb") as log_fh:
            proc = spawn(argv_for_port(port), env=env, app_dir=app_dir, stdout=log_fh, stderr=STDOUT)
        server = Server(url=f"http://127.0.0.1:{port}", port=port, proc=proc, log_path=log_path)
        try:
            wait_http(server.url + health_path, timeout=timeout, proc=proc)
            return server
        except (RuntimeError, TimeoutError) as exc:
            last_log = server.log()
            server.stop()
            if isinstance(exc, RuntimeError) and any(e in last_log for e in _BIND_ERRORS):
                continue
            raise RuntimeError(f"{what} did not start: {exc}\n--- {what} output ---\n{last_log}") from None
    raise RuntimeError(f"{what} could not bind a free port in {attempts} attempts\n{last_log}")


def _gunicorn_argv(
    app_spec: str,
    workers: int,
    worker_class: str,
    config: PathArg | None,
    graceful_timeout: float,
    extra_args: Sequence[str],
) -> Any:
    def argv(port: int) -> list[str]:
        args = [sys.executable, "-m", "gunicorn", "--bind", f"127.0.0.1:{port}"]
        args += ["--workers", str(workers), "--worker-class", worker_class]
        args += ["--graceful-timeout", str(int(graceful_timeout))]
        if config is not None:
            args += ["--config", str(config)]
        return [*args, *extra_args, app_spec]

    return argv


@contextlib.contextmanager
def gunicorn_server(
    app_spec: str,
    workers: int = 2,
    worker_class: str = "sync",
    config: PathArg | None = None,
    env: Env | None = None,
    *,
    app_dir: PathArg | None = None,
    extra_args: Sequence[str] = (),
    timeout: float = 30.0,
    graceful_timeout: float = 5.0,
    health_path: str = "/",
) -> Iterator[Server]:
    """Run ``python -m gunicorn app_spec`` on 127.0.0.1:<free port> until the block ends.

    Waits until ``health_path`` answers any HTTP status.  ``app_dir`` is put on PYTHONPATH
    (for apps written to tmp_path).  Stop: SIGTERM to the master, SIGKILL after 10 s.
    """
    argv = _gunicorn_argv(app_spec, workers, worker_class, config, graceful_timeout, extra_args)
    server = _start_server(argv, "gunicorn", env, app_dir, timeout, health_path)
    try:
        yield server
    finally:
        server.stop()


def _uvicorn_argv(app_spec: str, workers: int, graceful_timeout: float, extra_args: Sequence[str]) -> Any:
    def argv(port: int) -> list[str]:
        args = [sys.executable, "-m", "uvicorn", app_spec, "--host", "127.0.0.1", "--port", str(port)]
        args += ["--workers", str(workers), "--timeout-graceful-shutdown", str(int(graceful_timeout))]
        return [*args, "--log-level", "warning", *extra_args]

    return argv


@contextlib.contextmanager
def uvicorn_server(
    app_spec: str,
    workers: int = 1,
    env: Env | None = None,
    *,
    app_dir: PathArg | None = None,
    extra_args: Sequence[str] = (),
    timeout: float = 30.0,
    graceful_timeout: float = 5.0,
    health_path: str = "/",
) -> Iterator[Server]:
    """Run ``python -m uvicorn app_spec`` on 127.0.0.1:<free port> until the block ends.

    Same contract as ``gunicorn_server``: waits for any HTTP answer, SIGTERM then SIGKILL.
    """
    argv = _uvicorn_argv(app_spec, workers, graceful_timeout, extra_args)
    server = _start_server(argv, "uvicorn", env, app_dir, timeout, health_path)
    try:
        yield server
    finally:
        server.stop()


class ProcessTracker:
    """The ``procs`` fixture: the same helpers, but everything started is killed (whole
    process group) when the test ends, even if the test failed half-way."""

    def __init__(self) -> None:
        self._procs: list[subprocess.Popen[Any]] = []
        self._stack = contextlib.ExitStack()

    def track(self, proc: subprocess.Popen[Any]) -> subprocess.Popen[Any]:
        """Adopt a Popen started elsewhere (ideally with start_new_session=True)."""
        self._procs.append(proc)
        return proc

    def spawn(
        self,
        argv: Sequence[PathArg],
        *,
        env: Env | None = None,
        **kw: Any,
    ) -> subprocess.Popen[Any]:
        """``procs.spawn(argv, env=None, **popen_kwargs)``: see module-level ``spawn``."""
        return self.track(spawn(argv, env=env, **kw))

    def spawn_python(self, code: str, *args: str, env: Env | None = None, **kw: Any) -> subprocess.Popen[Any]:
        """``procs.spawn_python(code, *args, env=None)``: see module-level ``spawn_python``."""
        return self.track(spawn_python(code, *args, env=env, **kw))

    def gunicorn_server(self, app_spec: str, *args: Any, **kwargs: Any) -> Server:
        """Start gunicorn now (same arguments as ``gunicorn_server``); stopped at teardown."""
        return self._stack.enter_context(gunicorn_server(app_spec, *args, **kwargs))

    def uvicorn_server(self, app_spec: str, *args: Any, **kwargs: Any) -> Server:
        """Start uvicorn now (same arguments as ``uvicorn_server``); stopped at teardown."""
        return self._stack.enter_context(uvicorn_server(app_spec, *args, **kwargs))

    def cleanup(self) -> None:
        """Stop servers, then kill every tracked process group (children of children too)."""
        try:
            self._stack.close()
        finally:
            for proc in reversed(self._procs):
                kill_tree(proc)
            self._procs.clear()


def blocked_signals(pid: int, tid: int) -> set[int]:
    """The signals thread ``tid`` of process ``pid`` blocks (its SigBlk mask in /proc)."""
    for line in Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines():
        if line.startswith("SigBlk:"):
            mask = int(line.split()[1], 16)
            return {n for n in range(1, 65) if mask >> (n - 1) & 1}
    raise AssertionError(f"no SigBlk line for thread {tid} of {pid}")
