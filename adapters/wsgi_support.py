"""What every WSGI shell here shares (the WSGI twin of :mod:`.asgi_support`): its types and plain responses,
what a shell knows about its server, and the one way a bus batch reaches the requests that wait in it.

A WSGI request that waits holds a thread or a greenlet, so both shells ask the same questions: is gevent
patching this process, how many request threads may park (the rest stay free for ordinary requests), has the
client gone (``gunicorn.socket``)? And both hand the listener thread's batches on the same way
(:class:`BatchDispatcher`): through the gevent hub, after a gathering window on a timer thread, or at once.
"""

from __future__ import annotations

import os
import select
import socket
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from shmbus.message import Message

from .http.wire import status_line

__all__ = [
    "PEER_CHECK_INTERVAL",
    "BatchDispatcher",
    "Environ",
    "StartResponse",
    "configure_server",
    "gevent_active",
    "may_park",
    "peer_closed",
    "server_threads",
    "start_simple",
    "start_whole",
]

Environ = dict[str, Any]
StartResponse = Callable[..., Any]

_server: dict[str, Any] = {"threads": None, "worker_class": None}
#: How often a waiting request checks whether its client went away (when the server exposes the socket).
PEER_CHECK_INTERVAL = 1.0


def configure_server(*, threads: int | None = None, worker_class: str | None = None) -> None:
    """Tell the WSGI shells how many request threads this worker process has (the gunicorn hooks do this)."""
    _server["threads"] = threads
    _server["worker_class"] = worker_class


def server_threads() -> int | None:
    threads: int | None = _server["threads"]
    if threads is None:
        env = os.environ.get("SHMBUS_WSGI_THREADS")
        if env and env.isdigit():
            return int(env)
    return threads


def may_park(parked: int) -> bool:
    """May one more request wait in a thread, ``parked`` waiting already? With a known thread count at most
    ``threads - max(1, threads // 8)`` wait at once, so the worker always keeps threads for ordinary requests."""
    threads = server_threads()
    return threads is None or parked < threads - max(1, threads // 8)


def gevent_active() -> bool:
    """True in a gevent-patched process (its ``threading`` is gevent's): waits must go through the hub."""
    monkey = sys.modules.get("gevent.monkey")
    return bool(monkey is not None and monkey.is_module_patched("threading"))


def peer_closed(sock: Any) -> bool:
    """Has the client closed its side of ``sock`` (``gunicorn.socket``)? Checked without blocking."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        if not readable:
            return False
        return bool(sock.recv(1, socket.MSG_PEEK) == b"")
    except (OSError, ValueError):
        return True


def start_whole(
    start_response: StartResponse, status: int, headers: Iterable[tuple[str, str]], body: bytes
) -> list[bytes]:
    """A whole response: ``start_response`` with the headers and ``content-length`` last, then the body."""
    start_response(status_line(status), [*headers, ("content-length", str(len(body)))])
    return [body]


def start_simple(
    start_response: StartResponse,
    status: int,
    body: bytes,
    content_type: str = "text/plain; charset=utf-8",
    extra: Iterable[tuple[str, str]] = (),
) -> list[bytes]:
    """A plain response: ``content-type``, ``content-length``, then the ``extra`` headers (as ASGI's
    :func:`~.asgi_support.send_simple`)."""
    headers = [("content-type", content_type), ("content-length", str(len(body))), *extra]
    start_response(status_line(status), headers)
    return [body]


class BatchDispatcher:
    """One process's hand-off from the bus listener thread to ``deliver(batches)``, which wakes the waiting
    requests. The listener itself never waits:

    * under gevent the batch goes to the hub (one ``loop.async_()`` send per batch) and a greenlet delivers
      every batch queued meanwhile, after ``window`` seconds when it is positive;
    * with threads and a positive ``window`` a timer thread delivers after the window (batches arriving
      meanwhile go with it: one chunk per client);
    * otherwise the listener thread delivers at once.
    """

    def __init__(self, deliver: Callable[[list[list[Message]]], None], window: float = 0.0) -> None:
        self.deliver = deliver
        self.window = window
        self.gevent = gevent_active()
        self.queue: deque[list[Message]] = deque()
        self.lock = threading.Lock()
        self.draining = False
        self.watcher: Any = None
        if self.gevent:
            import gevent

            self.watcher = gevent.get_hub().loop.async_()
            self.watcher.start(self._on_async)
            self._spawn = gevent.spawn

    def on_batch(self, msgs: list[Message]) -> None:
        """Listener thread: hand ``msgs`` on (see the class)."""
        if self.gevent:
            self.queue.append(msgs)
            self.watcher.send()
        elif self.window > 0:
            with self.lock:
                self.queue.append(msgs)
                if self.draining:
                    return
                self.draining = True
            timer = threading.Timer(self.window, self._drain)
            timer.daemon = True
            timer.start()
        else:
            self.deliver([msgs])

    def _on_async(self) -> None:  # in the hub: never block here
        if not self.draining:  # one drain at a time gathers every batch queued meanwhile
            self.draining = True
            self._spawn(self._drain)

    def _drain(self) -> None:
        if self.gevent and self.window > 0:
            import gevent

            gevent.sleep(self.window)
        with self.lock:
            batches = list(self.queue)
            self.queue.clear()
            self.draining = False
        if batches:
            self.deliver(batches)

    def close(self) -> None:
        if self.watcher is not None:
            self.watcher.stop()
