"""``gunicorn -k shmbus.adapters.server.GunicornWorker``: the lean server as a gunicorn worker."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from typing import Any

from ..loop_lock import new_loop
from .limits import Limits, gunicorn_config_value
from .serve import serve

log = logging.getLogger("shmbus.adapters.server")


def _gunicorn_base() -> Any:
    try:
        from gunicorn.workers.base import Worker
    except ImportError:  # pragma: no cover - gunicorn is in the web extra
        return object
    return Worker


class GunicornWorker(_gunicorn_base()):  # type: ignore[misc]
    """``gunicorn -k shmbus.adapters.server.GunicornWorker``: one asyncio loop per worker, no task per poll.

    SIGTERM: graceful (stop accepting, end parked polls, wait up to ``graceful_timeout`` for other responses);
    SIGQUIT/SIGINT: quick. ``max_requests`` (+ jitter) is honoured; heartbeats every second. Options for a
    plain ASGI app come from ``shmbus_options`` in the gunicorn config file (``-c``).
    """

    def init_signals(self) -> None:
        # gunicorn's handlers would run on the loop thread between callbacks anyway; the loop's are precise
        for s in self.SIGNALS:
            signal.signal(s, signal.SIG_DFL)
        signal.signal(signal.SIGUSR1, self.handle_usr1)
        signal.siginterrupt(signal.SIGUSR1, False)

    def _shmbus_options(self) -> dict[str, Any] | None:
        opts = gunicorn_config_value(self, "shmbus_options")
        return dict(opts) if opts else None

    def _limits(self) -> Limits:
        """``shmbus_server = {"header_timeout": 10, ...}`` in the gunicorn config file (see :class:`Limits`)."""
        return Limits.from_mapping(gunicorn_config_value(self, "shmbus_server"))

    def run(self) -> None:
        loop = new_loop()
        asyncio.set_event_loop(loop)
        stop = asyncio.Event()
        self._stop = stop
        self._graceful = True

        def quick() -> None:
            self._graceful = False
            self.alive = False
            stop.set()

        def graceful() -> None:
            self.alive = False
            stop.set()

        loop.add_signal_handler(signal.SIGTERM, graceful)
        loop.add_signal_handler(signal.SIGQUIT, quick)
        loop.add_signal_handler(signal.SIGINT, quick)
        loop.add_signal_handler(signal.SIGABRT, quick)

        def beat() -> None:
            self.notify()
            if self.ppid != os.getppid():
                log.info("shmbus server: parent changed, shutting down")
                graceful()

        socks = [s.sock if hasattr(s, "sock") else s for s in self.sockets]
        try:
            loop.run_until_complete(
                serve(
                    self.wsgi,
                    socks,
                    options=self._shmbus_options(),
                    keepalive=float(self.cfg.keepalive or 2),
                    max_requests=int(self.max_requests or 0) if self.cfg.max_requests else 0,
                    graceful_timeout=float(self.cfg.graceful_timeout),
                    stop=stop,
                    heartbeat=beat,
                    heartbeat_interval=min(1.0, max(self.timeout / 4, 0.1)) if self.timeout else 1.0,
                    backlog=int(self.cfg.backlog),
                    limits=self._limits(),
                )
            )
        except Exception:
            log.exception("shmbus server: worker failed")
            sys.exit(1)
        finally:
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
            for sig in (signal.SIGTERM, signal.SIGQUIT, signal.SIGINT, signal.SIGABRT):
                loop.remove_signal_handler(sig)  # a late signal must not hit the closed loop's wakeup fd
                signal.signal(sig, signal.SIG_IGN)  # exiting anyway
            loop.close()
