"""``Bus``: message_bus's API over a shared-memory segment that every process on the host attaches to by name.

``Bus`` (``core``) is a facade over one object per concept: ``attachment`` (the segment), ``names``, ``limits``,
``engine_table``, ``publishing`` (the publisher), ``reading`` (the reader), ``subscriptions`` (the table and
dispatch), ``subscribing`` (replay then live) and ``listener`` (the thread).
"""

from __future__ import annotations

from ..channels import MAX_CHANNEL_BYTES, MAX_SITE_BYTES
from .core import Bus
from .listener import KEEPALIVE_CHANNEL, MIN_KEEPALIVE
from .results import Backlog, Callback, Subscription
from .subscriptions import BatchListener
from .validation import MAX_WIRE_INT, MIN_WIRE_INT, check_count, check_seconds

__all__ = [
    "KEEPALIVE_CHANNEL",
    "MAX_CHANNEL_BYTES",
    "MAX_SITE_BYTES",
    "MAX_WIRE_INT",
    "MIN_WIRE_INT",
    "MIN_KEEPALIVE",
    "Backlog",
    "BatchListener",
    "Bus",
    "Callback",
    "Subscription",
    "check_count",
    "check_seconds",
]
