#!/usr/bin/env python3
"""RabbitMQ bridge: publish rate (single, concurrent and batched) and cross-host latency, vs pika publishing the same
bytes to a stream in the same run, with the publishing processes' CPU time per message.

Two "hosts" (two segments) bridged to one stream queue of the machine's RabbitMQ (``AMQP_URL``, else
``amqp://guest:guest@127.0.0.1:5672/%2F``). A helper process is the relay of both hosts (with ``--split-relays`` one
helper per host, as on two machines) and holds host B's subscriber; this process publishes on host A with
``relay=False`` (a publishing worker's figures: a bridge publish returns once host A's relay stored it, with the
stream's offset as its id). Baselines, interleaved, on a stream of their own with the same message bodies: pika's
``basic_publish`` with ``confirm_delivery`` (each publish waits for its confirm, as a bridge publish does), and
pika's ``basic_publish`` of a batch followed by one round trip (no confirms at all: the fastest pika publishes,
a strict baseline for the bridge's confirmed batches). Concurrent publishers, as a web app's requests publish
(``perf/_rmq_crowd.py``): ``--threads`` threads of this process, and ``--procs`` processes of ``--proc-threads``
threads each, every thread calling ``bus.publish`` one message at a time, against as many pika threads each with
its own confirming connection. The relays' CPU per message (the helper processes: host A's relay, and host B's
consumer of the same stream) is reported beside the bridge's rows; with ``--one-host`` only host A's relay runs
while rates are measured (host B's would run on another machine), host B's helper starting for the latency part.
Latency: publish on A to B's callback, against
a pika consumer of the baseline stream in the helper (publish to delivery).
"""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import time
from typing import Any

import _common as c
import _rmq_crowd as crowd

try:
    import pika
except ImportError:  # the rabbitmq extra
    pika = None

from shmbus import Bus

CHANNEL = "/bench/rmq"
DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"

HELPER = r"""
import json, sys, threading, time
import pika
from shmbus import Bus
from shmbus.adapters.rabbitmq import RabbitBridge
name_a, name_b, url, stream, base, channel, hosts = sys.argv[1:8]
lat = []
def on_msg(m):
    lat.append((time.perf_counter_ns() - m.data["t"]) / 1000.0)
buses = [Bus(n, keepalive_interval=0, create=True, engine=RabbitBridge(url, stream=stream, election_interval=0.05))
         for n, h in ((name_a, "a"), (name_b, "b")) if h in hosts]
while any(x.default.health()["relay_state"] != "relaying" for x in buses):
    time.sleep(0.01)
if "b" in hosts:
    buses[-1].subscribe(channel, on_msg)
    def consume():
        conn = pika.BlockingConnection(pika.URLParameters(url))
        ch = conn.channel()
        ch.basic_qos(prefetch_count=1000)
        def got(ch_, method, props, body):
            env = json.loads(body.partition(b"|")[2])
            if "t" in env["data"]:
                lat.append((time.perf_counter_ns() - env["data"]["t"]) / 1000.0)
            ch_.basic_ack(method.delivery_tag, multiple=True)
        ch.basic_consume(base, got, arguments={"x-stream-offset": "next"})
        ch.start_consuming()
print("READY", flush=True)
for line in sys.stdin:
    if line.strip() == "consume":  # from "next": the batches published before it are not its to parse
        threading.Thread(target=consume, daemon=True).start()
        time.sleep(0.5)
        print("OK", flush=True)
    if line.strip() == "dump":
        time.sleep(0.1)
        print(json.dumps(lat), flush=True)
        lat.clear()
for x in buses:
    x.close()
"""


def _payload(i: int) -> dict[str, Any]:
    return {"t": time.perf_counter_ns(), "i": i, "pad": "x" * 60}


def _body(i: int) -> bytes:
    """The bytes a bridge publish of ``_payload(i)`` on the rate channel sends (the gem's line without its ids)."""
    data = json.dumps(_payload(i), separators=(",", ":"))
    return (CHANNEL + '/rate|{"data":' + data + ',"user_ids":null,"group_ids":null,"client_ids":null}').encode()


def bridge_single(bus: Bus, n: int) -> None:
    for i in range(n):
        bus.publish(CHANNEL + "/rate", _payload(i))


def bridge_batch(bus: Bus, n: int, size: int) -> None:
    bridge: Any = bus.default
    for start in range(0, n, size):
        bridge.publish_many(bus, [(CHANNEL + "/rate", _payload(i)) for i in range(start, start + size)])


def pika_confirmed(ch: Any, stream: str, n: int) -> None:
    for i in range(n):
        ch.basic_publish("", stream, _body(i), mandatory=True)


