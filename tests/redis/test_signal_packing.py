"""A signal handler that raises while redis-py packs a command never crashes the process.

With hiredis installed, redis-py packs commands in C (``hiredis.pack_command``), which converts an int or float with
``PyObject_Repr``; that call first runs pending signal handlers and, when one raises, returns NULL, which
``pack_command`` does not check: SIGSEGV (the ``signal_in_publish`` fault scenario's worker died of it under
load). The publish path sends numbers as bytes (``commands.wire_args``), so nothing reaches that call.

The child arms a CPU-time timer (``ITIMER_VIRTUAL``: it advances only while the process runs, so a loaded machine
cannot make it fire early) that lands inside a long ``pack_command``; the handler raises once the C code is done.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("hiredis")

CHILD = r"""
import signal, sys
import hiredis
from shmbus.adapters.redis.commands import wire_args

class Alarm(Exception):
    pass

def handler(signum, frame):
    raise Alarm

signal.signal(signal.SIGVTALRM, handler)
args = ("EVALSHA",) + (b"x",) * 2_000_000 + (7, 1.5)  # the numbers come last: the signal is pending by then
packed = {pack}  # before the timer: the signal must land in C, inside pack_command (what redis-py calls)
for _ in range(3):
    signal.setitimer(signal.ITIMER_VIRTUAL, 0.005)
    try:
        out = hiredis.pack_command(packed)
    except Alarm:
        print("alarm", flush=True)
    else:
        print("packed", flush=True)
    signal.setitimer(signal.ITIMER_VIRTUAL, 0)
"""


def run_child(pack: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", CHILD.format(pack=pack)], capture_output=True, text=True, timeout=120)


def test_numbers_sent_as_bytes_survive_a_signal_mid_pack() -> None:
    done = run_child("wire_args(args)")
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.split() == ["alarm"] * 3  # raised as soon as the packing returned, as a Python exception


def test_wire_args_leaves_nothing_for_pack_command_to_repr() -> None:
    from shmbus.adapters.redis.commands import wire_args

    assert wire_args(("EVALSHA", 7, b"x", 1.5, "s")) == ("EVALSHA", b"7", b"x", b"1.5", "s")


def test_the_publish_path_hands_redis_py_no_number() -> None:
    import redis

    from shmbus.adapters.redis.commands import DirectCommands

    sent: list[tuple[object, ...]] = []

    class Conn:
        def send_command(self, *args: object) -> None:
            sent.append(args)

        def pack_commands(self, commands: list[tuple[object, ...]]) -> bytes:
            sent.extend(commands)
            return b""

        def send_packed_command(self, packed: bytes) -> None:
            pass

    direct = DirectCommands(redis.Redis())  # never connects: the connection is the recorder above
    direct._take = Conn  # type: ignore[method-assign]
    direct._read = lambda conn, count, single: [None] * count  # type: ignore[method-assign]
    direct.execute("EVALSHA", "sha", 7, b"line", 30, 1.5)
    direct.execute_many([("EVALSHA", "sha", 2, b"a"), ("PUBLISH", "c", 5)])
    assert sent and not [a for args in sent for a in args if isinstance(a, (int, float))], sent
