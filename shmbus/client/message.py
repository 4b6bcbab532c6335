"""What a subscriber receives: one message of the poll protocol, with both ids."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

__all__ = ["AsyncCallback", "Callback", "ClientMessage", "STATUS_CHANNEL"]

#: The channel of the server's position reports (``{"channel": "/__status", "data": {channel: last_id}}``).
STATUS_CHANNEL = "/__status"


class ClientMessage(NamedTuple):
    """One message as the server sent it (a named tuple: immutable, and cheap to make by the thousand).

    One argument instead of the clients' positional ones settles their difference: the Ruby client calls
    ``(data, message_id, global_id)``, the JS client ``(data, global_id, message_id)``.
    """

    channel: str
    data: Any
    message_id: int
    global_id: int


#: A callback of the sync client (and one the async client may take too).
Callback = Callable[[ClientMessage], Any]
#: A callback of the async client: plain, or a coroutine function (awaited before the next message).
AsyncCallback = Callable[[ClientMessage], Any] | Callable[[ClientMessage], Awaitable[Any]]
