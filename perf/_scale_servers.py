"""The servers perf/bench_http_scale.py compares, each a private process group on a free port, stopped by ``stop()``.

* :func:`shmbus_server`: the ordinary app (:mod:`_http_apps`) on the lean worker, 2 workers (gunicorn);
* :class:`GemCluster`: the same app on the message_bus gem (``perf/gem_app.ru``), puma in cluster mode with 2
  workers sharing the bus through the gem's PostgreSQL backend, in a private database made for the run (the memory
  backend lives in one process, and one process cannot hold 20,000 sockets under this machine's 20,000 file limit);
* :class:`Nchan`: nginx with Debian's ``libnginx-mod-nchan``, 2 workers, ``http-chunked`` subscribers on two
  channels each (the broadcast and one chat room), publishers on ``/pub/<channel>``; our own ``nginx.conf`` in a
  temporary directory, never the system's service.

Each has ``port``, ``pids()`` (every server process, for CPU and RSS from /proc) and ``stop()``; ``problem()``
functions say why one cannot run here (the benchmark then skips it with a loud line).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import Any

import _http_load as load

NCHAN_MODULE = "/usr/lib/nginx/modules/ngx_nchan_module.so"
PERF = os.path.dirname(os.path.abspath(__file__))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen[Any], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{what} did not start")


def stop_group(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        proc.wait(5)


# ---------------------------------------------------------------------------------------------- shmbus
class ShmbusServer:
    """The ordinary app on ``shmbus.adapters.server.GunicornWorker``, 2 workers."""

    name = "shmbus"

    def __init__(self, bus_name: str, streams: int, interval: float) -> None:
        import json

        import _http_apps as apps

        opts = {"max_active_clients": streams + 1000, "long_polling_interval": interval}
        env = {"SHMBUS_LOAD_BUS": bus_name, "SHMBUS_LOAD_OPTS": json.dumps(opts)}
        self.tmp = tempfile.mkdtemp(prefix="shmbus-scale-")
        conf = os.path.join(self.tmp, "gunicorn.conf.py")
        with open(conf, "w") as f:  # each worker may hold every stream (the accept balance is the kernel's)
            f.write(f"shmbus_server = {{'max_connections': {streams + 1000}}}\n")
        self.server = load.Uvicorn(
            "_http_apps:ordinary_app", env=env, extra=["-k", apps.SERVER_WORKER, "-c", conf], nofile=streams + 1000
        )
        self.port = self.server.port

    def pids(self) -> list[int]:
        return sorted({self.server.proc.pid, *self.server.worker_pids()})

    def publish_request(self, channel: str, data: str) -> bytes:
        return form_post("/publish", channel, data)

    def stop(self) -> None:
        self.server.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)


def form_post(path: str, channel: str, data: str) -> bytes:
    from urllib.parse import quote

    body = f"channel={quote(channel, safe='')}&data={quote(data, safe='')}".encode()
    return (
        b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (path.encode(), len(body), body)
    )


# ---------------------------------------------------------------------------------------------- the gem
def gem_problem() -> str:
    why = load.gem_problem()
    if why:
        return why
    if subprocess.run(["ruby", "-e", "require 'pg'"], capture_output=True).returncode:
        return "Ruby's pg library is missing (Debian: ruby-pg)"
    try:
        import psycopg

        psycopg.connect("host=127.0.0.1 port=5432 user=postgres dbname=postgres", connect_timeout=3).close()
    except Exception as exc:
        return f"no PostgreSQL on 127.0.0.1:5432 for the gem's backend ({exc})"
    return ""


class GemCluster:
    """The gem's ordinary app under puma, 2 workers, PostgreSQL backend in a private database (dropped by stop)."""

    name = "gem"

    def __init__(self, streams: int, interval: float, workers: int = 2, threads: int = 8) -> None:
        import psycopg

        self.db = f"shmbus_scale_{os.getpid()}_{int(time.time())}"
        with psycopg.connect("host=127.0.0.1 port=5432 user=postgres dbname=postgres", autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.db}"')
        self.port = free_port()
        env = dict(
            os.environ,
            MB_MAX_ACTIVE=str(streams + 1000),
            MB_POLL_MS=str(int(interval * 1000)),
            MB_PG_DB=self.db,
        )
        argv = [
            load.sys.executable,
            load.__file__,
            str(streams + 1000),
            "puma",
            "--quiet",
            "-e",
            "production",
            "-w",
            str(workers),
            "-t",
            f"{threads}:{threads}",
            "-b",
            f"tcp://127.0.0.1:{self.port}?backlog=4096",
            os.path.join(PERF, "gem_app.ru"),
        ]
        self.proc = subprocess.Popen(
            argv, env=env, start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL
        )
        try:
            wait_port(self.port, self.proc, "puma")
            deadline = time.monotonic() + 30
            while len(load.children(self.proc.pid)) < workers and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(1.0)  # let every worker boot and LISTEN
        except BaseException:
            self.stop()
            raise

    def pids(self) -> list[int]:
        return [self.proc.pid, *load.children(self.proc.pid)]

    def publish_request(self, channel: str, data: str) -> bytes:
        return form_post("/publish", channel, data)

    def stop(self) -> None:
        stop_group(self.proc)
        import psycopg

        admin = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
        with contextlib.suppress(Exception), psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.db}" WITH (FORCE)')


