#!/usr/bin/env python3
"""Web Push: pushes per second and CPU per push of the push connector fanning one message out to N devices
(10,000; --quick: 200), against a loop of plain ``pywebpush.webpush()`` calls to the same push service, same run.

Both encrypt every push (RFC 8291: a fresh key pair per push) and sign VAPID; the connector signs one token per
push service and keeps connections alive across 4 workers, ``webpush()`` signs and connects per call. The push
service is the development push service (``shmbus.adapters.push.devservice``, the tests' RFC 8030 peer) in
count-only mode, in its own process, so its CPU is not counted: CPU per push is this process's (every thread's)
user+system time over the pushes made.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any

import _common as c

QUICK_TIMEOUT = 120
FULL_TIMEOUT = 900
CHANNEL = "/bench/push"
WARM = "/bench/warm"


def cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def accepted(origin: str) -> int:
    with urllib.request.urlopen(origin + "/count", timeout=10) as r:
        return int(json.loads(r.read())["accepted"])


def subscriptions(origin: str, n: int) -> list[dict[str, Any]]:
    """n browser-side subscriptions (real P-256 keys and auth secrets, as a browser makes them)."""
    import base64

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    out = []
    for i in range(n):
        point = (
            ec.generate_private_key(ec.SECP256R1())
            .public_key()
            .public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)
        )
        out.append({"endpoint": f"{origin}/push/d{i}", "keys": {"p256dh": b64(point), "auth": b64(os.urandom(16))}})
    return out


def run_connector(bus: Any, origin: str, n: int, rep: c.Report, channel: str = CHANNEL) -> tuple[float, float]:
    """One message to the n devices of ``channel``: (pushes/s, CPU µs per push)."""
    base = accepted(origin)
    t0, c0 = time.perf_counter(), cpu()
    bus.publish(channel, {"text": "bench", "at": time.time()})
    deadline = time.monotonic() + 600
    while accepted(origin) - base < n:
        if time.monotonic() > deadline:
            raise RuntimeError("pushes did not arrive")
        time.sleep(0.05)  # polling costs this process CPU: rarely (the wall time is within 50 ms of 5+ s)
    wall, spent = time.perf_counter() - t0, cpu() - c0
    rep.log(f"connector: {n} pushes in {wall:.2f} s, {spent / n * 1e6:.0f} µs CPU each")
    return n / wall, spent / n * 1e6


def run_pywebpush(subs: list[dict[str, Any]], vapid: Any, origin: str, rep: c.Report) -> tuple[float, float]:
    from pywebpush import webpush

    data = json.dumps({"channel": CHANNEL, "message_id": 1, "global_id": 1, "data": {"text": "bench"}})
    base = accepted(origin)
    t0, c0 = time.perf_counter(), cpu()
    for sub in subs:
        webpush(sub, data, vapid_private_key=vapid.vapid, vapid_claims={"sub": vapid.sub}, ttl=86400)
    wall, spent = time.perf_counter() - t0, cpu() - c0
    assert accepted(origin) - base == len(subs)
    rep.log(f"pywebpush loop: {len(subs)} pushes in {wall:.2f} s, {spent / len(subs) * 1e6:.0f} µs CPU each")
    return len(subs) / wall, spent / len(subs) * 1e6


def main() -> int:
    args = c.parse_args(__doc__ or "")
    try:
        import pywebpush  # noqa: F401

        from shmbus.adapters.push import FileStore, PushConnector, Registration, VapidKeys
    except ImportError as exc:
        c.skip(f"the push extra is not installed ({exc}): pip install -e '.[push]'")
    from shmbus import Bus

    n = 200 if args.quick else 10_000
    loop_n = 100 if args.quick else 1_000
    repeats = args.repeats or (1 if args.quick else 3)
    rep = c.Report("bench_push", f"Web Push fan-out to {n:,} devices vs a loop of pywebpush calls", args)
    peer = subprocess.Popen(  # the development push service, count-only: it prints its origin first
        [sys.executable, "-m", "shmbus.adapters.push.devservice", "--count-only", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    bus = Bus(c.unique_name("bench-push"), keepalive_interval=0, ring_size=1 << 22, create=True)
    connector = None
    try:
        assert peer.stdout is not None
        origin = peer.stdout.readline().strip()
        vapid = VapidKeys.generate("mailto:bench@example.com")
        subs = subscriptions(origin, n)
        with tempfile.TemporaryDirectory() as tmp:
            store = FileStore(os.path.join(tmp, "push"))
            regs = [Registration(s["endpoint"], s["keys"]["p256dh"], s["keys"]["auth"], i, (CHANNEL,), None, 0.0)
                    for i, s in enumerate(subs)]  # fmt: skip
            regs += [Registration(s["endpoint"] + "w", s["keys"]["p256dh"], s["keys"]["auth"], i, (WARM,), None, 0.0)
                     for i, s in enumerate(subs[:50])]  # fmt: skip
            for chunk in range(0, len(regs), 5000):  # the file store takes them in bulk
                with store._locked():
                    current = store._subs()
                    current.update({r.endpoint: r.to_json() for r in regs[chunk : chunk + 5000]})
                    store._write_subs(current)
            connector = PushConnector(
                bus,
                vapid=vapid,
                channels="/bench",
                store=store,
                election_interval=0.05,
                allow_address=lambda ip: ip.is_loopback,
                allow_ports=None,
            ).start()  # the local peer
            deadline = time.monotonic() + 30
            while not connector.leading and time.monotonic() < deadline:
                time.sleep(0.01)
            run_connector(bus, origin, min(n, 50), rep, WARM)  # warm-up: lanes and connections
            ours_rate, ours_cpu, base_rate, base_cpu = [], [], [], []
            for _ in range(repeats):
                r, cp = run_connector(bus, origin, n, rep)
                ours_rate.append(r)
                ours_cpu.append(cp)
                r, cp = run_pywebpush(subs[:loop_n], vapid, origin, rep)
                base_rate.append(r)
                base_cpu.append(cp)
            connector.close(grace=0)
            connector = None
        rep.add("pywebpush loop pushes/s", base_rate, "ops/s")
        rep.add("connector pushes/s", ours_rate, "ops/s", baselines=["pywebpush loop pushes/s"])
        rep.add("pywebpush loop CPU/push", base_cpu, "µs", higher_is_better=False)
        rep.add("connector CPU/push", ours_cpu, "µs", higher_is_better=False, baselines=["pywebpush loop CPU/push"])
        rep.note(f"connector: one message to {n:,} subscriptions, 4 workers per push service; pywebpush: "
                 f"{loop_n:,} sequential webpush() calls; both to a local count-only RFC 8030 peer")  # fmt: skip
    finally:
        if connector is not None:
            connector.close(grace=0)
        bus.destroy()
        peer.kill()
        peer.wait()
    rep.emit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
