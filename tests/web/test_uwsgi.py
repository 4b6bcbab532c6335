"""uWSGI smoke test: a real uWSGI master with 2 preforked, threaded workers serving the WSGI middleware.

The app is loaded in the master and forked (uWSGI's default), so the bus must be re-armed in every worker
(``os.register_at_fork`` and the ``postfork`` hook of ``shmbus.adapters.integrations.uwsgi``).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from shmbus import Bus
from tests.harness import skip_or_fail
from tests.harness.procs import free_port, wait_http

from . import rawhttp
from .test_servers import publish_elsewhere
from .web_servers import env_for

WEB_DIR = Path(__file__).resolve().parent

pytestmark = pytest.mark.slow


def _uwsgi_binary() -> str:
    beside = os.path.join(os.path.dirname(sys.executable), "uwsgi")  # built against this interpreter
    found = beside if os.path.exists(beside) else shutil.which("uwsgi")
    if not found:
        skip_or_fail("uwsgi is not installed (pip install uwsgi; scripts/test installs it into .venv)")
    return found


class _Server:
    def __init__(self, port: int, proc: Any, log: str) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.proc = proc
        self._log = log

    def log(self) -> str:
        with open(self._log, errors="replace") as f:
            return f.read()[-5000:]


def test_uwsgi_preforked_threaded_workers(procs: Any, bus_name: str, tmp_path: Any) -> None:
    binary = _uwsgi_binary()
    seed = Bus(bus_name, keepalive_interval=0, create=True)
    seed.last_id("/x")
    port = free_port()
    log = str(tmp_path / "uwsgi.log")
    argv = [
        binary,
        "--http",
        f"127.0.0.1:{port}",
        "--master",
        "--processes",
        "2",
        "--threads",
        "8",
        "--enable-threads",
        "--module",
        "uwsgi_app:application",
        "--pythonpath",
        str(WEB_DIR),
        "--die-on-term",
        "--logto",
        log,
        "--need-app",
    ]
    if sys.prefix != sys.base_prefix:
        argv += ["--home", sys.prefix]
    env = env_for(bus_name, long_polling_interval=20)
    env["PYTHONPATH"] = os.pathsep.join([str(WEB_DIR), os.environ.get("PYTHONPATH", "")])
    proc = procs.spawn(argv, env=env)
    try:
        wait_http(f"http://127.0.0.1:{port}/hello", timeout=30, proc=proc)
        server = _Server(port, proc, log)
        # streaming: uWSGI's HTTP router does not chunk a WSGI body (PEP 3333 forbids the app from doing it),
        # so the stream is delimited by connection close; the JS and Ruby clients split on \r\n|\r\n anyway.
        s = rawhttp.poll(port, "streamer", {"/smoke": -1}, chunk=True).read_head()
        assert s.status == 200, server.log()
        assert s.headers["content-type"] == "text/plain; charset=utf-8"
        first = s.read_until(b"\r\n|\r\n")
        assert first.endswith(b'[{"global_id":-1,"message_id":-1,"channel":"/__status","data":{"/smoke":0}}]\r\n|\r\n')
        lp = rawhttp.poll(port, "longpoller", {"/smoke": 0})
        assert publish_elsewhere(procs, bus_name, "/smoke", "from-another-process") == 1
        body = lp.read_head().read_all()
        assert json.loads(body) == [
            {"global_id": 1, "message_id": 1, "channel": "/smoke", "data": "from-another-process"}
        ], server.log()
        assert b"from-another-process" in s.read_until(b"from-another-process")
        s.close()
        r = rawhttp.poll(port, "after", {"/smoke": 0}, dlp=True).read_head()
        assert json.loads(r.read_all())[0]["data"] == "from-another-process"
        assert "Traceback" not in server.log(), server.log()
    finally:
        seed.destroy()
