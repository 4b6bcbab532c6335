"""A child process of a fault scenario (``python faults_node.py <spec json> <role>``).

``relay``: one process of a host, as a web worker is: the host's bus with its bridge engine (it may win the
host's relay election) and a subscription (so its figures reach the segment). It prints ``READY <pid>`` once,
then ``RELAY <pid>`` each time it becomes the host's relay, caught up. The suite SIGKILLs and SIGSTOPs these.

``cron``: point 4 of issue 22, a cron job that attaches the host's bus by name WITHOUT configuring an engine and
publishes ``count`` messages; prints ``ACK <payload> <id>`` for each publish that returned an id, ``ERR <payload>
<exception> <text>`` for each that raised.
"""

from __future__ import annotations

import json
import os
import sys
import time


def relay(spec: dict) -> None:  # type: ignore[type-arg]
    from shmbus import Bus
    from tests.faults.faults_backends import make_engine

    bus = Bus(
        spec["bus"], keepalive_interval=0, engine=make_engine(spec["backend"]), create=True, **spec["bus_options"]
    )
    bus.subscribe("/__faults_worker", lambda msg: None)
    print("READY", os.getpid(), flush=True)
    was = False
    while True:
        now = bus.default.health().get("relay_state") == "relaying"
        if now and not was:
            print("RELAY", os.getpid(), flush=True)
        was = now
        time.sleep(0.01)


def cron(spec: dict) -> None:  # type: ignore[type-arg]
    from shmbus import Bus

    try:
        bus = Bus(spec["bus"], keepalive_interval=0, create=True)
    except Exception as exc:  # refusing to attach without the engine is a clear answer too
        print("ERR", "-", type(exc).__name__, " ".join(str(exc).split())[:400], flush=True)
        return
    for i in range(spec["count"]):
        payload = f"cron:{i}"
        try:
            mid = bus.publish(spec["channel"], payload)
            print("ACK", payload, mid, flush=True)
        except Exception as exc:
            text = " ".join(str(exc).split())[:400]
            print("ERR", payload, type(exc).__name__, text, flush=True)
    bus.close()


if __name__ == "__main__":
    {"relay": relay, "cron": cron}[sys.argv[2]](json.loads(sys.argv[1]))
