#!/usr/bin/env python3
"""NATS JetStream bridge: publish rate and CPU per message (single and batched) and cross-host latency, against
nats-py (the broker's own Python client) publishing the same bytes with acknowledgements, in the same run.

Two "hosts" (two segments) bridged to one stream of the machine's NATS (``NATS_URL``, else
``nats://127.0.0.1:4222``, JetStream on). A helper process is the relay of both hosts and holds host B's
subscriber, and a nats-py JetStream subscriber (an ordered push consumer) on the baseline's stream; this process
publishes on host A (``relay=False``: a publishing worker's figures). The helper runs for the latency runs only:
during the rates no consumer of either stream takes CPU from the publishers (on a 2-core machine, the two relays'
work per message showed as 20-40% of the bridge's single-publish rate). Baselines, interleaved with the bridge's
figures: nats-py ``js.publish`` awaited one by one (one message, its PubAck, the next) and ``js.publish_async``
in batches of 1000 (every future, then ``gather``), each the same envelope bytes the bridge stores, into a stream
of their own with the same settings. CPU per message is this process's CPU time (user + system) divided by the
messages: the figure a loaded machine moves least. Latency: publish on A to delivery on B (the bridge: relay,
stream read, segment, subscriber; nats-py: the consumer's push delivery).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import subprocess
import time
from typing import Any

import _common as c

try:
    import nats
except ImportError:  # the test extra (the baseline only: the bridge needs no client library)
    nats = None

from shmbus import Bus

QUICK_TIMEOUT = 180
FULL_TIMEOUT = 600
CHANNEL = "/bench/nats"
DEFAULT_URL = "nats://127.0.0.1:4222"
BATCH = 1000
ROUNDS = 5
PAD = "x" * 60

HELPER = r"""
import asyncio, json, sys, threading, time
import nats
from shmbus import Bus
from shmbus.adapters.nats import NatsBridge
name_a, name_b, url, stream, base_subject, channel, hosts = sys.argv[1:8]
lat, base = [], []
def on_msg(m):
    lat.append((time.perf_counter_ns() - m.data["t"]) / 1000.0)
buses = [Bus(n, keepalive_interval=0, create=True,
             engine=NatsBridge(url, stream=stream, max_msgs=1_000_000, max_msgs_per_channel=1_000_000,
                               election_interval=0.05))
         for n, h in ((name_a, "a"), (name_b, "b")) if h in hosts]
while any(x.default.health()["relay_state"] != "relaying" for x in buses):
    time.sleep(0.01)
buses[-1].subscribe(channel, on_msg)
ready = threading.Event()
def loop():
    async def run():
        nc = await nats.connect(url)
        js = nc.jetstream()
        async def cb(msg):
            if msg.data:
                base.append((time.perf_counter_ns() - json.loads(msg.data.partition(b"|")[2])["data"]["t"]) / 1000.0)
        await js.subscribe(base_subject, cb=cb, ordered_consumer=True, deliver_policy=nats.js.api.DeliverPolicy.NEW)
        ready.set()
        while True:
            await asyncio.sleep(3600)
    asyncio.run(run())
threading.Thread(target=loop, daemon=True).start()
ready.wait(30)
print("READY", flush=True)
for line in sys.stdin:
    if line.strip() == "dump":
        time.sleep(0.2)
        print(json.dumps({"bridge": lat, "nats-py": base}), flush=True)
        lat.clear(); base.clear()
for x in buses:
    x.close()
"""


def envelope(i: int) -> bytes:
    """The bytes the bridge stores for ``{"t", "i", "pad"}`` on CHANNEL (the baseline publishes the same)."""
    data = json.dumps({"t": time.perf_counter_ns(), "i": i, "pad": PAD}, separators=(",", ":"))
    return f'{CHANNEL}|{{"data":{data},"user_ids":null,"group_ids":null,"client_ids":null}}'.encode()


def timed(fn: Any, n: int) -> tuple[float, float]:
    """``fn(n)``'s wall-clock and CPU seconds (this process: user + system)."""
    t0, c0 = time.perf_counter(), time.process_time()
    fn(n)
    return time.perf_counter() - t0, time.process_time() - c0


def bridge_single(bus: Bus, n: int) -> None:
    for i in range(n):
        bus.publish(CHANNEL, {"t": time.perf_counter_ns(), "i": i, "pad": PAD})


