"""Self-test of the shared harness: if these fail, every other test's verdict is suspect."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.harness import TESTS_DIR, require, require_module, skip_or_fail
from tests.harness.procs import (
    ProcessTracker,
    free_port,
    group_alive,
    gunicorn_server,
    listen_port,
    spawn_python,
    uvicorn_server,
    wait_http,
    wait_port,
)
from tests.harness.services import RedisServer, postgres_problem, redis_ping
from tests.harness.shm import SHM_DIR, bus_prefix, files_for_bus, shm_files


def _gone(pid: int) -> bool:
    """True if ``pid`` no longer runs (missing, or a zombie nobody reaped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except FileNotFoundError:
        return True
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] == b"Z"


def _wait_gone(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not _gone(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _resp(port: int, *parts: str) -> bytes:
    """Send one Redis command over a raw socket and return the raw reply."""
    cmd = f"*{len(parts)}\r\n" + "".join(f"${len(p)}\r\n{p}\r\n" for p in parts)
    with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        sock.sendall(cmd.encode())
        return sock.recv(1024)


# --- processes -------------------------------------------------------------------------------


def test_free_port_is_bindable() -> None:
    port = free_port()
    assert 1024 <= port <= 65535
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_listen_port_is_bindable_and_below_the_ephemeral_range() -> None:
    """Outgoing connections take their local ports from the ephemeral range: a private server's port chosen there
    was taken before the server bound it, on a machine making thousands of connections (issue 36)."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(20):
        port = listen_port()
        assert 1024 <= port < low
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_spawn_python_passes_args_env_and_exit_code() -> None:
    proc = spawn_python(
        "import os, sys; print(sys.argv[1:], os.environ['SHMBUS_T']); sys.exit(7)",
        "a",
        "b c",
        env={"SHMBUS_T": "v"},
    )
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 7, err
    assert out.strip() == "['a', 'b c'] v"
    assert os.getpgid(0) != proc.pid  # the child got its own process group


def test_procs_fixture_kills_the_whole_process_group(procs: ProcessTracker) -> None:
    code = textwrap.dedent(
        """
        import subprocess, sys, time
        grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        print(grandchild.pid, flush=True)
        time.sleep(120)
        """
    )
    child = procs.spawn_python(code)
    assert child.stdout is not None
    grandchild = int(child.stdout.readline())
    assert group_alive(child.pid)
    procs.cleanup()
    assert _wait_gone(child.pid) and _wait_gone(grandchild), "cleanup left a process running"
    assert not group_alive(child.pid)


def test_wait_port_and_wait_http(procs: ProcessTracker, tmp_path: Path) -> None:
    (tmp_path / "index.html").write_text("ok")
    port = free_port()
    server = procs.spawn(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_port(port, timeout=15, proc=server)
    assert wait_http(f"http://127.0.0.1:{port}/index.html", timeout=15) == 200
    assert wait_http(f"http://127.0.0.1:{port}/missing", timeout=5) == 404  # any answer counts


def test_waits_time_out_or_notice_a_dead_process() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # bound but not listening: connections are refused
        port = sock.getsockname()[1]
        with pytest.raises(TimeoutError):
            wait_port(port, timeout=0.3)
        dead = spawn_python("pass")
        dead.communicate(timeout=30)
        start = time.monotonic()
        with pytest.raises(RuntimeError, match="exited with code 0"):
            wait_http(f"http://127.0.0.1:{port}/", timeout=30, proc=dead)
        assert time.monotonic() - start < 15  # half its timeout: it noticed the death, it did not time out


WSGI_APP = """
import os
def app(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [f"wsgi {os.getpid()}".encode()]
"""

ASGI_APP = """
import os
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": f"asgi {os.getpid()}".encode()})
"""


def _get(url: str) -> str:
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=10) as resp:
        return resp.read().decode()


def test_gunicorn_server_serves_and_stops(tmp_path: Path) -> None:
    require_module("gunicorn")
    (tmp_path / "wsgi_app.py").write_text(WSGI_APP)
    with gunicorn_server("wsgi_app:app", workers=2, app_dir=tmp_path) as srv:
        assert srv.url == f"http://127.0.0.1:{srv.port}"
        body = _get(srv.url + "/")
        assert body.startswith("wsgi "), srv.log()
        worker_pid = int(body.split()[1])
        assert worker_pid != srv.proc.pid  # served by a forked worker, not the master
    assert srv.proc.returncode is not None
    assert not group_alive(srv.proc.pid), "gunicorn workers survived stop()"
    assert _wait_gone(worker_pid)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", srv.port), timeout=1).close()


def test_uvicorn_server_serves_and_stops(tmp_path: Path) -> None:
    require_module("uvicorn")
    (tmp_path / "asgi_app.py").write_text(ASGI_APP)
    with uvicorn_server("asgi_app:app", app_dir=tmp_path) as srv:
        assert _get(srv.url + "/").startswith("asgi ")
    assert not group_alive(srv.proc.pid)


def test_procs_server_factory_is_stopped_at_cleanup(procs: ProcessTracker, tmp_path: Path) -> None:
    require_module("gunicorn")
    (tmp_path / "wsgi_app2.py").write_text(WSGI_APP)
    srv = procs.gunicorn_server("wsgi_app2:app", workers=1, app_dir=tmp_path)
    assert _get(srv.url + "/").startswith("wsgi ")
    procs.cleanup()
    assert not group_alive(srv.proc.pid)
    assert not srv.log_path.exists()


# --- services --------------------------------------------------------------------------------


def test_redis_url_answers_ping_on_a_raw_socket(redis_url: str) -> None:
    from urllib.parse import urlparse

    parsed = urlparse(redis_url)
    assert redis_ping(parsed.hostname or "127.0.0.1", parsed.port or 6379) == "+PONG"


def test_private_redis_server_stops_and_restarts_on_the_same_port(redis_server: RedisServer) -> None:
    port = redis_server.port
    assert redis_server.url == f"redis://127.0.0.1:{port}/0"
    assert _resp(port, "SET", "harness-key", "1") == b"+OK\r\n"
    first_pid = redis_server.proc.pid if redis_server.proc else None

    redis_server.stop()
    assert redis_ping("127.0.0.1", port, 0.5) is None, "stop() left Redis answering"
    redis_server.start()
    assert redis_server.port == port
    assert redis_ping("127.0.0.1", port) == "+PONG"
    assert redis_server.proc is not None and redis_server.proc.pid != first_pid
    assert _resp(port, "GET", "harness-key") == b"$-1\r\n"  # a fresh, empty server

    redis_server.kill()
    assert redis_ping("127.0.0.1", port, 0.5) is None
    redis_server.restart()
    assert redis_ping("127.0.0.1", port) == "+PONG"


def test_database_url_accepts_a_connection(database_url: str) -> None:
    assert postgres_problem(database_url) is None
    try:
        import psycopg
    except ImportError:
        return  # postgres_problem() already proved it with pg_isready
    with psycopg.connect(database_url, connect_timeout=5) as conn:
        assert conn.execute("SELECT 40 + 2").fetchone() == (42,)


# --- bus names and leak check ----------------------------------------------------------------


def test_bus_name_is_unique_per_worker_and_test(bus_name: str) -> None:
    assert re.fullmatch(rf"t{os.getpid()}_[0-9a-f]{{10}}", bus_name)
    assert bus_name.startswith(bus_prefix())


def test_leak_scanner_finds_a_bus_segment_and_its_lock(bus_name: str) -> None:
    made = [
        SHM_DIR / f"shmbus.{bus_name}",
        SHM_DIR / f"shmbus.{bus_name}.lock",
        SHM_DIR / f"shmbus.{bus_name}x",
    ]
    try:
        for path in made:
            path.touch()
        assert files_for_bus(bus_name) == {f"shmbus.{bus_name}", f"shmbus.{bus_name}.lock"}
        assert {p.name for p in made} <= shm_files(bus_prefix())
    finally:
        for path in made:
            path.unlink(missing_ok=True)
    assert files_for_bus(bus_name) == set()


# --- require / skip_or_fail and whole-session checks, in a child pytest ----------------------


def _child_pytest(
    tmp_path: Path, require_all: str | None, drop: tuple[str, ...] = (), **extra_env: str
) -> subprocess.CompletedProcess[str]:
    """Run pytest on ``tmp_path`` in a child process, SHMBUS_REQUIRE_ALL as given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "SHMBUS_REQUIRE_ALL"))}
    for name in drop:
        env.pop(name, None)
    if require_all is not None:
        env["SHMBUS_REQUIRE_ALL"] = require_all
    env["PYTHONPATH"] = str(TESTS_DIR.parent)  # the child's tests import ``tests.harness``
    env.update(extra_env)
    argv = [sys.executable, "-m", "pytest", "-q", "-ra", "-p", "no:cacheprovider", "-p", "no:xdist"]
    return subprocess.run(
        [*argv, "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


REQUIRE_TESTS = """
from tests.harness import require, skip_or_fail

def test_missing_bool():
    require(False, "frobnicator missing (apt-get install frob)")

def test_missing_reason():
    require("widget server not running (start it with widgetd)")

def test_present():
    require(True, "unused")
    require(None)
"""


def test_require_skips_normally_and_fails_under_require_all(tmp_path: Path) -> None:
    (tmp_path / "test_req.py").write_text(REQUIRE_TESTS)

    relaxed = _child_pytest(tmp_path, None)
    assert relaxed.returncode == 0, relaxed.stdout + relaxed.stderr
    assert "1 passed, 2 skipped" in relaxed.stdout
    assert "frobnicator missing (apt-get install frob)" in relaxed.stdout  # -rs style reason shown

    strict = _child_pytest(tmp_path, "1")
    assert strict.returncode == 1, strict.stdout + strict.stderr
    assert "2 failed, 1 passed" in strict.stdout
    assert "required but missing: frobnicator missing (apt-get install frob)" in strict.stdout
    assert "required but missing: widget server not running" in strict.stdout

    assert _child_pytest(tmp_path, "0").returncode == 0  # "0" means off, like unset


def test_skip_or_fail_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SHMBUS_REQUIRE_ALL", raising=False)
    with pytest.raises(pytest.skip.Exception, match="thing missing"):
        skip_or_fail("thing missing")
    monkeypatch.setenv("SHMBUS_REQUIRE_ALL", "1")
    with pytest.raises(pytest.fail.Exception, match="required but missing: thing missing"):
        require(False, "thing missing")
    require(True, "never shown")


LEAKY_CONFTEST = f"""
exec(compile(open({str(TESTS_DIR / "conftest.py")!r}).read(), "shmbus_conftest", "exec"))
"""

LEAKY_TESTS = """
import os
from tests.harness.procs import spawn_python

def test_leaves_a_segment(bus_name):
    open(f"/dev/shm/shmbus.{bus_name}", "w").close()
    print("BUS", bus_name)

def test_leaves_a_process():
    proc = spawn_python("import time; time.sleep(120)")
    print("PID", proc.pid)
"""


def test_session_fails_on_leaked_segment_and_stray_process(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(LEAKY_CONFTEST)
    (tmp_path / "test_leaky.py").write_text(LEAKY_TESTS)
    res = _child_pytest(tmp_path, None)
    out = res.stdout + res.stderr
    assert res.returncode != 0, out
    assert "shared-memory leak" in out and "test_leaves_a_segment" in out, out
    assert "still running at session end" in out, out
    # ...and both were cleaned up after being reported.
    child_prefix = re.search(r"shmbus\.(t\d+_)", out)
    assert child_prefix, out
    assert shm_files(child_prefix.group(1)) == set()
    pid_match = re.search(r"pid (\d+): ", out)
    assert pid_match, out
    assert _wait_gone(int(pid_match.group(1)))


PRIVATE_TESTS = """
import os
from tests.harness.services import postgres_problem, redis_ping

def test_private_services(redis_url, database_url):
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    assert port != 6379 and redis_ping("127.0.0.1", port) == "+PONG"
    assert ":5432/" not in database_url and postgres_problem(database_url) is None
    with open(os.environ["URLS_FILE"], "w") as fh:
        fh.write(redis_url + "\\n" + database_url)
"""


def test_fresh_machine_path_starts_private_redis_and_postgres(tmp_path: Path) -> None:
    """What a machine without running services gets: private servers, stopped at session end."""
    (tmp_path / "conftest.py").write_text(LEAKY_CONFTEST)
    (tmp_path / "test_private.py").write_text(PRIVATE_TESTS)
    urls_file = tmp_path / "urls.txt"
    res = _child_pytest(
        tmp_path,
        "1",
        drop=("REDIS_URL", "DATABASE_URL"),
        SHMBUS_PRIVATE_SERVICES="1",
        URLS_FILE=str(urls_file),
    )
    assert res.returncode == 0 and "1 passed" in res.stdout, res.stdout + res.stderr
    redis_url, database_url = urls_file.read_text().split("\n")
    redis_port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    assert redis_ping("127.0.0.1", redis_port, 0.5) is None, "private redis outlived the session"
    assert postgres_problem(database_url, timeout=2) is not None, "private postgres outlived the session"


def test_redis_server_close_removes_its_temp_dir() -> None:
    binary = shutil.which("redis-server")
    require(binary is not None, "redis-server not on PATH (apt-get install redis-server / scripts/test)")
    assert binary is not None
    server = RedisServer(binary).start()
    assert server.dir.is_dir() and redis_ping("127.0.0.1", server.port) == "+PONG"
    server.close()
    assert not server.dir.exists()
    assert redis_ping("127.0.0.1", server.port, 0.5) is None
