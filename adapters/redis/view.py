"""``shmbus stats --redis``: how a host's segment stands against the Redis it is bridged to (the command line
loads this module by name; the core imports no adapter)."""

from __future__ import annotations

from typing import Any

import redis

from .election import relay_active
from .layout import GLOBAL_ID_KEY, HISTORY_KEY
from .urls import redact_url

__all__ = ["segment_view"]


def segment_view(url: str, seg_path: str, seg_global_id: int, seg_history: int) -> dict[str, Any]:
    """How this host's segment stands against the Redis it is bridged to (for the bridge's health). The lag is a
    difference of ids only when both hold the same history (Redis's history key is the one the segment recorded):
    after a FLUSHDB or a restart without persistence the ids are not comparable, and the view says so."""
    view: dict[str, Any] = {"url": redact_url(url), "relay_active": relay_active(seg_path)}
    try:
        r = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        gid = int(r.get(GLOBAL_ID_KEY) or 0)
        history = int(r.get(HISTORY_KEY) or 0)
        view.update(role=r.execute_command("ROLE")[0].decode(), global_id=gid, history=history)
        r.close()
    except Exception as exc:
        view["error"] = str(exc)
        return view
    if seg_history and history != seg_history:
        view.update(lag=None, standing="another history: Redis was flushed or restarted; the relay resets the bus")
    elif gid < seg_global_id:
        view.update(lag=None, standing=f"the segment is AHEAD of Redis by {seg_global_id - gid}: not this Redis?")
    else:
        view.update(lag=gid - seg_global_id, standing=f"segment lags by {gid - seg_global_id}")
    return view
