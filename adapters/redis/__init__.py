"""Many hosts, one bus, through Redis: :class:`RedisBridge` (an engine) and the gem's Redis key layout.

``from shmbus.adapters.redis import RedisBridge``. The bridge needs the ``redis`` extra; :mod:`.layout` (key names,
line format, Lua scripts) does not, so the CLI and the Spark reader can use it without importing redis-py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .bridge import RedisBridge, RedisBridgeError, RedisReadOnly, RedisUnavailable, relay_active

__all__ = ["RedisBridge", "RedisBridgeError", "RedisReadOnly", "RedisUnavailable", "relay_active"]


def __getattr__(name: str) -> Any:
    """Import the bridge (and redis-py) on first use, so ``shmbus.adapters.redis.layout`` stays light."""
    if name in __all__:
        from . import bridge

        return getattr(bridge, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
