"""A lean HTTP/1.1 server for the message bus: parked polls cost a few hundred bytes, not a task and a scope.

Why: under uvicorn every open request carries h11/httptools protocol objects, an ASGI task with its
coroutines and a scope dict (~10 KB), and the ASGI middleware adds ~4 KB per parked poll. Here message-bus
routes are served natively from ``asyncio.Protocol`` callbacks through the sans-IO core
(:mod:`shmbus.adapters.http`): a parked poll is this module's connection object and its ``ParkedPoll``
(``__slots__``) and the core's :class:`~shmbus.adapters.http.Waiter`; bytes go straight to the transport. Every other
request goes to the wrapped ASGI app through a minimal ASGI bridge (:mod:`shmbus.adapters.server.asgi_bridge`).

Use it through gunicorn::

    gunicorn -k shmbus.adapters.server.GunicornWorker -w 2 myapp:app

where ``myapp:app`` is a :class:`shmbus.adapters.asgi.MessageBusMiddleware` (its bus, options and wrapped
app are used natively), or any ASGI app plus ``shmbus_options = {"bus": "name", **middleware options}`` in
the gunicorn config file (``-c conf.py``). Without either, it is a plain ASGI server. Or standalone (forks
``--workers`` processes after binding): ``python -m shmbus.adapters.server myapp:app --bind 127.0.0.1:8000``.

HTTP: keep-alive, pipelined requests answered one at a time in order, ``Expect: 100-continue`` (bus routes:
answered before the body is read; refused with ``413`` and a close when the declared body is over
``max_body_size``), HTTP/1.0 (never chunked; keep-alive only when asked), a 64 KiB limit on a request head
(``431``), malformed requests get ``400`` and a close, an idle keep-alive connection is closed after
``keepalive`` seconds. A client that disconnects is unregistered at once (``connection_lost``). A streaming
client that stops reading: while the transport is paused nothing more is taken from the core, which drops the
client once ``max_stream_buffer`` bytes are queued for it; the connection is then aborted. ``TCP_NODELAY`` is
set on every accepted TCP socket. Hostile clients are bounded by :class:`Limits` (a request head must arrive within
``header_timeout``, a body within ``body_timeout``: ``408``; pipelined input is held to ``max_pipeline_bytes``
while a request is answered, reading pauses beyond it; at most ``max_connections`` per worker: ``503``; bodies over
``max_body_size``: ``413``; chunked bodies on message-bus routes: ``411``), and every error response is followed by
a lingering close, so the client reads it instead of a connection reset. Parses with ``httptools`` when
importable, else with a small strict parser
(:mod:`shmbus.adapters.server.parser`). Limitations: no TLS, no WebSocket or other upgrades (an upgrade request
is served as plain HTTP and the connection closed), lookups that are coroutine functions make every bus request
go through the ASGI bridge (the middleware's own path: correct, not lean).
"""

from __future__ import annotations

from .limits import FEED_STEP, MAX_BUFFERED, MAX_HEAD_SIZE, Limits, gunicorn_config_value
from .parser import PARSER
from .serve import serve
from .server import Server
from .worker import GunicornWorker

__all__ = [
    "FEED_STEP",
    "MAX_BUFFERED",
    "MAX_HEAD_SIZE",
    "PARSER",
    "GunicornWorker",
    "Limits",
    "Server",
    "gunicorn_config_value",
    "serve",
]
