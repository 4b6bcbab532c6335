"""A worker process of the multi-process push tests: attaches to a bus, stands for election as a push sender,
prints "ready", runs until SIGTERM (then closes) or SIGKILL (the test's crash).

Config (JSON in argv[1]): bus, vapid_pem, namespace; dsn and notify_channel for a PostgreSQL-bridged host (the
store and the election are then PostgreSQL's), else store (a FileStore base path).
"""

from __future__ import annotations

import json
import signal
import sys
import threading

from shmbus import Bus
from shmbus.adapters.push import FileStore, PushConnector, VapidKeys


def main() -> None:
    cfg = json.loads(sys.argv[1])
    engine = None
    if cfg.get("dsn"):
        from shmbus.adapters.postgres import PostgresBridge

        engine = PostgresBridge(cfg["dsn"], notify_channel=cfg["notify_channel"], election_interval=0.05)
    bus = Bus(cfg["bus"], keepalive_interval=0, engine=engine, create=True)
    store = FileStore(cfg["store"]) if cfg.get("store") else None
    connector = PushConnector(
        bus,
        vapid=VapidKeys.load(cfg["vapid_pem"], "mailto:ops@example.com"),
        channels="/",
        store=store,
        namespace=cfg.get("namespace", "default"),
        election_interval=0.05,
        workers_per_service=cfg.get("workers_per_service", 4),
        max_in_flight=cfg.get("max_in_flight", 256),
        save_interval=cfg.get("save_interval", 0.1),
        timeout=5.0,
        allow_address=lambda ip: ip.is_loopback,  # the tests' local push service
        allow_ports=None,  # on a port of its own
    ).start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print("ready", flush=True)
    stop.wait()
    connector.close(grace=1.0)
    bus.close()


if __name__ == "__main__":
    main()
