"""Many hosts, one bus, through PostgreSQL: :class:`PostgresBridge` (an engine) on the gem's ``message_bus`` table.

``from shmbus.adapters.postgres import PostgresBridge``. The bridge needs the ``postgres`` extra (psycopg 3);
:mod:`.sql` (the table, statements and function as text) does not.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from shmbus.engine_urls import register_engine_kind
from shmbus.engines import Engine

if TYPE_CHECKING:
    from .bridge import PostgresBridge
    from .errors import PostgresBridgeError, PostgresReadOnly, PostgresUnavailable

__all__ = ["PostgresBridge", "PostgresBridgeError", "PostgresReadOnly", "PostgresUnavailable"]


def __getattr__(name: str) -> Any:
    """Import the bridge (and psycopg) on first use."""
    if name in __all__:
        from . import bridge

        return getattr(bridge, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _from_url(url: str, relay: bool, options: Mapping[str, str]) -> Engine:
    """``shmbus.engine_urls``'s factory: the bridge a process attaching a bridged bus builds."""
    from .bridge import PostgresBridge

    return PostgresBridge(url, relay=relay, notify_channel=options.get("notify_channel"))


register_engine_kind("postgres", ("postgres", "postgresql"), _from_url)
