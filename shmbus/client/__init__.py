"""A client of the message_bus poll protocol: subscribe over HTTP to shmbus or to the gem, from any process.

``pip install 'shmbus[client]'`` (httpx). Importing it touches no bus: no segment, no ``/dev/shm``.

    from shmbus.client import MessageBusClient

    with MessageBusClient("https://meta.discourse.org") as bus:
        for msg in bus.listen("/latest"):
            print(msg.message_id, msg.data)

:class:`AsyncMessageBusClient` is the async core (asyncio or trio, through anyio); :class:`MessageBusClient` runs
it on an asyncio loop thread of its own.
It speaks the protocol as the JS client does (``__seq``, ``?dlp=t``, streamed or plain answers by their
``Content-Type``); see ``docs/client.md``.
"""

from __future__ import annotations

from .chunks import AnswerTooLarge, ProtocolViolation
from .core import AsyncMessageBusClient, ClientStats, PollFailed
from .message import ClientMessage
from .outcomes import HeadersFailed
from .positions import ClientSubscription, Reset
from .store import FilePositionStore, PositionStore
from .sync import MessageBusClient

#: The names these classes had before (``shmbus.client.Message``, ``shmbus.client.Subscription``), kept for code that
#: imports them; the classes are renamed so that ``Message`` and ``Subscription`` each name one thing in the package
#: (the bus's own: :class:`shmbus.Message`, :class:`shmbus.Subscription`).
Message = ClientMessage
Subscription = ClientSubscription

__all__ = [
    "AnswerTooLarge",
    "AsyncMessageBusClient",
    "ClientMessage",
    "ClientStats",
    "ClientSubscription",
    "FilePositionStore",
    "HeadersFailed",
    "Message",
    "MessageBusClient",
    "PollFailed",
    "PositionStore",
    "ProtocolViolation",
    "Reset",
    "Subscription",
]
