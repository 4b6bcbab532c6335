"""The relay election moved to the bridge kit (:mod:`shmbus.adapters.bridge.election`); kept for imports."""

from __future__ import annotations

from ..bridge.election import RELAY_LOCK_OFFSET, relay_active, relay_held_by_other, relay_lock_op

__all__ = ["RELAY_LOCK_OFFSET", "relay_active", "relay_held_by_other", "relay_lock_op"]
