"""``python -m shmbus.adapters.server module:app``: the lean server standalone, forking its workers."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

from ..loop_lock import new_loop
from .limits import Limits
from .parser import PARSER
from .serve import serve

log = logging.getLogger("shmbus.adapters.server")


def _import_app(spec: str) -> Any:
    mod, _, attr = spec.partition(":")
    obj: Any = importlib.import_module(mod)
    for part in (attr or "app").split("."):
        obj = getattr(obj, part)
    return obj


def _bind(addr: str, backlog: int) -> socket.socket:
    host, _, port = addr.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.bind((host, int(port)))
    s.listen(backlog)
    s.set_inheritable(True)
    return s


def _child(spec: str, sock: socket.socket, args: argparse.Namespace) -> int:
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):
        signal.signal(s, signal.SIG_DFL)
    app = _import_app(spec)
    loop = new_loop()
    asyncio.set_event_loop(loop)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    parent = os.getppid()

    def beat() -> None:
        if os.getppid() != parent:
            stop.set()

    options = None
    if args.options:
        import json

        options = json.loads(args.options)
    try:
        loop.run_until_complete(
            serve(
                app,
                [sock],
                options=options,
                keepalive=args.keepalive,
                max_requests=args.max_requests,
                graceful_timeout=args.graceful_timeout,
                stop=stop,
                heartbeat=beat,
                backlog=args.backlog,
                limits=args.limits,
            )
        )
    finally:
        loop.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m shmbus.adapters.server module:app --bind HOST:PORT --workers N``."""
    ap = argparse.ArgumentParser(prog="python -m shmbus.adapters.server", description=__doc__.split("\n")[0])
    ap.add_argument("app", help="module:attribute of the ASGI app (or MessageBusMiddleware)")
    ap.add_argument("--bind", "-b", default="127.0.0.1:8000")
    ap.add_argument("--workers", "-w", type=int, default=1)
    ap.add_argument("--keepalive", type=float, default=5.0)
    ap.add_argument("--max-requests", type=int, default=0)
    ap.add_argument("--graceful-timeout", type=float, default=5.0)
    ap.add_argument("--backlog", type=int, default=2048)
    ap.add_argument("--options", default="", help="JSON middleware options for a plain ASGI app ({'bus': name,...})")
    defaults = Limits()
    for f in fields(Limits):
        ap.add_argument(
            f"--{f.name.replace('_', '-')}",
            type=type(getattr(defaults, f.name)),
            dest=f.name,
            default=getattr(defaults, f.name),
            help=f"server limit (default {getattr(defaults, f.name)}; see shmbus.adapters.server.Limits)",
        )
    args = ap.parse_args(argv)
    args.limits = Limits(**{f.name: getattr(args, f.name) for f in fields(Limits)})
    logging.basicConfig(level=logging.INFO, format="[%(process)d] %(levelname)s %(name)s: %(message)s")
    sys.path.insert(0, os.getcwd())
    sock = _bind(args.bind, args.backlog)
    kids: dict[int, int] = {}
    stopping = False

    def spawn() -> None:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _child(args.app, sock, args)
            except BaseException:
                log.exception("shmbus server: worker failed")
            finally:
                os._exit(code)
        kids[pid] = pid

    def stop(signum: int, _frame: Any) -> None:
        nonlocal stopping
        stopping = True
        for pid in list(kids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log.info("shmbus server: listening on %s (%d workers, %s parser)", args.bind, args.workers, PARSER)
    for _ in range(args.workers):
        spawn()
    while kids:
        try:
            pid, status = os.wait()
        except InterruptedError:
            continue
        except ChildProcessError:
            break
        kids.pop(pid, None)
        if not stopping:
            log.warning("shmbus server: worker %d exited (%d); restarting", pid, status)
            time.sleep(0.1)
            spawn()
    sock.close()
    return 0
