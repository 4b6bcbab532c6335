"""Many hosts, one bus, through PostgreSQL: :class:`PostgresBridge` (an engine) on the gem's ``message_bus`` table.

``from shmbus.adapters.postgres import PostgresBridge``. The bridge needs the ``postgres`` extra (psycopg 3);
:mod:`.sql` (the table, statements and function as text) does not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shmbus.engine_urls import lazy_attributes, lazy_engine, register_engine_kind

if TYPE_CHECKING:
    from .bridge import PostgresBridge
    from .errors import PostgresBridgeError, PostgresReadOnly, PostgresUnavailable

__all__ = ["PostgresBridge", "PostgresBridgeError", "PostgresReadOnly", "PostgresUnavailable"]

# the bridge (and psycopg) is imported on first use; a process attaching a bridged bus builds it by URL
__getattr__ = lazy_attributes(__name__, f"{__name__}.bridge", __all__)
register_engine_kind(
    "postgres", ("postgres", "postgresql"), lazy_engine(f"{__name__}.bridge", "PostgresBridge", "notify_channel")
)
