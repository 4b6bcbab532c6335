"""Helpers for the PostgreSQL tests (a module, not the conftest: conftest modules of other folders share the name)."""

from __future__ import annotations


def dsn_for(url: str, schema: str) -> str:
    """``url`` with ``search_path`` set to ``schema`` (where the gem's table and the bridge's functions live)."""
    import psycopg

    return str(psycopg.conninfo.make_conninfo(url, options=f"-c search_path={schema}"))
