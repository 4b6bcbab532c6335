"""The Python client (shmbus.client) against the gem's Ruby MessageBus::HTTPClient, in one run: how many messages
per second one client takes from a burst, and the client process's CPU per message.

Both clients follow one channel of the same shmbus server (the lean gunicorn worker, streaming, the clients'
defaults) from its current id; the benchmark publishes the burst straight into the bus and times from the first
publish until the client has counted every message, reading the client's CPU (utime + stime, every thread) from
/proc. Runs alternate between the two clients. Every run checks the count (a lost message would hang it until
the timeout, then the run is reported as broken).

Full: 50,000 messages, 3 runs each. ``--quick``: 5,000, 1 run. The Ruby client needs Ruby and the gem's checkout
(``MESSAGE_BUS_GEM_DIR``); without them ours is measured alone and the ratio is not printed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from typing import Any

import _common as c
import _http_load as load
from bench_http_cost import cpu_seconds

QUICK_TIMEOUT = 90
FULL_TIMEOUT = 900
CHANNEL = "/bench/client"
PERF = os.path.dirname(os.path.abspath(__file__))

PY_CLIENT = """
import sys, threading
from shmbus.client import MessageBusClient
url, channel, last_id, want = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
got, done = [0], threading.Event()
def take(msg):
    got[0] += 1
    if got[0] == want:
        done.set()
with MessageBusClient(url) as client:
    client.subscribe(channel, take, last_id)
    print("ready", flush=True)
    done.wait()
    print("done", flush=True)
"""


def gem_dir() -> str | None:
    path = os.environ.get("MESSAGE_BUS_GEM_DIR", "")
    ok = shutil.which("ruby") and os.path.isfile(os.path.join(path, "lib", "message_bus", "http_client.rb"))
    return path if ok else None


def one_run(argv: list[str], env: dict[str, str], bus: Any, n: int, timeout: float) -> tuple[float, float, float]:
    """(messages per second, CPU µs per message) of one client taking an ``n``-message burst, and the rate the
    burst was published at (the ceiling of the first figure)."""
    last = bus.last_id(CHANNEL)
    proc = subprocess.Popen(
        [*argv, str(last), str(n)], stdout=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    try:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"client did not start: {argv}")
        time.sleep(1.5)  # its first poll is parked on the server
        cpu0, t0 = cpu_seconds([proc.pid]), time.perf_counter()
        for i in range(n):
            bus.publish(CHANNEL, {"n": i, "pad": "x" * 40}, max_backlog_size=n + 1000)
        published = time.perf_counter() - t0
        deadline = time.monotonic() + timeout
        line = proc.stdout.readline().strip()
        took = time.perf_counter() - t0
        cpu = cpu_seconds([proc.pid]) - cpu0
        if line != "done" or time.monotonic() > deadline:
            raise RuntimeError(f"client did not count {n} messages: {line!r}")
        return n / took, cpu / n * 1e6, n / published
    finally:
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> int:
    args = c.parse_args(__doc__)
    n = 5_000 if args.quick else 50_000
    repeats = args.repeats or (1 if args.quick else 3)
    rep = c.Report("bench_client", f"one HTTP client taking a {n:,}-message burst (shmbus lean server)", args)
    bus, server = load.bench_server("client", 10, native=True)
    url = f"http://127.0.0.1:{server.port}"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([c.REPO, os.environ.get("PYTHONPATH", "")]))
    clients = {"shmbus.client (Python)": [sys.executable, "-c", PY_CLIENT, url, CHANNEL]}
    gem = gem_dir()
    if gem:
        env["MESSAGE_BUS_GEM_DIR"] = gem
        clients["MessageBus::HTTPClient (Ruby)"] = ["ruby", os.path.join(PERF, "_ruby_burst_client.rb"), url, CHANNEL]
    else:
        rep.notes.append("Ruby client not measured: no ruby, or MESSAGE_BUS_GEM_DIR names no gem checkout")
    rates: dict[str, list[float]] = {k: [] for k in clients}
    cpus: dict[str, list[float]] = {k: [] for k in clients}
    publishing: list[float] = []
    try:
        for r in range(repeats):
            for name, argv in clients.items():
                rate, cpu, pub = one_run(argv, env, bus, n, timeout=120 if args.quick else 600)
                publishing.append(pub)
                rates[name].append(rate)
                cpus[name].append(cpu)
                rep.log(f"run {r + 1}: {name}: {rate:,.0f} msgs/s, {cpu:.1f} µs CPU/msg")
    finally:
        server.stop()
        bus.destroy()
    ruby = "MessageBus::HTTPClient (Ruby)"
    for name in clients:
        base = [f"{ruby} rate"] if gem and name != ruby else []
        rep.add(f"{name} rate", rates[name], "msgs/s", baselines=base)
        base = [f"{ruby} CPU"] if gem and name != ruby else []
        rep.add(f"{name} CPU", cpus[name], "µs/msg", higher_is_better=False, baselines=base)
    rep.add("the burst's publishing (the rates' ceiling)", publishing, "msgs/s")
    rep.notes.append(
        "rate: burst published into the bus until the client counted the last message; CPU: the client process "
        "(utime + stime of every thread) over the same span, per message"
    )
    rep.emit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
