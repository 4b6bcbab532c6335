"""gunicorn config module for apps using shmbus: ``gunicorn -c python:shmbus.adapters.integrations.gunicorn myapp:app``.

Settings given on the command line override the ones here. What this module provides:

* ``post_fork(server, worker)``: re-arms every bus of the worker (:func:`shmbus.after_fork`: a fresh listener
  thread; also done automatically through ``os.register_at_fork``, so calling it again is harmless) and tells
  the WSGI middleware how many request threads the worker has (:func:`shmbus.adapters.wsgi.configure_server`),
  so long polls never take the last threads.
* ``worker_exit(server, worker)``: closes every bus of the worker (stops its listener, unmaps the segment;
  the bus itself lives on for the other processes).
* defaults: ``worker_class = "gthread"`` with ``threads = 32`` (each parked long poll holds one thread; at most
  28 park at once per worker, the rest are answered at once), ``timeout = 60`` (> the 25 s long-poll
  interval), ``graceful_timeout = 10`` (parked polls end at once on a graceful stop: the lean worker and
  :class:`shmbus.adapters.server.uvicorn_worker.UvicornWorker` answer them and exit within it, instead of gunicorn
  killing a worker that still waits for 25 s polls and logging "Perhaps out of memory?"), ``keepalive = 5``.
  ``SHMBUS_WORKER_CLASS`` and ``SHMBUS_THREADS``
  override the defaults.
* ``control_socket``: one per server, ``gunicorn-<master pid>.ctl`` in ``$XDG_RUNTIME_DIR`` or the temporary
  directory (gunicorn 25+'s default, ``~/.gunicorn/gunicorn.ctl``, is one path for every gunicorn of the user,
  so two apps, or the examples run side by side, took each other's control socket). ``--control-socket``
  overrides it, ``--no-control-socket`` turns it off.

Worker classes and their limits:

=========================================  ==============================================================
``sync``                                   One request at a time: a parked poll would block the worker,
                                           so polls are answered at once (clients poll about every 15 s)
                                           unless the middleware gets ``long_polling_on_sync_workers=True``
                                           (then use many workers and a short ``long_polling_interval``).
                                           The WSGI middleware logs a warning once at start-up there.
``gthread`` (default here)                 One thread per parked poll; ``threads`` bounds concurrent long
                                           polls per worker. Good for a few hundred clients per worker.
``gevent``                                 One greenlet per parked poll (``worker_connections``, default
                                           1000, bounds them); needs ``gevent`` installed. The bus listener
                                           stays a real OS thread (handled by shmbus).
``shmbus.adapters.server.uvicorn_worker.``        Use with :mod:`shmbus.adapters.asgi`; parked polls cost a
``UvicornWorker`` (ASGI)                   coroutine, no thread. uvicorn with request-head and body
                                           deadlines and bounded pipelining; exits within
                                           ``graceful_timeout``. Best for many clients.
``uvicorn.workers.UvicornWorker`` (ASGI)   Use with :mod:`shmbus.adapters.asgi`; parked polls cost a
                                           coroutine, no thread. Best for many clients. (The
                                           ``uvicorn-worker`` package provides ``uvicorn_worker.UvicornWorker``
                                           in newer releases.)
=========================================  ==============================================================

Note gunicorn's own rule: ``--worker-class sync`` with ``threads > 1`` runs ``gthread``; since this module sets
``threads = 32``, pass ``--threads 1`` to get a real sync worker.

Use ``preload_app = True`` freely: the bus attaches lazily and forks cleanly.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

worker_class = os.environ.get("SHMBUS_WORKER_CLASS", "gthread")
threads = int(os.environ.get("SHMBUS_THREADS", "32"))
timeout = 60
graceful_timeout = 10
keepalive = 5
# this module is read once, in the master: its pid names this server's control socket (older gunicorns ignore it)
control_socket = os.path.join(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir(), f"gunicorn-{os.getpid()}.ctl")


def post_fork(server: Any, worker: Any) -> None:
    import shmbus
    from shmbus.adapters.wsgi import configure_server

    shmbus.after_fork()
    cfg = getattr(worker, "cfg", None)
    wclass = str(getattr(cfg, "worker_class_str", "") or type(worker).__name__)
    nthreads = getattr(cfg, "threads", 1) or 1
    if type(worker).__name__ == "ThreadWorker":
        configure_server(threads=int(nthreads), worker_class=wclass)
    else:
        configure_server(threads=None, worker_class=wclass)


def worker_exit(server: Any, worker: Any) -> None:
    from shmbus.forks import live_buses

    for bus in live_buses():
        try:
            bus.close()
        except Exception:  # pragma: no cover - best effort at exit
            pass
