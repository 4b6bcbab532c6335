"""Closing a bus while other threads of the process use it: typed errors, never a crash.

The segment's mutex and futex are raw addresses in the mapping; a close that unmapped it under a publish that had
passed its attachment check was a segfault (seen in an admin test's teardown: the admin feed thread publishing
while the test closed the bus). Run in a child process, so a crash is a failed test and not a dead worker.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from shmbus import errors

CHILD = textwrap.dedent(
    """
    import json, sys, threading, time
    from shmbus import Bus

    name, rounds = sys.argv[1], int(sys.argv[2])
    seen = {}

    for _ in range(rounds):
        bus = Bus(name, keepalive_interval=0, create=True, ring_size=1 << 16, max_channels=64)
        stop = threading.Event()

        def hammer():
            while not stop.is_set():
                try:
                    bus.publish("/race", "x")
                    bus.last_id("/race")
                    bus.backlog("/race", 0)
                except Exception as exc:
                    seen[type(exc).__name__] = seen.get(type(exc).__name__, 0) + 1

        threads = [threading.Thread(target=hammer) for _ in range(3)]
        for t in threads:
            t.start()
        time.sleep(0.01)
        bus.destroy()  # close (unmap in this process) and remove, while three threads publish and read
        stop.set()
        for t in threads:
            t.join()
    print(json.dumps(seen))
    """
)


def test_closing_under_publishing_threads_raises_typed_errors_and_never_crashes(bus_name: str) -> None:
    proc = subprocess.run([sys.executable, "-c", CHILD, bus_name, "30"], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"child died with {proc.returncode}:\n{proc.stderr[-3000:]}"
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    typed = {name for name in seen if isinstance(getattr(errors, name, None), type)}
    assert set(seen) <= typed, f"untyped errors from a closed bus: {seen}"
