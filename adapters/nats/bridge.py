"""NATS JetStream bridge: many hosts share one bus through a JetStream stream; reads stay in shared memory.

``bus = Bus("app", engine=NatsBridge("nats://127.0.0.1:4222"))``

* **Ids are the stream's sequences**, from the server's acknowledgement of each publish: every host agrees. A
  message's channel id is its global id (sparse ids, as on PostgreSQL).
* **Publish** speaks the NATS protocol itself on a blocking socket per thread (:mod:`.client`, :mod:`.protocol`):
  a batch of N messages is one write of N ``PUB`` with N reply subjects, then N acknowledgements read as they come
  (one round trip, no asyncio loop, no thread hop). A message over the server's ``max_payload`` is refused before
  anything is sent.
* **One relay per host** (the bridge kit's election) wakes on a push consumer's deliveries (headers only: the
  sequence is in the reply subject) and reads the stream after the segment's newest id with a pull consumer of its
  own: **a delivery is a doorbell**, never stored. A new or restarted host catches up from the stream within its
  retention; what the stream no longer holds counts as lost (``relay_lost``) and shows as a gap.
* **Faults**: an unreachable or frozen server makes ``publish`` raise :class:`NatsUnavailable` (nothing written) or
  :class:`~shmbus.errors.PublishOutcomeUnknown` (written, acknowledgement not read within ``command_timeout``); a
  stream deleted and recreated (its ``created`` time changed, the segment's newest message not there) resets the
  bus; a deleted stream is created again by the next publish or relay connection; a purge counts the purged ids
  as lost.

The logic shared with the other bridges is the kit's (:mod:`shmbus.adapters.bridge`).
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING

from ..bridge.engine import BridgeEngine
from ..bridge.keywords import RelayKeywords, relay_options
from ..bridge.status import BridgeStatus
from .backend import NatsBackend
from .errors import NatsBridgeError, NatsUnavailable, redact_url

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["NatsBridge", "NatsBridgeError", "NatsUnavailable", "redact_url"]

log = logging.getLogger("shmbus.nats")

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class NatsBridge(BridgeEngine):
    """Engine that makes a JetStream stream the source of ids and history (see the module doc).

    ``url``: ``nats://[user:password@|token@]host:port``. ``stream``: the stream's name (letters, digits, ``_``,
    ``-``); ``subject``: the prefix of its channels' subjects (default ``shmbus.<stream>``: the stream takes
    ``<subject>.>``). Created where missing with ``storage`` (``"file"``: survives a server restart; ``"memory"``),
    ``replicas`` (a clustered JetStream's copies), ``max_msgs`` (default: the bus's ``max_global_backlog_size``),
    ``max_msgs_per_channel`` (default: the bus's ``max_backlog_size``) and ``max_age`` (seconds, 0: none): the
    retention a new or restarted host can catch up within. An existing stream is used as it is. ``connect_timeout``,
    ``command_timeout``: seconds. Takes the other bridges' relay keywords (``relay``, ``election_interval``,
    ``reconnect_max``, ``local_wait``, ``autostart``).
    """

    def __init__(
        self,
        url: str = "nats://127.0.0.1:4222",
        *,
        stream: str | None = None,
        subject: str | None = None,
        storage: str = "file",
        replicas: int = 1,
        max_msgs: int | None = None,
        max_msgs_per_channel: int | None = None,
        max_age: float = 0.0,
        connect_timeout: float = 3.0,
        command_timeout: float = 5.0,
        **relay: Unpack[RelayKeywords],
    ) -> None:
        stream = stream or "shmbus"
        if not _NAME.match(stream):
            raise ValueError(f"NATS stream name {stream!r}: use letters, digits, '_' and '-' (at most 64)")
        if storage not in ("file", "memory"):
            raise ValueError(f"storage must be 'file' or 'memory', not {storage!r}")
        self.url = url
        self.stream = stream
        self.subject = subject or f"shmbus.{stream}"
        status = BridgeStatus("nats", redact_url(url), log)
        status.calls.stall_after = command_timeout / 2
        backend = NatsBackend(
            url,
            stream,
            self.subject,
            status,
            storage=storage,
            max_msgs=max_msgs,
            max_msgs_per_channel=max_msgs_per_channel,
            max_age=max_age,
            replicas=replicas,
            connect_timeout=connect_timeout,
            command_timeout=command_timeout,
        )
        super().__init__(backend, status, log, relay_options(relay))
        self.nats = backend

    def __repr__(self) -> str:
        return f"NatsBridge({redact_url(self.url)!r}, stream={self.stream!r})"
