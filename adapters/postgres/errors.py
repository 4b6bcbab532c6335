"""The PostgreSQL bridge's typed errors and the DSN without its password (shared by the backend, the engine, the
Spark reader)."""

from __future__ import annotations

import psycopg

from shmbus.errors import EngineError

__all__ = ["PostgresBridgeError", "PostgresReadOnly", "PostgresUnavailable", "redact_dsn"]


class PostgresBridgeError(EngineError):
    """The PostgreSQL bridge could not carry out a publish; the message was not stored."""


class PostgresUnavailable(PostgresBridgeError):
    """PostgreSQL could not be reached, or the connection was lost before the statement was sent. (No answer
    within ``command_timeout``, or a connection lost once the statement was sent, is
    :class:`~shmbus.errors.PublishOutcomeUnknown`.)"""


class PostgresReadOnly(PostgresBridgeError):
    """PostgreSQL refused the write as read-only: the bridge points at a standby (e.g. after a failover)."""


def redact_dsn(dsn: str) -> str:
    """The DSN without its password (for logs, ``health()`` and the segment's bridge record)."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparseable dsn>"
    info.pop("password", None)
    return psycopg.conninfo.make_conninfo("", **{k: v for k, v in info.items() if v is not None})
