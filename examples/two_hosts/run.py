"""Two hosts on one machine, bridged through Redis: ``python examples/two_hosts/run.py`` (from the repository root).

Starts host ``a`` on http://127.0.0.1:8001/ and host ``b`` on http://127.0.0.1:8002/, each a gunicorn with two
ASGI workers and its own shared-memory bus (``two-hosts-a``, ``two-hosts-b``), both bridged to ``--redis``
(default ``$REDIS_URL`` or ``redis://127.0.0.1:6379/0``). Chat on one page, read it on the other. Ctrl-C (or
SIGTERM) stops both servers, then removes both buses (the messages stay in Redis, as the gem's would).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

from shmbus.segment import Segment

HERE = Path(__file__).resolve().parent
WORKER = "shmbus.adapters.server.uvicorn_worker.UvicornWorker"


def start_host(name: str, port: int, bus: str, redis_url: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, HOST_NAME=name, SHMBUS_NAME=bus, REDIS_URL=redis_url)
    argv = [sys.executable, "-m", "gunicorn", "-k", WORKER, "--workers", "2", "--chdir", str(HERE)]
    argv += ["--bind", f"127.0.0.1:{port}", "--graceful-timeout", "5", "app:app"]
    return subprocess.Popen(argv, env=env)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--port-a", type=int, default=8001)
    parser.add_argument("--port-b", type=int, default=8002)
    parser.add_argument("--bus-prefix", default="two-hosts-", help="the buses are <prefix>a and <prefix>b")
    args = parser.parse_args()

    hosts = {"a": args.port_a, "b": args.port_b}
    servers = [start_host(name, port, args.bus_prefix + name, args.redis) for name, port in hosts.items()]
    stopping = False

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    for name, port in hosts.items():
        print(f"host {name}: http://127.0.0.1:{port}/", flush=True)
    while not stopping and all(s.poll() is None for s in servers):
        time.sleep(0.2)
    for s in servers:  # gunicorn first, so no worker serves a removed segment
        if s.poll() is None:
            s.terminate()
    for s in servers:
        s.wait()
    for name in hosts:
        Segment.destroy_by_name(args.bus_prefix + name)
    return 0 if stopping else 1


if __name__ == "__main__":
    sys.exit(main())
