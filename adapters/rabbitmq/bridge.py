"""RabbitMQ bridge: many hosts share one bus through a RabbitMQ stream queue; every read is still served from
shared memory.

``bus = Bus("app", engine=RabbitBridge("amqp://guest:guest@rabbit:5672/%2F", stream="message_bus"))``

* **Publish** sends the batch's messages to the stream (``channel|envelope``, the gem's line without its ids) in
  one write, with publisher confirms (one round trip per batch), then returns their ids: the stream's offsets + 1,
  as this host's relay stored them (see :mod:`.backend`).
* **One relay per host** (the bridge kit's election) consumes the stream from the segment's newest id and stores
  every message under its offset: every host stores the same message under the same id. What retention deleted
  before this host read it is counted as lost (``relay_lost``) and shows as a gap.
* **Faults**: an unreachable broker makes ``publish`` raise :class:`RabbitUnavailable`; no confirm within
  ``command_timeout`` raises :class:`~shmbus.errors.PublishOutcomeUnknown`; a deleted stream is declared again
  (by the next publish or relay) and the hosts reset their bus (a new epoch) so clients resynchronise.

The logic shared with the Redis and PostgreSQL bridges is the kit's (:mod:`shmbus.adapters.bridge`); this module
only configures it with :class:`~.backend.RabbitBackend`. The AMQP client is the bridge's own (:mod:`.amqp`,
:mod:`.connection`): no client library is needed.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

from ..bridge.engine import BridgeEngine
from ..bridge.keywords import RelayKeywords, relay_options
from ..bridge.status import BridgeStatus
from .backend import RabbitBackend
from .errors import RabbitBridgeError, RabbitUnavailable, redact_url

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["RabbitBridge", "RabbitBridgeError", "RabbitUnavailable"]

log = logging.getLogger("shmbus.rabbitmq")


class RabbitBridge(BridgeEngine):
    """Engine that makes a RabbitMQ stream queue the source of ids and history, shared by every host.

    ``url``: ``amqp://user:password@host:port/vhost`` (``%2F`` for the ``/`` vhost). ``stream``: the stream
    queue's name (declared where missing). ``max_length_bytes`` (default 1 GB; None: unbounded), ``max_age``
    (``"7D"``, ``"12h"``), ``max_segment_size_bytes``: the stream's retention, used only by whoever creates it (an
    existing stream keeps its own). ``connect_timeout``, ``command_timeout``: seconds (a publish whose confirms
    take longer raises :class:`~shmbus.errors.PublishOutcomeUnknown`). ``local_wait``: how long a publish waits
    (at least ``command_timeout``) for its host's relay to store its messages (their ids) before reading them from
    the stream itself. ``relay``, ``election_interval``, ``reconnect_max``, ``autostart``: as the Redis bridge.
    """

    def __init__(
        self,
        url: str = "amqp://guest:guest@127.0.0.1:5672/%2F",
        *,
        stream: str | None = None,
        max_length_bytes: int | None = 1_000_000_000,
        max_age: str | None = None,
        max_segment_size_bytes: int | None = None,
        connect_timeout: float = 3.0,
        command_timeout: float = 5.0,
        **relay: Unpack[RelayKeywords],
    ) -> None:
        self.url = url
        self.stream = stream or "message_bus"
        arguments: dict[str, object] = {}
        if max_length_bytes is not None:
            arguments["x-max-length-bytes"] = int(max_length_bytes)
        if max_age is not None:
            arguments["x-max-age"] = str(max_age)
        if max_segment_size_bytes is not None:
            arguments["x-stream-max-segment-size-bytes"] = int(max_segment_size_bytes)
        status = BridgeStatus("rabbitmq", redact_url(url), log)
        status.calls.stall_after = command_timeout / 2
        options = relay_options(relay)
        backend = RabbitBackend(
            url,
            self.stream,
            status,
            arguments=arguments,
            connect_timeout=connect_timeout,
            command_timeout=command_timeout,
            local_wait=max(options.local_wait, command_timeout),
        )
        # the kit's landing never waits: a publisher returns once its host's relay stored its messages (their ids),
        # and the relay never waits for a publisher to land what the stream no longer holds (none lands its own)
        super().__init__(backend, status, log, dataclasses.replace(options, local_wait=0.0))
        self.rabbit = backend
        backend.relay_running = self._relay_running

    def _relay_running(self) -> bool:
        election = self.election
        return election is not None and election.running()

    def __repr__(self) -> str:
        return f"RabbitBridge({redact_url(self.url)!r}, stream={self.stream!r})"
