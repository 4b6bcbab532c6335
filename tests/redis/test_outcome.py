"""A Redis publish's outcome (issue 31, items 3 and 7): an interrupted publish says its outcome is unknown (never an
error with an empty reason), a Ctrl-C propagates and leaves the connection safe, bookkeeping that fails after
Redis acknowledged never turns the id into an error, and health says "stalled" while a publish waits."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from shmbus import Bus, PublishOutcomeUnknown

from .bridge_util import wait_for

pytestmark = pytest.mark.redis


class Alarm(Exception):
    """What a worker's SIGALRM handler raises (a request timeout)."""


@pytest.fixture
def alarm() -> Iterator[Callable[[type[BaseException], float], None]]:
    """``alarm(exc_type, seconds)``: SIGALRM raises ``exc_type`` in the main thread after ``seconds``."""
    previous = signal.getsignal(signal.SIGALRM)

    def arm(exc_type: type[BaseException], seconds: float) -> None:
        def handler(signum: int, frame: Any) -> None:
            raise exc_type()

        signal.signal(signal.SIGALRM, handler)
        signal.setitimer(signal.ITIMER_REAL, seconds)

    yield arm
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("interrupt", [Alarm, KeyboardInterrupt])
def test_a_publish_interrupted_while_waiting_for_its_reply(
    redis_server: Any, make_host: Callable[..., Bus], alarm: Any, interrupt: type[BaseException]
) -> None:
    """Redis frozen, so the EVALSHA is sent and its reply cannot come; SIGALRM then raises. An ``Exception`` from
    the handler becomes PublishOutcomeUnknown naming it (it was "refused the publish: " with an empty reason); a
    ``KeyboardInterrupt`` propagates as it is. Either way the message was stored (Redis runs it on thaw) and the
    next publish reads its own reply."""
    a = make_host("a", redis_server.url, relay=False)
    assert a.publish("/i", "warm") == 1  # the connection is open: what follows is sent at once
    redis_server.freeze()
    try:
        alarm(interrupt, 0.3)
        with pytest.raises(BaseException) as info:
            a.publish("/i", "interrupted")
    finally:
        redis_server.thaw()
    if interrupt is Alarm:
        exc = info.value
        assert isinstance(exc, PublishOutcomeUnknown), repr(exc)
        assert (exc.channel, exc.backend, exc.sent) == ("/i", "redis", True)
        assert isinstance(exc.cause, Alarm) and exc.__cause__ is exc.cause
        assert "Alarm" in str(exc) and "may or may not" in str(exc)
    else:
        assert type(info.value) is KeyboardInterrupt
    assert a.publish("/i", "next") == 3  # not 2: the interrupted one's reply was not taken for this one's
    r = redis.Redis.from_url(redis_server.url, protocol=2)
    assert int(r.get("__mb_global_id_n")) == 3


def test_bookkeeping_that_fails_after_the_ack_does_not_fail_the_publish(
    redis_server: Any, make_host: Callable[..., Bus]
) -> None:
    """The segment's lock held (as by a stopped process) while a bridged publish lands and counts itself: Redis
    acknowledged, so publish returns the id (it raised BusLockTimeout, and a retry published twice)."""
    a = make_host("a", redis_server.url, relay=False, bus_options={"lock_timeout": 0.2})
    assert a.publish("/l", 0) == 1
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        a.segment._lock()
        held.set()
        release.wait(60)
        a.segment._unlock()

    t = threading.Thread(target=holder)
    t.start()
    held.wait(10)
    try:
        assert a.publish("/l", 1) == 2
    finally:
        release.set()
        t.join(10)
    r = redis.Redis.from_url(redis_server.url, protocol=2)
    assert int(r.get("__mb_global_id_n")) == 2


def test_health_says_stalled_while_a_publish_waits(redis_server: Any, make_host: Callable[..., Bus]) -> None:
    """Redis frozen while a publish waits for its reply: health() reported the last outcome ("ok") until the
    timeout; now it says "stalled" once the oldest waiting publish passed ``stall_after``, and "ok" after."""
    a = make_host("a", redis_server.url, relay=False, socket_timeout=60)
    engine = a.default
    engine.status.calls.stall_after = 0.2
    assert a.publish("/s", 0) == 1
    got: list[Any] = []
    redis_server.freeze()
    try:
        t = threading.Thread(target=lambda: got.append(a.publish("/s", 1)))
        t.start()
        wait_for(lambda: engine.health()["state"] == "stalled", what="health says stalled")
        health = engine.health()
        assert health["calls_waiting"] == 1 and health["oldest_call_seconds"] >= 0.2 and "waited" in health["error"]
    finally:
        redis_server.thaw()
    t.join(30)
    assert got == [2]
    assert engine.health()["state"] == "ok" and engine.health()["calls_waiting"] == 0


def test_a_publish_interrupted_anywhere_leaves_no_call_waiting(
    redis_server: Any, make_host: Callable[..., Bus], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exception raised at each place of a bridged publish where a signal handler's can land (Celery's soft time
    limit, SIGALRM): the publish returns or raises, and health() counts no call still waiting (a token lost between
    ``begin()`` returning and the ``try`` made health say "stalled" for good in that process)."""
    from tests.core.test_interrupted_writers import run_injected

    a = make_host("a", redis_server.url, relay=False)
    engine = a.default
    assert a.publish("/i", 0) == 1  # connected
    # what follows the ack (landing in the segment, counting) is the segment's, tested in tests/core; here each
    # injection would leave it a repair to run under the tracer
    monkeypatch.setattr(engine, "_acknowledged", lambda *args: None)
    monkeypatch.setattr(a.segment, "count_published", lambda *args: None)
    n, injected = 0, True
    while injected:
        n += 1
        injected = run_injected(lambda n=n: a.publish("/i", n), n)
        assert engine.status.calls.started == {}, (n, engine.status.calls.started)
    assert n > 20, f"only {n} places: the injection reached too little of the publish"
    assert engine.health()["calls_waiting"] == 0 and a.publish("/i", "after") is not None
