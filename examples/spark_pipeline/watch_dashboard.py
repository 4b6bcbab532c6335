"""Print what a dashboard page would show: the latest count per page on ``/dashboard/clicks``.

python examples/spark_pipeline/watch_dashboard.py --bus demo
"""

from __future__ import annotations

import argparse
import threading
from typing import Any

from shmbus import Bus

DASHBOARD_CHANNEL = "/dashboard/clicks"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bus", default="demo")
    args = ap.parse_args()
    bus = Bus(args.bus, create=False)
    table: dict[str, dict[str, Any]] = {}
    lock = threading.Lock()

    def on_update(msg: Any) -> None:
        with lock:
            table[msg.data["page"]] = msg.data
            rows = sorted(table.values(), key=lambda r: -r["clicks"])
        print("\n".join(f"{r['page']:<10} {r['clicks']:>8} clicks {r['users']:>5} users" for r in rows), end="\n\n")

    bus.subscribe(DASHBOARD_CHANNEL, on_update, last_id=0)  # replay: the latest count of every page first
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        bus.close()


if __name__ == "__main__":
    main()
