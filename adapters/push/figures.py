"""The push figures as metric families (:mod:`shmbus.adapters.metrics`): read from the store, so every worker
of every host reports the same cluster-wide totals."""

from __future__ import annotations

import time
from typing import Any

from .state import HEARTBEAT, SenderState

__all__ = ["metric_families"]

_COUNTER_HELP = (
    ("sent", "sent", "Pushes the push services accepted."),
    ("failed", "failed", "Pushes refused by a push service or given up after retries."),
    ("retried", "retried", "Pushes sent again after a 429, a 5xx or a network error."),
    ("expired", "expired", "Subscriptions removed after a 404 or 410."),
    ("dropped", "dropped", "Pushes dropped because their push service's queue was full and stalled."),
    ("missed_messages", "missed", "Messages gone from the bus before the sender read them."),
    ("unroutable_messages", "unroutable", "Group-targeted messages with no group lookup to route them."),
)


def metric_families(st: SenderState, labels: dict[str, str]) -> list[Any]:
    """The sender's saved state ``st`` as metric families, each sample labelled ``labels``."""
    from ..metrics import Family

    out = [
        Family(f"shmbus_push_{name}_total", "counter", help_, [(dict(labels), float(st.counters.get(key, 0)))])
        for name, key, help_ in _COUNTER_HELP
    ]
    out.append(Family("shmbus_push_queue_depth", "gauge", "Pushes queued or on the wire at the sender's last save.",
                      [(dict(labels), float(st.queue_depth))]))  # fmt: skip
    out.append(Family("shmbus_push_cursor", "gauge", "Global id below which every push is settled.",
                      [(dict(labels), float(st.cursor or 0))]))  # fmt: skip
    up = 1.0 if st.updated and time.time() - st.updated < 3 * HEARTBEAT else 0.0
    out.append(Family("shmbus_push_sender_up", "gauge", "1 while an elected sender saves its state.",
                      [(dict(labels), up)]))  # fmt: skip
    return out