def bridge_batch(bus: Bus, n: int) -> None:
    engine: Any = bus.default
    for start in range(0, n, BATCH):
        engine.publish_many(
            bus, [(CHANNEL, {"t": time.perf_counter_ns(), "i": i, "pad": PAD}) for i in range(start, start + BATCH)]
        )


async def natspy_single(js: Any, subject: str, n: int) -> None:
    for i in range(n):
        await js.publish(subject, envelope(i))


async def natspy_batch(js: Any, subject: str, n: int) -> None:
    for start in range(0, n, BATCH):
        futures = [await js.publish_async(subject, envelope(i)) for i in range(start, start + BATCH)]
        await asyncio.gather(*futures)


def latencies(helper: subprocess.Popen[str], publish: Any, n: int) -> list[float]:
    for i in range(n):
        publish(i)
        time.sleep(0.002)  # one message at a time: latency, not queueing
    assert helper.stdin is not None and helper.stdout is not None
    helper.stdin.write("dump\n")
    helper.stdin.flush()
    return json.loads(helper.stdout.readline())  # type: ignore[no-any-return]


def main() -> None:
    args = c.parse_args(__doc__)
    if nats is None:
        c.skip("nats-py is not installed (pip install 'shmbus[test]')")
    from shmbus.adapters.nats import NatsBridge
    from shmbus.adapters.nats import jetstream as js_api
    from shmbus.adapters.nats.client import NatsConnection

    url = os.environ.get("NATS_URL") or DEFAULT_URL
    try:
        admin = NatsConnection(url, timeout=10, connect_timeout=3)
    except OSError as exc:
        c.skip(f"no NATS at {url}: {exc}")
    if not admin.info.get("jetstream"):
        c.skip(f"NATS at {url} runs without JetStream (nats-server -js)")
    rep = c.Report("bench_nats", "NATS JetStream bridge vs nats-py, same run", args)
    repeats = args.repeats or (1 if args.quick else 3)
    n_sync, n_batch, n_lat = (1000, 5000, 200) if args.quick else (5000, 50000, 1000)
    tag = secrets.token_hex(4)
    stream, base_stream = f"bench_{tag}", f"bench_base_{tag}"
    base_subject = f"bench.base.{tag}"
    js_api.ensure_stream(
        admin, {"name": base_stream, "subjects": [base_subject], "storage": "file", "max_msgs": 1_000_000}
    )
    name_a, name_b = c.unique_name("bench-nats-a"), c.unique_name("bench-nats-b")
    helpers: list[subprocess.Popen[str]] = []
    bus: Bus | None = None
    loop = asyncio.new_event_loop()
    try:
        bus = Bus(
            name_a,
            keepalive_interval=0,
            engine=NatsBridge(url, stream=stream, relay=False, max_msgs=1_000_000, max_msgs_per_channel=1_000_000),
            create=True,
        )
        bus.publish("/bench/warm", 0)
        nc = loop.run_until_complete(nats.connect(url))
        js = nc.jetstream()
        loop.run_until_complete(js.publish(base_subject, envelope(0)))
        rows: dict[str, list[float]] = {k: [] for k in ("bs", "bsc", "ns", "nsc", "bb", "bbc", "nb", "nbc")}
        lat: dict[str, list[float]] = {"p50": [], "p99": [], "np50": [], "np99": []}
        for rep_i in range(repeats):
            rep.log(f"repeat {rep_i + 1}/{repeats}")
            pairs = (
                (
                    "ns",
                    lambda n: loop.run_until_complete(natspy_single(js, base_subject, n)),
                    "bs",
                    lambda n: bridge_single(bus, n),
                    n_sync,
                ),
                (
                    "nb",
                    lambda n: loop.run_until_complete(natspy_batch(js, base_subject, n)),
                    "bb",
                    lambda n: bridge_batch(bus, n),
                    n_batch,
                ),
            )
            for base_key, base_fn, key, fn, n in pairs:
                # alternated in ROUNDS rounds, so a neighbour's load drifting during the run hits both alike
                sums = {base_key: [0.0, 0.0], key: [0.0, 0.0]}
                chunk = n // ROUNDS
                for _ in range(ROUNDS):
                    for k, f in ((base_key, base_fn), (key, fn)):
                        wall, cpu = timed(f, chunk)
                        sums[k][0] += wall
                        sums[k][1] += cpu
                for k, (wall, cpu) in sums.items():
                    rows[k].append(chunk * ROUNDS / wall)
                    rows[k + "c"].append(cpu / (chunk * ROUNDS) * 1e6)
            # the relays (host A's and host B's, in one helper) and the baseline's subscriber run for the latency
            # only: during the rates no consumer of either stream takes CPU from the publishers on this machine
            helpers = c.start_helpers(HELPER, [name_a, name_b, url, stream, base_subject, CHANNEL], False)
            helper = helpers[-1]
            latencies(helper, lambda i: None, 0)
            got = latencies(helper, lambda i: bus.publish(CHANNEL, {"t": time.perf_counter_ns(), "i": i}), n_lat)
            got_base = latencies(
                helper, lambda i: loop.run_until_complete(js.publish(base_subject, envelope(i))), n_lat
            )
            for key, values in (("", sorted(got["bridge"])), ("n", sorted(got_base["nats-py"]))):
                lat[key + "p50"].append(c.percentile(values, 50))
                lat[key + "p99"].append(c.percentile(values, 99))
            c.stop_helpers(helpers)
            helpers = []
        loop.run_until_complete(nc.close())
        rep.add("nats-py js.publish (awaited each)", rows["ns"], "msgs/s")
        rep.add("bridge publish (single)", rows["bs"], "msgs/s", baselines=["nats-py js.publish (awaited each)"])
        rep.add(f"nats-py js.publish_async x{BATCH} + gather", rows["nb"], "msgs/s")
        rep.add(
            f"bridge publish_many x{BATCH}",
            rows["bb"],
            "msgs/s",
            baselines=[f"nats-py js.publish_async x{BATCH} + gather"],
        )
        rep.add("nats-py js.publish CPU per message", rows["nsc"], "µs", higher_is_better=False)
        rep.add(
            "bridge publish CPU per message",
            rows["bsc"],
            "µs",
            higher_is_better=False,
            baselines=["nats-py js.publish CPU per message"],
        )
        rep.add(f"nats-py publish_async x{BATCH} CPU per message", rows["nbc"], "µs", higher_is_better=False)
        rep.add(
            f"bridge publish_many x{BATCH} CPU per message",
            rows["bbc"],
            "µs",
            higher_is_better=False,
            baselines=[f"nats-py publish_async x{BATCH} CPU per message"],
        )
        rep.add("nats-py JetStream push latency p50", lat["np50"], "µs", higher_is_better=False)
        rep.add("nats-py JetStream push latency p99", lat["np99"], "µs", higher_is_better=False)
        rep.add(
            "bridge cross-host latency p50",
            lat["p50"],
            "µs",
            higher_is_better=False,
            baselines=["nats-py JetStream push latency p50"],
        )
        rep.add(
            "bridge cross-host latency p99",
            lat["p99"],
            "µs",
            higher_is_better=False,
            baselines=["nats-py JetStream push latency p99"],
        )
        rep.target(
            "bridge publish rate / nats-py js.publish (same run)",
            rep.ratio("bridge publish (single)", "nats-py js.publish (awaited each)"),
            0.8,
        )
        rep.target(
            f"bridge publish_many rate / nats-py publish_async x{BATCH} (same run)",
            rep.ratio(f"bridge publish_many x{BATCH}", f"nats-py js.publish_async x{BATCH} + gather"),
            0.8,
        )
        rep.target(
            "bridge publish CPU per message / nats-py js.publish (same run, times better)",
            rep.ratio("bridge publish CPU per message", "nats-py js.publish CPU per message"),
            0.8,
        )
        rep.target(
            f"bridge publish_many CPU per message / nats-py publish_async x{BATCH} (same run, times better)",
            rep.ratio(
                f"bridge publish_many x{BATCH} CPU per message", f"nats-py publish_async x{BATCH} CPU per message"
            ),
            0.8,
        )
        rep.note(
            "The bridge speaks the NATS protocol itself on a blocking socket: a batch is one write of every PUB, then "
            "the PubAcks; nats-py runs each publish through its asyncio loop. Its figures include storing each "
            "message in host A's segment (read-your-writes)."
        )
    finally:
        c.stop_helpers(helpers)
        if bus is not None:
            bus.destroy()
        with contextlib.suppress(Exception):  # host B's segment (the helper closes its buses, never destroys)
            Bus(name_b, create=False, keepalive_interval=0).destroy()
        for name in (stream, base_stream):
            try:
                js_api.api(admin, f"STREAM.DELETE.{name}")
            except js_api.JsError:
                pass
        admin.close()
        loop.close()
    rep.emit()


if __name__ == "__main__":
    main()
