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


def alarm(spec: dict) -> None:  # type: ignore[type-arg]
    """A worker whose request timeout is SIGALRM: an exception (every 5th a KeyboardInterrupt) raised at random
    points of its bridged publishes. Prints ``ACK``/``UNKNOWN``/``ERR <payload> ...`` per publish, then ``DONE``
    and waits (alive: a lock it left held stays held) until killed."""
    import faulthandler
    import random
    import signal

    from shmbus import Bus, PublishOutcomeUnknown
    from tests.faults.faults_backends import make_engine

    class Alarm(Exception):
        pass

    armed = [False]
    fired = [0]

    def handler(signum: int, frame: object) -> None:
        if armed[0]:
            fired[0] += 1
            raise KeyboardInterrupt if fired[0] % 5 == 0 else Alarm()

    faulthandler.enable()  # a crash prints every thread's stack on stderr (load run 3: this worker died of SIGSEGV)
    bus = Bus(
        spec["bus"], keepalive_interval=0, engine=make_engine(spec["backend"], relay=False), **spec["bus_options"]
    )
    signal.signal(signal.SIGALRM, handler)
    print("ACK alarm:warm", bus.publish(spec["channel"], "alarm:warm"), flush=True)  # connected once (a PostgreSQL
    # connect outlasts most alarms)
    rng = random.Random(spec.get("seed", 0))
    for i in range(spec["count"]):
        faulthandler.dump_traceback_later(8.0, exit=False)  # a publish that stalls shows where, on stderr
        payload = f"alarm:{i}"
        signal.setitimer(signal.ITIMER_REAL, rng.uniform(0.00005, 0.03))
        try:
            armed[0] = True
            try:
                mid = bus.publish(spec["channel"], payload)
            finally:
                armed[0] = False
        except PublishOutcomeUnknown:
            print("UNKNOWN", payload, flush=True)
        except (Exception, KeyboardInterrupt) as exc:  # Alarm, KeyboardInterrupt: raised before or mid-call
            tag = "UNKNOWN" if isinstance(exc, (Alarm, KeyboardInterrupt)) else "ERR"
            print(tag, payload, type(exc).__name__, flush=True)
        else:
            print("ACK", payload, mid, flush=True)
        signal.setitimer(signal.ITIMER_REAL, 0)
    faulthandler.cancel_dump_traceback_later()
    print("DONE", os.getpid(), flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    {"relay": relay, "cron": cron, "alarm": alarm}[sys.argv[2]](json.loads(sys.argv[1]))
