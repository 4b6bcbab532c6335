"""Concurrent publishers for ``bench_rabbitmq.py``: what a web app does (gunicorn gthread workers: several
threads per process, several processes), each thread calling ``bus.publish`` (or pika's confirmed
``basic_publish``) one message at a time.

:class:`Crew`: threads that live across repeats (a connection per thread, as a worker's thread pool keeps them),
each running its share when told. :class:`Workers`: processes, each a crew of its own (``WORKER`` below), started
once and told to run by a line on stdin; each answers with its wall and CPU seconds (every thread's).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["Crew", "Workers", "process_cpu"]

CHANNEL = "/bench/rmq/crowd"
PAD = "x" * 60


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) a process used so far, from ``/proc`` (0.0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Crew:
    """``size`` threads; ``run(n)`` has each call ``job(k, n // size)`` once, all at once, and returns when all are
    done. ``setup(k)`` runs first in each thread (its connection) and returns what ``job`` gets as ``k``'s state."""

    def __init__(self, size: int, setup: Callable[[int], Any], job: Callable[[Any, int], None]) -> None:
        self.size, self.job = size, job
        self.go = [threading.Event() for _ in range(size)]
        self.done = threading.Semaphore(0)
        self.n = 0
        self.stop = False
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._loop, args=(k, setup), daemon=True) for k in range(size)]
        for t in self.threads:
            t.start()
        for _ in range(size):
            self.done.acquire()
        if self.errors:
            raise self.errors[0]

    def _loop(self, k: int, setup: Callable[[int], Any]) -> None:
        try:
            state = setup(k)
        except BaseException as exc:
            self.errors.append(exc)
            self.done.release()
            return
        self.done.release()
        while True:
            self.go[k].wait()
            self.go[k].clear()
            if self.stop:
                return
            try:
                self.job(state, self.n // self.size)
            except BaseException as exc:
                self.errors.append(exc)
            self.done.release()

    def run(self, n: int) -> None:
        self.n = n
        for e in self.go:
            e.set()
        for _ in range(self.size):
            self.done.acquire()
        if self.errors:
            raise self.errors[0]

    def close(self) -> None:
        self.stop = True
        for e in self.go:
            e.set()
        for t in self.threads:
            t.join(10)


def bridge_crew(bus: Any, size: int) -> Crew:
    """Threads publishing on ``bus`` one message at a time (each thread's first publish opens its connection)."""

    def setup(k: int) -> Any:
        bus.publish(CHANNEL, {"warm": k})
        return k

    def job(k: int, n: int) -> None:  # distinct messages, as requests publish (identical ones may share an id)
        publish, pid = bus.publish, os.getpid()
        for i in range(n):
            publish(CHANNEL, {"p": pid, "k": k, "i": i, "pad": PAD})

    return Crew(size, setup, job)


def pika_crew(url: str, base: str, size: int) -> Crew:
    """Threads publishing the bridge's bodies to ``base`` with pika, each on its own confirming connection."""
    import pika

    body = json.dumps({"p": os.getpid(), "k": 0, "i": 0, "pad": PAD}, separators=(",", ":"))
    data = (CHANNEL + '|{"data":' + body + ',"user_ids":null,"group_ids":null,"client_ids":null}').encode()
    conns: list[Any] = []

    def setup(k: int) -> Any:
        params = pika.URLParameters(url)
        params.heartbeat = 0  # idle between repeats, never pumped meanwhile
        conn = pika.BlockingConnection(params)
        conns.append(conn)
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("", base, data, mandatory=True)
        return ch

    def job(ch: Any, n: int) -> None:
        for _ in range(n):
            ch.basic_publish("", base, data, mandatory=True)

    crew = Crew(size, setup, job)
    close = crew.close

    def close_all() -> None:
        close()
        for conn in conns:
            conn.close()

    crew.close = close_all  # type: ignore[method-assign]
    return crew


WORKER = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import _rmq_crowd as crowd
kind, url, target, bus_name, threads = sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6])
bus = None
if kind == "bridge":
    from shmbus import Bus
    from shmbus.adapters.rabbitmq import RabbitBridge
    bus = Bus(bus_name, keepalive_interval=0, create=True, engine=RabbitBridge(url, stream=target, relay=False))
    crew = crowd.bridge_crew(bus, threads)
else:
    crew = crowd.pika_crew(url, target, threads)
print("READY", flush=True)
for line in sys.stdin:
    n = int(line)
    w0, c0 = time.perf_counter(), time.process_time()
    crew.run(n)
    print(json.dumps({"wall": time.perf_counter() - w0, "cpu": time.process_time() - c0}), flush=True)
crew.close()
if bus is not None:
    bus.close()
"""


class Workers:
    """``count`` processes of ``threads`` publishing threads each (``kind``: "bridge" on bus ``bus_name`` bridged
    to stream ``target``, or "pika" to stream ``target``)."""

    def __init__(self, kind: str, count: int, threads: int, url: str, target: str, bus_name: str) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        here = os.path.dirname(os.path.abspath(__file__))
        argv = [sys.executable, "-c", WORKER, here, kind, url, target, bus_name, str(threads)]
        try:
            for _ in range(count):
                self.procs.append(subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
            for p in self.procs:
                assert p.stdout is not None
                if p.stdout.readline().strip() != "READY":
                    raise RuntimeError(f"a {kind} publishing worker did not start")
        except BaseException:
            self.close()
            raise

    def run(self, n: int) -> tuple[float, float]:
        """``n`` messages in all, shared by every thread of every process: (wall seconds, CPU seconds of all)."""
        share = n // len(self.procs)
        w0 = time.perf_counter()
        for p in self.procs:
            assert p.stdin is not None
            p.stdin.write(f"{share}\n")
            p.stdin.flush()
        cpu = 0.0
        for p in self.procs:
            assert p.stdout is not None
            cpu += json.loads(p.stdout.readline())["cpu"]
        return time.perf_counter() - w0, cpu

    def close(self) -> None:
        for p in self.procs:
            if p.stdin is not None:
                p.stdin.close()
        for p in self.procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
