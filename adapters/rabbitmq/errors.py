"""The RabbitMQ bridge's typed errors and its URL without the password (shared by the backend and the engine)."""

from __future__ import annotations

from typing import NamedTuple
from urllib.parse import unquote, urlsplit, urlunsplit

from shmbus.errors import EngineError

__all__ = ["AmqpUrl", "RabbitBridgeError", "RabbitUnavailable", "parse_url", "redact_url", "stream_down"]


class RabbitBridgeError(EngineError):
    """The RabbitMQ bridge could not carry out a publish; the message was not stored."""


class RabbitUnavailable(RabbitBridgeError):
    """RabbitMQ could not be reached, or closed the connection before the publish was sent. (A connection lost, or
    no confirm within ``command_timeout``, once it was sent is :class:`~shmbus.errors.PublishOutcomeUnknown`.)"""


class AmqpUrl(NamedTuple):
    host: str
    port: int
    user: str
    password: str
    vhost: str


def parse_url(url: str) -> AmqpUrl:
    """``amqp://user:password@host:port/vhost`` (the vhost URL-quoted: ``%2F`` is ``/``; none: ``/``)."""
    parts = urlsplit(url)
    if parts.scheme != "amqp":
        raise ValueError(f"not an amqp:// URL: {redact_url(url)!r} (amqps:// is not supported)")
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    return AmqpUrl(
        parts.hostname or "127.0.0.1",
        parts.port or 5672,
        unquote(parts.username or "guest"),
        unquote(parts.password or "guest"),
        unquote(path) if path else "/",
    )


#: RabbitMQ's words for a stream it has and does not run: declared (404), consumed while its replica is starting
_NOT_RUNNING = ("is down or inaccessible", "does not have a replica on the local node")


def stream_down(stream: str, reply: str) -> str | None:
    """What a ``reply`` to declaring or consuming ``stream`` means when RabbitMQ has the stream but does not run it
    (404 "home node ... of durable queue ... is down or inaccessible"; 406 "... does not have a replica on the local
    node"), else None. A broker that restarted starts its streams a moment after it accepts connections; RabbitMQ
    3.10 loses them for good when it crashed within half a second of the node's first stream (even
    ``queue.delete`` then answers this)."""
    if not any(words in reply for words in _NOT_RUNNING):
        return None
    return (
        f"{reply} (the stream {stream!r} exists but RabbitMQ does not run it: a restarted broker starts it within "
        "seconds (the relay retries; publish again then); one that stays down, `rabbitmqctl list_queues name "
        "state` showing it down, was lost by RabbitMQ: the bus needs another stream)"
    )


def redact_url(url: str) -> str:
    """``url`` with its password replaced by ``***`` (logs, health and the segment's record must not leak it)."""
    parts = urlsplit(url)
    if parts.password:
        netloc = f"{parts.username or ''}:***@{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")
        return urlunsplit(parts._replace(netloc=netloc))
    return url