def pika_batch(ch: Any, stream: str, n: int, size: int) -> None:
    for start in range(0, n, size):
        for i in range(start, start + size):
            ch.basic_publish("", stream, _body(i))
        ch.queue_declare(stream, passive=True)  # one round trip per batch: the broker has read them


def latency(helper: subprocess.Popen[str], send: Any, n: int) -> list[float]:
    """Messages at random 1-3 ms intervals; the helper's latencies in µs."""
    for i in range(n):
        send(i)
        time.sleep(random.uniform(0.001, 0.003))
    time.sleep(0.5)
    assert helper.stdin is not None and helper.stdout is not None
    helper.stdin.write("dump\n")
    helper.stdin.flush()
    return sorted(json.loads(helper.stdout.readline()))


def _options(p: Any) -> None:
    c.split_option(p)
    p.add_argument("--threads", type=int, default=8, help="publishing threads of this process (default 8)")
    p.add_argument("--procs", type=int, default=3, help="publishing processes (default 3)")
    p.add_argument("--proc-threads", type=int, default=4, help="publishing threads per process (default 4)")
    p.add_argument(
        "--one-host",
        action="store_true",
        help="only host A's relay runs on this machine while rates are measured (host B's, on another machine in a "
        "real deployment, is started for the latency part only)",
    )


