"""Redis bridge: many hosts share one bus through Redis; every read is still served from shared memory.

``bus = Bus("app", engine=RedisBridge("redis://redis:6379/0"))``

* **Publish** runs one Lua script that assigns the global and channel ids, stores the message in the gem's Redis
  backlogs and PUBLISHes it: the key layout and line format are message_bus's Redis backend, so a Ruby app on the
  same Redis sees the same messages with the same ids, and vice versa. The publisher then stores its own message
  locally when that keeps the segment contiguous, else it waits briefly for the relay.
* **One relay per host** (the bridge kit's election: an OFD lock on the segment file) SUBSCRIBEs to
  ``_message_bus_<db>`` and its seal channel: a line the script sealed that follows the segment's newest id is
  stored, on any other line it reads Redis's global backlog after that id (a line is a doorbell; Redis's word is
  what is stored). Ids Redis trimmed before this host read them count as lost.
* **Reads** come from the segment; only a gap (older than the segment holds) is filled from Redis.
* **Faults**: an unreachable Redis makes ``publish`` raise :class:`RedisUnavailable` after ``socket_timeout`` (or
  queue, with ``queue_in_memory=True``); a replica raises :class:`RedisReadOnly` (or queues); a flushed or restarted
  Redis (its history key changed) resets the segment's epoch so clients resynchronise. ``health()`` reports it.

The logic shared with the PostgreSQL bridge is the kit's (:mod:`shmbus.adapters.bridge`); this module only
configures it with :class:`~.backend.RedisBackend`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import redis

from ..bridge.engine import BridgeEngine
from ..bridge.keywords import RelayKeywords, relay_options
from ..bridge.status import BridgeStatus
from .backend import RedisBackend
from .errors import RedisBridgeError, RedisReadOnly, RedisUnavailable
from .urls import redact_url

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["RedisBridge", "RedisBridgeError", "RedisReadOnly", "RedisUnavailable"]

log = logging.getLogger("shmbus.redis")


class RedisBridge(BridgeEngine):
    """Engine that makes Redis the source of ids and history, shared by every host (see the module doc).

    ``url``: the Redis URL (``redis://[:password@]host:port/db``). ``pubsub_channel``: defaults to the gem's
    ``_message_bus_<db>`` with the URL's db (a Ruby app configured with ``url:`` only uses db 0's name: pass
    ``"_message_bus_0"`` to share with it). ``queue_in_memory``: queue publishes while Redis is unreachable or
    read-only (at most ``max_in_memory_publish_backlog``, oldest dropped) and flush them in order when it is
    back, instead of raising. ``relay=False``: this process never relays (e.g. a cron script).
    ``election_interval``: how often a standby process tries the relay lock. ``reconnect_max``: cap of the
    relay's reconnect backoff. ``socket_timeout``: how long a publish waits for Redis before
    :class:`RedisUnavailable`. ``local_wait``: how long a publish waits for the relay to store it locally when it
    cannot do so itself (and the relay for this host's publisher, see ``docs/faults.md``). ``autostart``: start
    the election thread when attached (False: call :meth:`start`).
    """

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        pubsub_channel: str | None = None,
        queue_in_memory: bool = False,
        max_in_memory_publish_backlog: int = 1000,
        socket_timeout: float = 5.0,
        connect_timeout: float = 2.0,
        **relay: Unpack[RelayKeywords],
    ) -> None:
        self.url = url
        db = redis.connection.parse_url(url).get("db", 0) if url.startswith(("redis", "unix")) else 0
        self.pubsub_channel = pubsub_channel or f"_message_bus_{db or 0}"
        self.socket_timeout = socket_timeout
        self.connect_timeout = connect_timeout
        self.max_in_memory_publish_backlog = max_in_memory_publish_backlog
        status = BridgeStatus("redis", redact_url(url), log)
        status.calls.stall_after = socket_timeout / 2  # a publish waiting half its timeout: health says stalled
        backend = RedisBackend(url, self.pubsub_channel, status, socket_timeout, connect_timeout)
        options = relay_options(relay)
        super().__init__(
            backend,
            status,
            log,
            options,
            queue_in_memory=queue_in_memory,
            max_in_memory_publish_backlog=max_in_memory_publish_backlog,
        )
        self.redis = backend

    @property
    def client(self) -> redis.Redis:
        """This process's Redis command connection pool."""
        return self.redis.client

    def __repr__(self) -> str:
        return f"RedisBridge({redact_url(self.url)!r})"