# ---------------------------------------------------------------------------------------------- Nchan
def nchan_problem() -> str:
    if shutil.which("nginx") is None and not os.path.exists("/usr/sbin/nginx"):
        return "nginx is not installed (Debian: apt-get install nginx-light libnginx-mod-nchan; scripts/perf-deps)"
    if not os.path.exists(NCHAN_MODULE):
        return "Nchan is not installed (Debian: apt-get install libnginx-mod-nchan; scripts/perf-deps)"
    return ""


NGINX_CONF = """
load_module {module};
worker_processes {workers};
worker_rlimit_nofile {nofile};
pid {tmp}/nginx.pid;
error_log {tmp}/error.log error;
events {{ worker_connections {conns}; multi_accept on; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/body;
    nchan_shared_memory_size 256M;
    keepalive_requests 1000000;
    server {{
        listen 127.0.0.1:{port} backlog=4096 reuseport;
        location ~ ^/sub/(\\w+)$ {{
            nchan_subscriber http-chunked;
            nchan_channel_id bcast $1;
            nchan_subscriber_first_message newest;
            nchan_subscriber_timeout {interval};
        }}
        location ~ ^/pub/(\\w+)$ {{
            nchan_publisher;
            nchan_channel_id $1;
            nchan_message_buffer_length 16;
            nchan_message_timeout 120s;
        }}
        location = /status {{ nchan_stub_status; }}
    }}
}}
"""


class Nchan:
    """nginx + Nchan, ``workers`` workers, on a free port; its config and logs in a temporary directory."""

    name = "nchan"

    def __init__(self, streams: int, interval: float, workers: int = 2) -> None:
        self.tmp = tempfile.mkdtemp(prefix="shmbus-nchan-")
        self.port = free_port()
        nofile = min(20000, streams + 2000)
        conf = NGINX_CONF.format(
            module=NCHAN_MODULE,
            workers=workers,
            nofile=nofile,
            conns=nofile - 100,
            tmp=self.tmp,
            port=self.port,
            interval=f"{int(interval)}s",
        )
        path = os.path.join(self.tmp, "nginx.conf")
        with open(path, "w") as f:
            f.write(conf)
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        argv = [load.sys.executable, load.__file__, str(nofile), nginx, "-p", self.tmp, "-e", self.tmp + "/error.log"]
        argv += ["-c", path, "-g", "daemon off; master_process on;"]
        self.proc = subprocess.Popen(argv, start_new_session=True, stdin=subprocess.DEVNULL)
        try:
            wait_port(self.port, self.proc, "nginx")
            time.sleep(0.3)
        except BaseException:
            self.stop()
            raise

    def pids(self) -> list[int]:
        return [self.proc.pid, *load.children(self.proc.pid)]

    def subscribers(self) -> int:
        """Nchan's own count of subscribers (``nchan_stub_status``)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
            s.sendall(b"GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        for line in data.decode("latin-1").splitlines():
            if line.startswith("subscribers:"):
                return int(line.split(":")[1])
        return -1

    def publish_request(self, channel: str, data: str) -> bytes:
        body = data.encode()
        name = channel.strip("/").replace("/", "")
        return (
            b"POST /pub/%s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s"
            % (name.encode(), len(body), body)
        )

    def stop(self) -> None:
        stop_group(self.proc)
        shutil.rmtree(self.tmp, ignore_errors=True)
