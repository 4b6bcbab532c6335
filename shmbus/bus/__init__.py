"""``Bus``: message_bus's API over a shared-memory segment that every process on the host attaches to by name.

The class is assembled from one module per concern: ``state`` (shared state, attaching, names), ``publishing``,
``reading``, ``subscriptions``, ``listener`` and ``core`` (options, engines, lifecycle).
"""

from __future__ import annotations

from ..channels import MAX_CHANNEL_BYTES, MAX_SITE_BYTES
from .core import Bus
from .listener import KEEPALIVE_CHANNEL, MIN_KEEPALIVE
from .results import Backlog, Callback, Subscription
from .state import BatchListener
from .validation import MAX_WIRE_INT, MIN_WIRE_INT, check_count, check_seconds

__all__ = [
    "KEEPALIVE_CHANNEL",
    "MAX_CHANNEL_BYTES",
    "MAX_SITE_BYTES",
    "MAX_WIRE_INT",
    "MIN_KEEPALIVE",
    "MIN_WIRE_INT",
    "Backlog",
    "BatchListener",
    "Bus",
    "Callback",
    "Subscription",
    "check_count",
    "check_seconds",
]
