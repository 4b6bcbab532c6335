"""HTTP-level variant: a message_bus client polls host A, then host B with its last id (WSGI, in process)."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any
from wsgiref.util import setup_testing_defaults

import pytest

from shmbus import Bus
from tests import harness

from .bridge_util import wait_for, wait_relaying

wsgi = harness.require_module("shmbus.adapters.wsgi")
pytestmark = pytest.mark.redis


def _poll(bus: Bus, channel: str, last: int) -> list[dict[str, Any]]:
    """One short poll (dlp=t) of the gem's protocol: POST /message-bus/<client>/poll with ``channel=last``."""
    app = wsgi.MessageBusMiddleware(bus=bus)
    body = f"{channel}={last}".encode()
    env: dict[str, Any] = {}
    setup_testing_defaults(env)
    env.update(
        REQUEST_METHOD="POST",
        PATH_INFO="/message-bus/client1/poll",
        QUERY_STRING="dlp=t",
        CONTENT_TYPE="application/x-www-form-urlencoded",
        CONTENT_LENGTH=str(len(body)),
    )
    env["wsgi.input"] = io.BytesIO(body)
    status: list[str] = []
    out = b"".join(app(env, lambda s, h, e=None: status.append(s)))
    assert status == ["200 OK"], (status, out)
    return json.loads(out)  # type: ignore[no-any-return]


def test_client_hopping_hosts_over_http(redis_server: Any, make_host: Callable[..., Bus]) -> None:
    a, b = make_host("a", redis_server.url), make_host("b", redis_server.url)
    wait_relaying(a, b)
    last, seen = 0, []
    for rnd in range(6):
        for k in range(4):
            (b if k % 2 else a).publish("/h", f"{rnd}.{k}")
        poll = a if rnd % 2 else b
        wait_for(lambda p=poll, n=4 * (rnd + 1): p.last_id("/h") == n, what="relay")
        for m in _poll(poll, "/h", last):
            if m["channel"] == "/h":
                seen.append((m["message_id"], m["data"]))
                last = m["message_id"]
    assert seen == [(i + 1, f"{i // 4}.{i % 4}") for i in range(24)]
