"""The single publish's own connections (``adapters/redis/commands``): a connection the server closed while it was
idle is replaced before the command (as redis-py's pool does), and threads publishing at once each get their own
reply."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import redis

from shmbus import Bus

pytestmark = pytest.mark.redis


def test_a_connection_closed_by_the_server_while_idle_is_replaced(
    redis_server: Any, make_host: Callable[..., Bus]
) -> None:
    """Redis closes idle clients (its ``timeout`` setting, CLIENT KILL, a restart): the next publish must reconnect
    and succeed, not fail with "unreachable" for a command never sent."""
    a = make_host("a", redis_server.url, relay=False)
    a.publish("/k", 0)
    direct = a.default.backend.direct
    (conn,) = direct._idle
    victim = direct.execute("CLIENT", "ID")
    assert direct._idle == [conn]  # the same connection ran both
    assert redis.Redis.from_url(redis_server.url).execute_command("CLIENT", "KILL", "ID", victim) == 1
    for i in range(1, 4):
        assert a.publish("/k", i) == i + 1
    assert [m.data for m in a.backlog("/k")] == [0, 1, 2, 3]


def test_threads_publishing_at_once_each_get_their_own_reply(redis_server: Any, make_host: Callable[..., Bus]) -> None:
    a = make_host("a", redis_server.url, relay=False)
    ids: dict[int, list[int]] = {}
    start = threading.Barrier(8)

    def publisher(t: int) -> None:
        start.wait()
        ids[t] = [a.publish(f"/t{t}", i) or 0 for i in range(150)]

    threads = [threading.Thread(target=publisher, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    for t in range(8):
        assert ids[t] == list(range(1, 151)), t  # each channel's ids, in this thread's order: no reply crossed
    assert int(redis.Redis.from_url(redis_server.url).get("__mb_global_id_n")) == 8 * 150
    assert 1 <= len(a.default.backend.direct._idle) <= 8


def test_a_publish_interrupted_mid_reply_does_not_leave_the_reply_for_the_next(
    redis_server: Any, make_host: Callable[..., Bus], monkeypatch: Any
) -> None:
    """A signal between sending the EVALSHA and reading its reply (KeyboardInterrupt, a worker's timeout): the
    next publish must not read that reply as its own (it would return id 2 for the third message). Two layers
    hold: the interrupted command closes its connection, and a connection readable while idle is replaced."""
    a = make_host("a", redis_server.url, relay=False)
    assert a.publish("/i", 1) == 1
    real = redis.connection.Connection.read_response

    def interrupted(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(redis.connection.Connection, "read_response", interrupted)
    with pytest.raises(KeyboardInterrupt):
        a.publish("/i", 2)  # sent: Redis runs it (the caller cannot know), its reply is never read
    monkeypatch.setattr(redis.connection.Connection, "read_response", real)
    assert a.publish("/i", 3) == 3
