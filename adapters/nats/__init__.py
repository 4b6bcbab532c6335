"""Many hosts, one bus, through NATS JetStream: :class:`NatsBridge` (an engine) on one stream.

``from shmbus.adapters.nats import NatsBridge``. It needs no client library: the bridge speaks the NATS protocol
itself (:mod:`.client`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from shmbus.engine_urls import lazy_attributes, register_engine_kind

if TYPE_CHECKING:
    from shmbus.engines import Engine

    from .bridge import NatsBridge
    from .errors import NatsBridgeError, NatsUnavailable

__all__ = ["NatsBridge", "NatsBridgeError", "NatsUnavailable"]

__getattr__ = lazy_attributes(__name__, f"{__name__}.bridge", __all__)


def _engine(url: str, relay: bool, options: Mapping[str, str]) -> Engine:
    """The recorded engine (its stream, and its subject prefix when not the default), imported on first use."""
    from .bridge import NatsBridge

    return NatsBridge(url, relay=relay, stream=options.get("stream"), subject=options.get("subject") or None)


register_engine_kind("nats", ("nats",), _engine)
