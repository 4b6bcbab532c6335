"""What a connection and a worker may cost (:class:`Limits`), and reading them from a gunicorn config."""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import MutableMapping
from dataclasses import dataclass, fields
from typing import Any

log = logging.getLogger("shmbus.adapters.server")

#: Largest request head (request line + headers) accepted; larger gets ``431`` and a close.
MAX_HEAD_SIZE = 64 * 1024
#: Request body bytes buffered for a bridged (ASGI) request the app has not read yet before reading pauses.
MAX_BUFFERED = 256 * 1024
#: Input is fed to the parser in pieces of this size, so that pipelined requests stop being parsed (and queued)
#: soon after one is waiting behind the request being answered, whatever one read delivers.
FEED_STEP = 2048


@dataclass(frozen=True)
class Limits:
    """What one connection, and one worker, may cost: the server's defence against hostile clients.

    Every limit is per worker process. Exceeding one gets the status below, then a lingering close (the
    response is written, the write side shut down, and input drained for ``linger`` seconds, so the client
    reads the response rather than a reset).
    """

    #: Seconds from a request's first byte to the end of its head (slowloris): ``408``.
    header_timeout: float = 15.0
    #: Seconds from the end of a head to the end of its body, while the server is reading it: ``408``.
    body_timeout: float = 30.0
    #: Pipelined input held while a request is parked or answered; reading pauses beyond it.
    max_pipeline_bytes: int = 64 * 1024
    #: Open connections per worker; one more gets ``503`` and is closed.
    max_connections: int = 10_000
    #: Largest request body for routes served by the wrapped ASGI app (message-bus routes use the
    #: middleware's ``max_body_size``): ``413``.
    max_body_size: int = 64 << 20
    #: Largest request head (request line and headers): ``431``.
    max_head_size: int = MAX_HEAD_SIZE
    #: Seconds an error response's connection keeps draining input before it is closed.
    linger: float = 2.0
    #: Largest incoming WebSocket message (the UvicornWorker's uvicorn ``ws_max_size``): a frame whose length says
    #: more is refused with close code 1009 as soon as the length is read, before any of it is buffered. The
    #: WebSocket transports' own ``max_frame`` (64 KiB) by default.
    max_ws_frame: int = 64 * 1024

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"server limit {f.name} must be a number > 0, got {v!r}")

    @classmethod
    def from_mapping(cls, values: MutableMapping[str, Any] | dict[str, Any] | None) -> Limits:
        """From a config mapping (gunicorn's ``shmbus_server``): unknown names are an error, not ignored."""
        values = dict(values or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise TypeError(f"unknown server limit(s) {unknown}; known: {sorted(known)}")
        return cls(**values)


def gunicorn_config_value(worker: Any, name: str) -> Any:
    """A shmbus setting (``shmbus_options``, ``shmbus_server``) from the worker's gunicorn config file, or None.

    gunicorn refuses unknown settings on its command line but keeps a config file's other names to itself; this
    reads them back (a ``python:module`` config too).
    """
    path = getattr(worker.cfg, "config", None)
    if not path:
        return None
    try:
        if path.startswith("python:"):
            ns = vars(importlib.import_module(path[len("python:") :]))
        elif not os.path.exists(path):
            return None  # gunicorn's default ./gunicorn.conf.py, absent
        else:
            ns = worker.app.get_config_from_filename(path)
    except Exception:
        log.exception("shmbus server: could not read %s from %s", name, path)
        return None
    return ns.get(name)
