#!/usr/bin/env python
"""Run the Django chat: migrate its database, then serve it with gunicorn, 2 gthread workers on one bus.

    python examples/django_chat/run.py [--host 127.0.0.1] [--port 8000] [--workers 2] [--bus django_chat]
                                       [--sqlite PATH] [--keep-alive SECONDS] [--keep-bus]

Needs ``pip install -e '.[django,web]'`` (the repository's ``.venv`` has it). The database is SQLite in
``examples/django_chat/db.sqlite3`` (or ``--sqlite PATH``), PostgreSQL when ``DATABASE_URL`` is set. Ctrl-C or
SIGTERM stops gunicorn first, then removes the bus (unless it existed before, or ``--keep-bus``).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def wait_bound(host: str, port: int, server: subprocess.Popen[bytes], timeout: float = 60.0) -> bool:
    """True once ``host:port`` accepts connections; False if gunicorn exited first or the time ran out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and server.poll() is None:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return True
        except OSError:
            time.sleep(0.1)
    return False


def main() -> int:
    p = argparse.ArgumentParser(description="Serve the shmbus Django chat example with gunicorn.")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--bus", default="django_chat")
    p.add_argument("--sqlite", help="the SQLite file (default examples/django_chat/db.sqlite3)")
    p.add_argument(
        "--keep-alive", type=int, default=5, help="gunicorn's keep-alive seconds (0: one request per connection)"
    )
    p.add_argument("--keep-bus", action="store_true", help="leave the bus in /dev/shm on exit")
    args = p.parse_args()

    from shmbus import Bus
    from shmbus.segment import segment_path

    env = dict(os.environ, DJANGO_SETTINGS_MODULE="chat.settings", CHAT_BUS=args.bus)
    env.setdefault("TZ", "UTC")  # gunicorn's master and the workers (settings.TIME_ZONE) log in one zone
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), *filter(None, [env.get("PYTHONPATH")])])
    if args.sqlite:
        env["CHAT_SQLITE"] = args.sqlite
    subprocess.run([sys.executable, str(HERE / "manage.py"), "migrate", "-v0"], env=env, check=True)
    bus_existed = os.path.exists(segment_path(args.bus))
    server = subprocess.Popen(
        [
            *(sys.executable, "-m", "gunicorn", "-c", "python:shmbus.adapters.integrations.gunicorn"),
            *("--workers", str(args.workers), "--bind", f"{args.host}:{args.port}"),
            *("--keep-alive", str(args.keep_alive), "chat.wsgi:application"),
        ],
        env=env,
    )

    def stop(signum: int, frame: object) -> None:
        server.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    if wait_bound(args.host, args.port, server):
        print(f"django_chat: http://{args.host}:{args.port}/ (bus {args.bus!r}; Ctrl-C stops)", flush=True)
    code = server.wait()
    if not (bus_existed or args.keep_bus) and os.path.exists(segment_path(args.bus)):
        Bus(args.bus, create=False).destroy()
    return 0 if code in (0, -signal.SIGTERM) else code


if __name__ == "__main__":
    sys.exit(main())
