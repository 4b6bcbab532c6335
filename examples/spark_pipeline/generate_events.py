"""Publish fake web click events on ``/events/clicks`` (the input of the example Spark pipeline).

    python examples/spark_pipeline/generate_events.py --bus demo --rate 50 --seconds 60

Each event is ``{"page": "/pricing", "user": "u17", "ts": 1718000000.123}``. The bus is created if it does
not exist yet (with a ring and per-channel backlog large enough that a Spark job that starts later, or
restarts, still finds what it has not read); a web app attached to the same bus name sees the same messages.
"""

from __future__ import annotations

import argparse
import random
import time

from shmbus import Bus

PAGES = ["/", "/pricing", "/docs", "/blog", "/signup", "/about"]
WEIGHTS = [30, 15, 25, 15, 10, 5]
EVENTS_CHANNEL = "/events/clicks"


def open_bus(name: str) -> Bus:
    """The demo bus: 64 MiB of history and 100k events per channel (the defaults keep only 1000)."""
    return Bus(name, ring_size=64 << 20, max_backlog_size=100_000, create=True)


def publish_events(bus: Bus, count: int, rate: float = 0.0, seed: int | None = None) -> int:
    """Publish ``count`` events (paced at ``rate`` per second when > 0); returns the last message id."""
    rnd = random.Random(seed)
    last = 0
    start = time.monotonic()
    for i in range(count):
        if rate > 0:
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        event = {"page": rnd.choices(PAGES, WEIGHTS)[0], "user": f"u{rnd.randint(1, 50)}", "ts": time.time()}
        last = bus.publish(EVENTS_CHANNEL, event, max_backlog_size=bus.max_backlog_size) or last
    return last


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bus", default="demo", help="bus name (default: demo)")
    ap.add_argument("--rate", type=float, default=20.0, help="events per second (default 20; 0 = flat out)")
    ap.add_argument("--seconds", type=float, default=0, help="stop after this long (default: run until ^C)")
    ap.add_argument("--count", type=int, default=0, help="or stop after this many events")
    args = ap.parse_args()
    bus = open_bus(args.bus)
    total = args.count or (int(args.seconds * args.rate) if args.seconds and args.rate else 1 << 62)
    print(f"publishing on bus {args.bus!r} channel {EVENTS_CHANNEL} at {args.rate or 'max'}/s; ^C to stop")
    try:
        last = publish_events(bus, total, args.rate)
        print(f"done: last event id {last}")
    except KeyboardInterrupt:
        print(f"stopped at event id {bus.last_id(EVENTS_CHANNEL)}")
    finally:
        bus.close()


if __name__ == "__main__":
    main()
