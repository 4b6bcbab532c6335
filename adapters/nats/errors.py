"""The NATS bridge's typed errors and the URL without its password (shared by the backend and the engine)."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from shmbus.errors import EngineError

__all__ = ["NatsBridgeError", "NatsUnavailable", "redact_url"]


class NatsBridgeError(EngineError):
    """The NATS bridge could not carry out a publish; the message was not stored."""


class NatsUnavailable(NatsBridgeError):
    """NATS (or its JetStream) could not be reached, or the publish could not be written: nothing was stored. (A
    publish written whose acknowledgement was not read is :class:`~shmbus.errors.PublishOutcomeUnknown`.)"""


def redact_url(url: str) -> str:
    """``url`` without its password or token (logs, ``health()`` and the segment's bridge record)."""
    parts = urlsplit(url if "://" in url else f"nats://{url}")
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    user = f"{parts.username}:***" if parts.password is not None else "***"
    netloc = f"{user}@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))
