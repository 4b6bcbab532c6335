"""Many hosts, one bus, through NATS JetStream: :class:`NatsBridge` (an engine) on one stream.

``from shmbus.adapters.nats import NatsBridge``. It needs no client library: the bridge speaks the NATS protocol
itself (:mod:`.client`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shmbus.engine_urls import lazy_attributes, lazy_engine, register_engine_kind

if TYPE_CHECKING:
    from .bridge import NatsBridge
    from .errors import NatsBridgeError, NatsUnavailable

__all__ = ["NatsBridge", "NatsBridgeError", "NatsUnavailable"]

__getattr__ = lazy_attributes(__name__, f"{__name__}.bridge", __all__)
register_engine_kind("nats", ("nats",), lazy_engine(f"{__name__}.bridge", "NatsBridge", "stream"))
