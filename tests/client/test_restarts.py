"""The client while its server is killed or stopped and started again, again and again, messages being published
all along, on a machine whose cores are taken by two busy loops: every message arrives, once and in order.

The client keeps the Ruby client's ``max_poll_interval`` (180 s) and a long ``callback_interval``, so that a
backoff grown over the restarts, or a pause after a poll a stopping server ended with nothing, is a stall past
the generous bound rather than a delay. Completeness is the verdict, never how soon: a slow machine passes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from shmbus.client import MessageBusClient

from .recorder import Recorder, resolved, wait_until

pytestmark = pytest.mark.slow
SPIN = "while True: pass"
RESTARTS = 10
#: all of them stay in the server's backlog (1000 per channel): a message lost is the client's doing
MESSAGES = 900
#: after the last restart, for the last messages to arrive (a machine however slow; the stall is 120 s or more)
BOUND = 60.0


@pytest.mark.parametrize("kind", ["lean", "uvicorn", "gthread"])
def test_restarts_while_publishing_under_cpu_load(
    procs: Any, new_target: Callable[..., Any], make_client: Callable[..., MessageBusClient], kind: str
) -> None:
    target = new_target(kind, long_polling_interval=25.0)  # the default: no poll ends well between restarts
    client = make_client(target.url, max_poll_interval=180.0, callback_interval=120.0)
    rec = Recorder()
    client.subscribe("/restarts", rec)
    resolved(client, "/restarts")
    for _ in range(2):
        procs.spawn_python(SPIN, stdout=-3, stderr=-3)
    published: list[int] = []
    lock = threading.Lock()
    stop = threading.Event()

    def publish(data: Any) -> int:
        with lock:  # the list in id order
            published.append(target.publish("/restarts", data))
            return published[-1]

    def publisher() -> None:
        while not stop.is_set() and len(published) < MESSAGES - RESTARTS - 10:
            publish(len(published))
            time.sleep(0.01)

    thread = threading.Thread(target=publisher, name="publisher")
    thread.start()
    try:
        for n in range(RESTARTS):
            mark = publish(f"up {n}")
            wait_until(lambda mark=mark: mark in rec.ids, BOUND, f"the client streaming from restart {n}")
            target.stop() if n == RESTARTS - 1 else target.kill()  # SIGKILLs, then a graceful stop
            target.start()
    finally:
        stop.set()
        thread.join()
    for i in range(10):
        publish(f"last {i}")
    deadline = time.monotonic() + BOUND
    while len(rec.messages) < len(published) and time.monotonic() < deadline:
        time.sleep(0.1)
    missing = sorted(set(published) - set(rec.ids))
    assert not missing, (f"{len(missing)} of {len(published)} missing: {missing[:5]}...", client.stats)
    assert rec.ids == published, client.stats
