"""Many hosts, one bus, through a RabbitMQ stream queue: :class:`RabbitBridge` (an engine).

``from shmbus.adapters.rabbitmq import RabbitBridge``. The bridge speaks AMQP 0-9-1 itself (:mod:`.amqp`): no
client library is needed. Ids are the stream's offsets (+ 1), read by every host's relay from the broker's
``x-stream-offset``, so every host stores a message under the same id (see ``docs/rabbitmq.md``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shmbus.engine_urls import lazy_attributes, lazy_engine, register_engine_kind

if TYPE_CHECKING:
    from .bridge import RabbitBridge
    from .errors import RabbitBridgeError, RabbitUnavailable

__all__ = ["RabbitBridge", "RabbitBridgeError", "RabbitUnavailable"]

__getattr__ = lazy_attributes(__name__, f"{__name__}.bridge", __all__)
register_engine_kind("rabbitmq", ("amqp",), lazy_engine(f"{__name__}.bridge", "RabbitBridge", "stream"))
