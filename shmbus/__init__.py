"""shmbus: message_bus for Python, over shared memory.

Every process on a host that opens the same bus name shares one segment holding the global log and per-channel
backlogs; a publish in any process reaches subscribers in every process, with no broker. The module-level
functions act on a default bus (name from ``SHMBUS_NAME``, else ``"default"``), configured with
:func:`configure` before first use.
"""

from __future__ import annotations

from typing import Any

from . import errors, forks
from .bus import Backlog, Bus, Subscription
from .cache import DistributedCache
from .codecs import Codec, JsonCodec, MsgpackCodec
from .default import configure, default_bus
from .engines import Engine, Envelope, PubSubEngine, SharedMemoryEngine
from .errors import *  # noqa: F403  # every typed error, as listed in errors.__all__
from .message import Message

__version__ = "0.1.0"

__all__ = [
    "Backlog",
    "Bus",
    "Codec",
    "DistributedCache",
    "Engine",
    "Envelope",
    "JsonCodec",
    "Message",
    "MsgpackCodec",
    "PubSubEngine",
    "SharedMemoryEngine",
    "Subscription",
    "after_fork",
    "backlog",
    "configure",
    "default_bus",
    "global_backlog",
    "last_id",
    "last_ids",
    "local_subscribe",
    "off",
    "on",
    "publish",
    "register_client_message_filter",
    "subscribe",
    "unsubscribe",
    *errors.__all__,
]


def publish(channel: str, data: Any, **kwargs: Any) -> int | None:
    return default_bus().publish(channel, data, **kwargs)


def subscribe(channel: str | None, callback: Any, last_id: int | None = None, **kwargs: Any) -> Subscription | None:
    return default_bus().subscribe(channel, callback, last_id, **kwargs)


def local_subscribe(channel: str | None, callback: Any, last_id: int | None = None, **kwargs: Any) -> Any:
    return default_bus().local_subscribe(channel, callback, last_id, **kwargs)


def unsubscribe(channel: str | None = None, callback: Any = None, **kwargs: Any) -> int:
    return default_bus().unsubscribe(channel, callback, **kwargs)


def backlog(channel: str | None = None, last_id: int | None = 0, site_id: str | None = None) -> Backlog:
    return default_bus().backlog(channel, last_id, site_id)


def global_backlog(last_id: int | None = None) -> list[Message]:
    return default_bus().global_backlog(last_id)


def last_id(channel: str, site_id: str | None = None) -> int:
    return default_bus().last_id(channel, site_id)


def last_ids(*channels: str, site_id: str | None = None) -> dict[str, int]:
    return default_bus().last_ids(*channels, site_id=site_id)


def register_client_message_filter(prefix: str, fn: Any = None) -> None:
    default_bus().register_client_message_filter(prefix, fn)


def off(disable_publish: bool = True) -> None:
    default_bus().off(disable_publish)


def on() -> None:
    default_bus().on()


def after_fork() -> None:
    """Re-arm every bus of this process after a fork (done automatically; server hooks call it too)."""
    forks.after_fork_in_child()
