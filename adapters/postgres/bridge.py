"""PostgreSQL bridge: many hosts share one bus through the gem's ``message_bus`` table; reads stay in shared memory.

``bus = Bus("app", engine=PostgresBridge("postgresql://app@db/app"))``

* **Publish** calls one server-side procedure (``shmbus_send``, created next to the table) that runs the gem's
  publish statements in one round trip and in the gem's order: INSERT ... RETURNING id, COMMIT, then ``pg_notify``
  of the gem's line in a transaction of its own (a notifying transaction holds PostgreSQL's cluster-wide notify
  lock through its commit's WAL flush; apart, inserts commit in groups). Rows may therefore commit out of id
  order, which the relay waits out. The gem's trims run in each host's relay every ``trim_interval`` seconds
  rather than inside every publish. The table, indexes, value format and notify channel are the gem's, so a Ruby
  app on the gem's postgres backend and a Python app on shmbus share one bus, with the same ids. The id is the row
  id: a message's channel id *is* its global id (a channel's ids have gaps), so the segment holds sparse ids.
* **One relay per host** (the bridge kit's election) LISTENs and, on every notice, reads the table after the
  segment's newest id: **a notice is a doorbell**, never stored (any role with CONNECT may ``pg_notify``), unless
  the procedure sealed it with the key in ``shmbus_seal_key`` (then the next id is stored without the read). A missing
  id below a committed one (a hole) is waited for until the transactions then writing to the table have ended;
  an id a trim deleted before this host read it counts as lost (``relay_lost``) and shows as a gap.
* **Reads** come from the segment; only a gap (older than the segment holds) is filled from the table.
* **Faults**: an unreachable or frozen server makes ``publish`` raise :class:`PostgresUnavailable` within
  ``command_timeout``; a standby :class:`PostgresReadOnly`, and ``health()`` says so; a table replaced (TRUNCATE,
  ``RESTART IDENTITY``, dropped and recreated: its history identity changed and the segment's newest message is
  not there) resets the bus's epoch; a dropped table or procedure is recreated.

The logic shared with the Redis bridge is the kit's (:mod:`shmbus.adapters.bridge`); this module only configures
it with :class:`~.backend.PostgresBackend`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import psycopg

from ..bridge.engine import BridgeEngine
from ..bridge.keywords import RelayKeywords, relay_options
from ..bridge.status import BridgeStatus
from .backend import PostgresBackend
from .errors import PostgresBridgeError, PostgresReadOnly, PostgresUnavailable, redact_dsn

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["PostgresBridge", "PostgresBridgeError", "PostgresReadOnly", "PostgresUnavailable", "redact_dsn"]

log = logging.getLogger("shmbus.postgres")


class PostgresBridge(BridgeEngine):
    """Engine that makes PostgreSQL (the gem's table) the source of ids and history (see the module doc).

    ``dsn``: a libpq connection string or URL (``search_path`` in ``options`` picks the schema). ``db``: the gem's
    ``db`` option, naming the notify channel ``_message_bus_<db>``; ``notify_channel`` overrides it (apps sharing
    a database with separate tables need separate channels, as with the gem). ``relay=False``: this process never
    relays (a script). ``election_interval``, ``reconnect_max``: as the Redis bridge. ``local_wait``: how long a
    publish waits for the relay to store it locally when it cannot itself. ``hole_timeout``: how long the relay
    waits for the transactions that may hold a missing id before counting the id as lost. ``trim_interval``: how
    often the relay runs the gem's trims with the bus's limits (0: never). ``connect_timeout``: seconds.
    ``command_timeout``: seconds any statement may wait for the server (publishes, the relay's reads) before
    :class:`PostgresUnavailable` (the connection is then closed). ``synchronous_commit=False`` sets it off for this
    bridge's publishes (2-3x the rate where commits are fsync-bound; a server crash may lose the last fraction of
    a second of acknowledged messages).
    """

    def __init__(
        self,
        dsn: str = "postgresql://postgres@127.0.0.1:5432/postgres",
        *,
        db: int = 0,
        notify_channel: str | None = None,
        hole_timeout: float = 5.0,
        trim_interval: float = 1.0,
        connect_timeout: float = 3.0,
        command_timeout: float = 5.0,
        synchronous_commit: bool = True,
        **relay: Unpack[RelayKeywords],
    ) -> None:
        self.dsn = dsn
        self.notify_channel = notify_channel or f"_message_bus_{db}"
        self.hole_timeout = hole_timeout
        status = BridgeStatus("postgres", redact_dsn(dsn), log)
        status.calls.stall_after = command_timeout / 2  # a publish waiting half its timeout: health says stalled
        backend = PostgresBackend(
            dsn,
            self.notify_channel,
            status,
            hole_timeout=hole_timeout,
            connect_timeout=connect_timeout,
            command_timeout=command_timeout,
            synchronous_commit=synchronous_commit,
        )
        options = relay_options(relay, trim_interval)
        super().__init__(backend, status, log, options)
        self.postgres = backend

    def _conn(self) -> psycopg.Connection[Any]:
        """This thread's command connection (the same one publishes use)."""
        return self.postgres.conn()

    def __repr__(self) -> str:
        return f"PostgresBridge({redact_dsn(self.dsn)!r})"
