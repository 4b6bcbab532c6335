"""A wait on one of our queues in the main thread ends on Ctrl-C whenever the signal lands.

``_thread.interrupt_main()`` does what a signal landing just before the wait fell asleep does: Python's flag is
set, but no system call is interrupted. An unbounded ``SimpleQueue.get()`` then sleeps on (``shmbus listen`` kept
running after Ctrl-C under load); :func:`shmbus.threads.interruptible_get` raises ``KeyboardInterrupt`` within a
slice. Run in a child process: the test needs a main thread of its own.
"""

from __future__ import annotations

import subprocess
import sys

CHILD = r"""
import _thread, queue, signal, sys, threading, time
from shmbus.threads import interruptible_get{extra}

signal.signal(signal.SIGINT, signal.default_int_handler)  # as at a terminal, even if started with SIGINT ignored

q = queue.SimpleQueue()
rescued = threading.Event()
interrupted = threading.Event()

def interrupt():
    time.sleep(0.3)  # the main thread is (most likely) asleep in the wait by now; either way it must end
    _thread.interrupt_main()
    if not interrupted.wait(20):  # no KeyboardInterrupt by then: wake the wait another way, and say so
        rescued.set()
        q.put("rescue")

threading.Thread(target=interrupt, daemon=True).start()
try:
    got = {wait}
except KeyboardInterrupt:
    interrupted.set()
    print("rescued" if rescued.is_set() else "interrupted")
    sys.exit(0)
print("returned", got)
"""


def run_child(wait: str, extra: str = "") -> str:
    code = CHILD.format(wait=wait, extra=extra)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout.strip()


def test_an_interrupted_wait_ends_with_keyboard_interrupt() -> None:
    assert run_child("interruptible_get(q)") == "interrupted"


def test_an_interrupted_wait_with_a_timeout_ends_too() -> None:
    assert run_child("interruptible_get(q, 60)") == "interrupted"


def test_a_timeout_still_ends_the_wait_with_empty() -> None:
    code = (
        "import queue; from shmbus.threads import interruptible_get\n"
        "try:\n interruptible_get(queue.SimpleQueue(), 0.7)\nexcept queue.Empty:\n print('empty')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout.strip()
    assert out == "empty"
