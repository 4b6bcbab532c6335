"""The client against servers configured against it, or killed under it: chunking off, long polling off, a
restart, and a new process resuming from persisted positions (a server of each kind per test)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from shmbus.client import MessageBusClient

from .recorder import Recorder, resolved, wait_until
from .servers import KINDS, Target

pytestmark = pytest.mark.slow
MakeClient = Callable[..., MessageBusClient]
NewTarget = Callable[..., Target]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("off", ["chunked_encoding_enabled", "long_polling_enabled"])
def test_a_server_with_chunking_or_long_polling_off(
    new_target: NewTarget, make_client: MakeClient, kind: str, off: str
) -> None:
    target = new_target(kind, **{off: False})
    client = make_client(target.url, callback_interval=0.5)
    rec = Recorder()
    client.subscribe("/off", rec)
    resolved(client, "/off")
    ids = [target.publish("/off", i) for i in range(3)]
    rec.wait(3)
    assert rec.ids == ids
    if off == "long_polling_enabled":  # answered at once with nothing: paced by callback_interval, not a loop
        time.sleep(0.6)
        polls = client.stats.polls
        time.sleep(2.0)
        assert client.stats.polls - polls <= 2.0 / 0.5 + 1, client.stats


@pytest.mark.parametrize("kind", KINDS)
def test_the_server_killed_and_restarted(new_target: NewTarget, make_client: MakeClient, kind: str) -> None:
    target = new_target(kind)
    client = make_client(target.url, max_poll_interval=0.5)
    rec = Recorder()
    client.subscribe("/restart", rec)
    resolved(client, "/restart")
    before = [target.publish("/restart", f"before {i}") for i in range(2)]
    rec.wait(2)
    target.kill()
    wait_until(lambda: client.stats.failures >= 2, what="the client to notice the outage")
    while_down = [target.publish("/restart", f"down {i}") for i in range(2)] if target.bus else []
    target.start()
    after: list[int] = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not (after and rec.data[-1] == f"after {len(after) - 1}"):
        after.append(target.publish("/restart", f"after {len(after)}"))
        time.sleep(0.2)
    time.sleep(0.5)
    if target.bus is not None:  # the bus outlived its server: nothing is lost at all, nothing twice
        assert rec.ids == before + while_down + after
    else:  # the gem's memory backend restarts empty (ids from 1 again): all published after the restart, once
        assert rec.data == [f"before {i}" for i in range(2)] + [f"after {i}" for i in range(len(after))]
        assert [m.message_id for m in rec.messages[2:]] == after


RESUME = """
import json, sys, threading
from shmbus.client import MessageBusClient
url, positions, want = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
got, done = [], threading.Event()
def take(msg):
    got.append(msg.message_id)
    if len(got) >= want:
        done.set()
with MessageBusClient(url, positions=positions, callback_interval=0.3) as client:
    client.subscribe("/resume", take, None if positions else 0)
    done.wait(20)
    client.pause()  # what the callbacks had is what the positions say; nothing after
    print(json.dumps({"got": got, "positions": client.positions}), flush=True)
"""


@pytest.mark.parametrize("kind", KINDS)
def test_positions_persisted_and_resumed_in_a_new_process(procs: Any, new_target: NewTarget, kind: str) -> None:
    target = new_target(kind)
    first = [target.publish("/resume", i) for i in range(3)]

    def run(positions: dict[str, int], want: int) -> dict[str, Any]:
        proc = procs.spawn_python(RESUME, target.url, json.dumps(positions), str(want), stdout=-1, text=True)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out
        return dict(json.loads(out.strip().splitlines()[-1]))

    one = run({}, 3)
    assert one["got"] == first and one["positions"] == {"/resume": first[-1]}
    second = [target.publish("/resume", i) for i in range(3, 5)]  # published while no client runs
    two = run(one["positions"], 2)
    assert two["got"] == second and two["positions"] == {"/resume": second[-1]}


IMPORT_ONLY = """
import builtins, os, sys
import posix_ipc

def refuse(*args, **kwargs):
    raise AssertionError(f"shared memory touched: {args}")

def guard(opener):
    def guarded(path, *args, **kwargs):
        if str(path).startswith("/dev/shm"):
            refuse(path)
        return opener(path, *args, **kwargs)
    return guarded

posix_ipc.SharedMemory = posix_ipc.Semaphore = refuse
os.open, builtins.open = guard(os.open), guard(builtins.open)
import shmbus.client
client = shmbus.client.MessageBusClient("http://127.0.0.1:9/forum")
client.subscribe("/x", print)
print("ok", client.core.poll_url)
"""


def test_import_touches_no_bus_and_needs_no_dev_shm(procs: Any) -> None:
    proc = procs.spawn_python(IMPORT_ONLY, stdout=-1, stderr=-1, text=True)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert out.startswith("ok http://127.0.0.1:9/forum/message-bus/")


@pytest.mark.parametrize("kind", KINDS)
def test_a_real_server_sends_its_first_chunk_in_time(new_target: NewTarget, make_client: MakeClient, kind: str) -> None:
    """Long polls held longer than ``first_chunk_timeout``: every server writes its first chunk at once, so the
    client never takes it for a buffering proxy (and keeps streaming)."""
    target = new_target(kind, long_polling_interval=3.0)
    client = make_client(target.url, first_chunk_timeout=0.5)
    rec = Recorder()
    client.subscribe("/held", rec)
    resolved(client, "/held")
    time.sleep(2.0)  # a long poll is held well past the first-chunk deadline
    mid = target.publish("/held", "late")
    rec.wait(1)
    stats = client.stats
    assert rec.ids == [mid] and stats.chunked_fallbacks == 0 and stats.failures == 0, stats
