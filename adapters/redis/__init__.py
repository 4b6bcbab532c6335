"""Many hosts, one bus, through Redis: :class:`RedisBridge` (an engine) and the gem's Redis key layout.

``from shmbus.adapters.redis import RedisBridge``. The bridge needs the ``redis`` extra; :mod:`.layout` (key names,
line format, Lua scripts) does not, so the CLI and the Spark reader can use it without importing redis-py.

Deviations from the gem's Redis backend (everything else — keys, line format, envelope, ids, TTLs, trims, the
notification — is the gem's, so a Ruby app and a Python app on one Redis share a bus):

* **Notification channel.** The gem names it ``_message_bus_<db>`` from its ``redis_config[:db]``, which is 0 for an
  app configured with ``url:`` only, whatever database the URL names; shmbus takes the URL's database. To share a
  bus with such a Ruby app on a database other than 0, pass ``RedisBridge(url, pubsub_channel="_message_bus_0")``.
* **Publish script.** Same keys, arguments and effects as the gem's, but it returns ``{global_id, channel_id}``
  (the gem's returns the channel id): the publisher stores its own message in the segment with Redis's ids. It
  also PUBLISHes a seal of the line on ``<channel>_shmbus_seals`` (keyed by ``__mb_shmbus_seal``; see
  ``docs/redis.md``), which only shmbus relays subscribe to: the gem's line and channel are unchanged.
* **Unreachable or read-only Redis.** The gem queues in memory by default (``queue_in_memory`` true) and only on
  READONLY; shmbus raises :class:`RedisUnavailable` / :class:`RedisReadOnly` by default, and with
  ``queue_in_memory=True`` queues on both (``publish`` then returns None, as the gem's does). A queued message keeps
  its per-message ``max_backlog_size``/``max_backlog_age`` when it is republished (the gem drops them).
* **Per-message limits.** ``publish(..., max_backlog_age=A, max_backlog_size=S)`` honours both; the gem drops ``S``
  when ``A`` is given (its Ruby short-circuit), so the script gets the bus's default size.
* **Reads.** ``backlog``, ``last_id`` and long polls are answered from this host's segment (no Redis command per
  poll); only history older than the segment holds is read from Redis.
* **Subscribing.** One relay per host (not one subscriber thread per process) copies Redis's messages into the
  segment, and its catch-up starts at the segment's last global id, so a process started later still sees
  messages published before it started (the gem's subscriber replays nothing from before its first message).
* **Flush or restart of Redis** (ids went backwards, or the message at the segment's last id is another one): the
  segment is reset with a new epoch and HTTP clients resynchronise through ``/__status``, as the gem's clients do.
* **Channel names.** The gem stores any string; shmbus's one rule (:mod:`shmbus.channels`: a leading ``/``, no
  CR/LF/NUL) applies to what the relay copies in: a Ruby peer's message on ``chat`` is skipped, logged and
  counted in ``health()["unrelayable"]``.
* **Not supported**, as in the gem: Redis Cluster (the key usage is single-node).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shmbus.engine_urls import lazy_attributes, lazy_engine, register_engine_kind

from .election import relay_active
from .urls import redact_url

if TYPE_CHECKING:
    from .bridge import RedisBridge
    from .errors import RedisBridgeError, RedisReadOnly, RedisUnavailable

__all__ = ["RedisBridge", "RedisBridgeError", "RedisReadOnly", "RedisUnavailable", "redact_url", "relay_active"]

# the bridge (and redis-py) is imported on first use, so ``shmbus.adapters.redis.layout`` stays light; a process
# attaching a bridged bus builds it by URL
__getattr__ = lazy_attributes(
    __name__, f"{__name__}.bridge", {"RedisBridge", "RedisBridgeError", "RedisReadOnly", "RedisUnavailable"}
)
register_engine_kind(
    "redis", ("redis", "rediss", "unix"), lazy_engine(f"{__name__}.bridge", "RedisBridge", "pubsub_channel")
)
