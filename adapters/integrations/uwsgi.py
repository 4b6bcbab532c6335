"""uWSGI glue: ``import shmbus.adapters.integrations.uwsgi`` in the app module (after creating the bus).

When running under uWSGI (``uwsgidecorators`` importable) this registers a ``postfork`` hook that re-arms
every bus (:func:`shmbus.after_fork`, a no-op when ``os.register_at_fork`` already did it) and reports the
worker's thread count to the WSGI middleware, and an ``atexit`` hook closing the buses. Outside uWSGI,
importing it does nothing.

Limits and required options:

* ``--enable-threads`` (or ``--threads N``) is **required**: the bus listener is a Python thread; without it
  uWSGI never runs it and no message reaches a waiting client.
* Without ``--threads`` (or gevent) a worker serves one request at a time, so the middleware answers polls at
  once (as ``dlp=t``) unless ``long_polling_on_sync_workers=True``; see :mod:`shmbus.adapters.wsgi`.
* With ``--threads N`` each parked poll holds a thread; at most ``N - max(1, N // 8)`` park per worker.
* ``--gevent N`` works like gunicorn's gevent worker (monkey-patch with ``--gevent-monkey-patch``).
* Streaming: uWSGI does not chunk a WSGI response body, so a streamed poll is delimited by connection close
  (the JS and Ruby clients split on ``\r\n|\r\n`` and accept that); behind nginx + the uwsgi protocol set
  ``uwsgi_buffering off`` for ``/message-bus/``.
* Tested in ``tests/web/test_uwsgi.py`` (``--http``, master, 2 preforked workers, 8 threads each).
"""

from __future__ import annotations

from typing import Any

__all__ = ["installed"]

installed = False


def _postfork() -> None:
    import shmbus
    from shmbus.adapters.wsgi import configure_server

    shmbus.after_fork()
    try:
        import uwsgi

        threads = int(uwsgi.opt.get("threads", 0) or 0)
    except Exception:
        threads = 0
    configure_server(threads=threads if threads > 1 else None, worker_class="uwsgi")


def _atexit() -> None:
    from shmbus.forks import live_buses

    for bus in live_buses():
        try:
            bus.close()
        except Exception:
            pass


def _install() -> bool:
    try:
        import uwsgi
        from uwsgidecorators import postfork
    except ImportError:
        return False
    postfork(_postfork)
    prev: Any = getattr(uwsgi, "atexit", None)

    def chained() -> None:
        _atexit()
        if callable(prev):
            prev()

    uwsgi.atexit = chained
    return True


installed = _install()
