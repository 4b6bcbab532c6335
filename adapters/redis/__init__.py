"""Many hosts, one bus, through Redis: :class:`RedisBridge` (an engine) and the gem's Redis key layout.

``from shmbus.adapters.redis import RedisBridge``. The bridge needs the ``redis`` extra; :mod:`.layout` (key names,
line format, Lua scripts) does not, so the CLI and the Spark reader can use it without importing redis-py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .election import relay_active
from .urls import redact_url

if TYPE_CHECKING:
    from .bridge import RedisBridge
    from .errors import RedisBridgeError, RedisReadOnly, RedisUnavailable

__all__ = ["RedisBridge", "RedisBridgeError", "RedisReadOnly", "RedisUnavailable", "redact_url", "relay_active"]
_BRIDGE = frozenset({"RedisBridge", "RedisBridgeError", "RedisReadOnly", "RedisUnavailable"})


def __getattr__(name: str) -> Any:
    """Import the bridge (and redis-py) on first use, so ``shmbus.adapters.redis.layout`` stays light."""
    if name in _BRIDGE:
        from . import bridge

        return getattr(bridge, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