def main() -> None:
    args = c.parse_args(__doc__, extra=_options)
    if pika is None:
        c.skip("pika is not installed (pip install 'shmbus[rabbitmq]')")
    from shmbus.adapters.rabbitmq import RabbitBridge
    from shmbus.adapters.rabbitmq.connection import AmqpConnection
    from shmbus.adapters.rabbitmq.errors import parse_url

    rep = c.Report("bench_rabbitmq", "RabbitMQ bridge vs pika, same run", args)
    repeats = args.repeats or (1 if args.quick else 3)
    n_single, n_batch, n_lat = (500, 10000, 200) if args.quick else (2000, 50000, 1000)
    unit = math.lcm(args.threads, args.procs * args.proc_threads)  # every thread publishes as many
    n_crowd = max(unit, (600 if args.quick else 4800) // unit * unit)
    url = os.environ.get("AMQP_URL") or DEFAULT_URL
    try:
        params = pika.URLParameters(url)
        pconn = pika.BlockingConnection(params)
    except Exception as exc:
        c.skip(f"no RabbitMQ at {url}: {exc}")
    run = c.unique_name("bench-rmq")
    stream, base = f"{run}-bridge", f"{run}-pika"
    name_a, name_b = f"{run}-a", f"{run}-b"
    confirmed = pconn.channel()
    confirmed.confirm_delivery()
    plain = pconn.channel()
    for q in (stream, base):
        confirmed.queue_declare(q, durable=True, arguments={"x-queue-type": "stream"})
    helpers: list[subprocess.Popen[str]] = []
    buses: list[Bus] = []
    crews: list[Any] = []
    rows: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        rows.setdefault(key, []).append(value)

    try:
        helper_argv = [name_a, name_b, url, stream, base, CHANNEL]
        helpers = c.start_helpers(HELPER, helper_argv, args.split_relays, ("a",) if args.one_host else None)
        a = Bus(name_a, keepalive_interval=0, create=True, engine=RabbitBridge(url, stream=stream, relay=False))
        buses.append(a)
        a.publish(CHANNEL + "/warm", 0)
        pika_confirmed(confirmed, base, 10)
        crews += [crowd.bridge_crew(a, args.threads), crowd.pika_crew(url, base, args.threads)]
        crews += [crowd.Workers(kind, args.procs, args.proc_threads, url, target, name_a)
                  for kind, target in (("bridge", stream), ("pika", base))]  # fmt: skip
        for r in range(repeats):
            rep.log(f"repeat {r + 1}/{repeats}")
            for key, fn, fargs in (
                ("bs", bridge_single, (a, n_single)),
                ("ps", pika_confirmed, (confirmed, base, n_single)),
                ("bt", crews[0].run, (n_crowd,)),
                ("pt", crews[1].run, (n_crowd,)),
                ("bp", crews[2].run, (n_crowd,)),
                ("pp", crews[3].run, (n_crowd,)),
                ("b100", bridge_batch, (a, n_batch, 100)),
                ("p100", pika_batch, (plain, base, n_batch, 100)),
                ("b1000", bridge_batch, (a, n_batch, 1000)),
                ("p1000", pika_batch, (plain, base, n_batch, 1000)),
            ):
                n = next(x for x in fargs if isinstance(x, int))
                relays0 = sum(crowd.process_cpu(h.pid) for h in helpers)
                w0, c0 = time.perf_counter(), time.process_time()
                spent = fn(*fargs)  # type: ignore[operator]
                w1, c1 = time.perf_counter(), time.process_time()
                if spent is not None:  # worker processes: their CPU, not this one's
                    c0, c1 = 0.0, spent[1]
                add(key, n / (w1 - w0))
                add(key + "_cpu", (c1 - c0) * 1e6 / n)
                add(key + "_relay", (sum(crowd.process_cpu(h.pid) for h in helpers) - relays0) * 1e6 / n)
        if args.one_host:
            helpers += c.start_helpers(HELPER, helper_argv, True, ("b",))
        b = Bus(name_b, keepalive_interval=0, create=True, engine=RabbitBridge(url, stream=stream, relay=False))
        buses.append(b)
        deadline = time.monotonic() + 120
        while b.segment.global_id() < a.segment.global_id() and time.monotonic() < deadline:
            time.sleep(0.05)  # host B's relay has caught up with the batches before latency is measured
        helper = helpers[-1]
        assert helper.stdin is not None and helper.stdout is not None
        helper.stdin.write("consume\n")
        helper.stdin.flush()
        helper.stdout.readline()
        lat_b = latency(helper, lambda i: a.publish(CHANNEL, {"t": time.perf_counter_ns(), "i": i}), n_lat)
        envelope = CHANNEL + '|{"data":{"t":%d},"user_ids":null,"group_ids":null,"client_ids":null}'
        lat_p = latency(
            helper, lambda i: confirmed.basic_publish("", base, (envelope % time.perf_counter_ns()).encode()), n_lat
        )
        k, p, t = args.threads, args.procs, args.proc_threads
        relays_note = "host A's relay" + ("" if args.one_host else " and host B's, consumers of the same stream")
        pairs = (
            ("bridge publish, one at a time (confirmed, id returned)", "bs", "pika basic_publish, confirmed", "ps"),
            (f"bridge publish, {k} threads, one at a time each", "bt", f"pika confirmed, {k} threads", "pt"),
            (f"bridge publish, {p} procs x {t} threads", "bp", f"pika confirmed, {p} procs x {t} threads", "pp"),
            ("bridge publish_many x100 (confirmed, ids returned)", "b100", "pika x100, no confirms", "p100"),
            ("bridge publish_many x1000 (confirmed, ids returned)", "b1000", "pika x1000, no confirms", "p1000"),
        )
        for name, key, base_name, base_key in pairs:
            rep.add(base_name, rows[base_key], "msgs/s")
            rep.add(name, rows[key], "msgs/s", baselines=[base_name])
            rep.add(f"{base_name}: CPU per message", rows[base_key + "_cpu"], "µs", higher_is_better=False)
            rep.add(
                f"{name}: CPU per message",
                rows[key + "_cpu"],
                "µs",
                higher_is_better=False,
                baselines=[f"{base_name}: CPU per message"],
                note="the publishing process(es) only (the relay runs in the helper)",
            )
            if key in ("bs", "bt", "bp"):
                rep.add(f"{name}: relays' CPU per message", rows[key + "_relay"], "µs", higher_is_better=False,
                        note=relays_note)  # fmt: skip
        for label, values in (("bridge cross-host", lat_b), ("pika publish->consumer", lat_p)):
            rep.add(f"{label} latency p50", [c.percentile(values, 50)], "µs", higher_is_better=False)
            rep.add(f"{label} latency p99", [c.percentile(values, 99)], "µs", higher_is_better=False)
        rep.rows["bridge cross-host latency p50"].baselines = ["pika publish->consumer latency p50"]
        rep.rows["bridge cross-host latency p99"].baselines = ["pika publish->consumer latency p99"]
        for name, _, base_name, _ in pairs:
            rep.target(f"{name} >= 0.8x {base_name}", rep.ratio(name, base_name), 0.8)
        rep.note(
            "bridge: the bus's own AMQP framing (shmbus.adapters.rabbitmq.amqp); baseline: pika " + pika.__version__
        )
        rep.note("RabbitMQ, the relay (helper process) and the publisher share the machine's CPUs")
    finally:
        for crew in crews:
            crew.close()
        c.stop_helpers(helpers)
        for bus in buses:
            bus.destroy()
        for name in (name_a, name_b):
            Bus(name, create=True).destroy()
        a_url = parse_url(url)
        admin = AmqpConnection(a_url.host, a_url.port, a_url.user, a_url.password, a_url.vhost, 10)
        admin.open_channel(1, 10)
        for q in (stream, base):
            admin.delete(1, q, 10)
        admin.close()
        pconn.close()
    rep.emit()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
