"""Per-message push options (RFC 8030 ``TTL``, ``Urgency``, ``Topic``) and the payload a service worker receives.

How options travel: a :class:`~shmbus.Message` has ids, channel, site, targeting and data, nothing else, and a
message published on one host is pushed by a sender that may run on another. So the options ride in the data:
a dict payload may carry a ``"__push__"`` object (``{"ttl": 60, "urgency": "high", "topic": "chat-1"}``), which
:func:`publish_push` adds and checks, and which the sender strips from what it pushes. A connector-side
``options_for(message) -> PushOptions | None`` callable may decide instead (None: do not push this message).

The payload is JSON: ``{"channel", "message_id", "global_id", "data"}`` (the message_bus client's four keys). The
push services' limit is 4096 bytes of encrypted body, which leaves :data:`MAX_PLAINTEXT` (3993) bytes of JSON
(RFC 8291: 86 bytes of header, 16 of tag, 1 of padding delimiter). A larger message is sent as a *fetch notice*
(``"fetch": true`` and no ``data``): the service worker fetches it from the push app's ``GET <prefix>message``,
which applies the same targeting. :func:`publish_push` can refuse it at publish time instead.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import Any

from shmbus.errors import InvalidMessage, PayloadTooLarge
from shmbus.message import Message

__all__ = [
    "MAX_PLAINTEXT",
    "OPTIONS_KEY",
    "URGENCIES",
    "PushOptions",
    "message_options",
    "payload_for",
    "publish_push",
]

MAX_PLAINTEXT = 4096 - 86 - 16 - 1
OPTIONS_KEY = "__push__"
URGENCIES = ("very-low", "low", "normal", "high")
_TOPIC = re.compile(r"[A-Za-z0-9_-]{1,32}")  # RFC 8030 5.4: at most 32 characters of the base64url alphabet
MAX_TTL = 28 * 86400  # what the large push services keep at most (4 weeks)


@dataclass(frozen=True)
class PushOptions:
    """``ttl`` seconds the push service keeps an undelivered push (0: deliver now or never), ``urgency`` (RFC 8030
    5.3), ``topic`` (a newer push with the same topic replaces an undelivered older one)."""

    ttl: int = 86400
    urgency: str | None = None
    topic: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.ttl, bool) or not isinstance(self.ttl, int) or not 0 <= self.ttl <= MAX_TTL:
            raise InvalidMessage(f"push ttl must be an int of 0-{MAX_TTL} seconds, got {self.ttl!r}")
        if self.urgency is not None and self.urgency not in URGENCIES:
            raise InvalidMessage(f"push urgency must be one of {URGENCIES}, got {self.urgency!r}")
        if self.topic is not None and (not isinstance(self.topic, str) or not _TOPIC.fullmatch(self.topic)):
            raise InvalidMessage(f"push topic must be 1-32 characters of [A-Za-z0-9_-], got {self.topic!r}")

    def headers(self) -> dict[str, str]:
        out = {"TTL": str(self.ttl)}
        if self.urgency:
            out["Urgency"] = self.urgency
        if self.topic:
            out["Topic"] = self.topic
        return out

    def merged(self, raw: Any) -> PushOptions:
        """These options with the overrides of a ``"__push__"`` object (InvalidMessage when it is malformed)."""
        if not isinstance(raw, dict) or set(raw) - {"ttl", "urgency", "topic"}:
            raise InvalidMessage(f'"{OPTIONS_KEY}" must be an object with ttl, urgency and/or topic')
        return replace(self, **raw)


def message_options(msg: Message, default: PushOptions) -> tuple[PushOptions, Any]:
    """The options a message asks for and its data without them (InvalidMessage for malformed options)."""
    data = msg.data
    if isinstance(data, dict) and OPTIONS_KEY in data:
        data = dict(data)
        return default.merged(data.pop(OPTIONS_KEY)), data
    return default, data


def payload_for(msg: Message, data: Any) -> tuple[bytes, bool]:
    """The JSON a service worker receives, and whether it is a fetch notice (the message was too large)."""
    head = {"channel": msg.channel, "message_id": msg.message_id, "global_id": msg.global_id}
    body = json.dumps({**head, "data": data}, separators=(",", ":"), default=str).encode()
    if len(body) <= MAX_PLAINTEXT:
        return body, False
    return json.dumps({**head, "fetch": True}, separators=(",", ":")).encode(), True


def publish_push(
    bus: Any,
    channel: str,
    data: Any,
    *,
    ttl: int | None = None,
    urgency: str | None = None,
    topic: str | None = None,
    refuse_oversize: bool = True,
    **publish_options: Any,
) -> int | None:
    """``bus.publish`` with push options in the payload, checked before anything is stored.

    ``refuse_oversize`` (default): raise :class:`~shmbus.errors.PayloadTooLarge` when the pushed JSON would not fit
    a push message (the other transports would still carry it; publish it with ``bus.publish`` to have it pushed
    as a fetch notice instead)."""
    given = {k: v for k, v in (("ttl", ttl), ("urgency", urgency), ("topic", topic)) if v is not None}
    PushOptions().merged(given)  # validate now: a refused option must not reach the bus
    if given:
        if not isinstance(data, dict):
            raise InvalidMessage("push options need a dict payload (they travel in its __push__ key)")
        data = {**data, OPTIONS_KEY: given}
    if refuse_oversize:
        plain = {k: v for k, v in data.items() if k != OPTIONS_KEY} if isinstance(data, dict) else data
        probe = {"channel": channel, "message_id": 1 << 53, "global_id": 1 << 53, "data": plain}
        size = len(json.dumps(probe, separators=(",", ":"), default=str).encode())
        if size > MAX_PLAINTEXT:
            raise PayloadTooLarge(f"push payload would be {size} bytes; a push message holds {MAX_PLAINTEXT}")
    result: int | None = bus.publish(channel, data, **publish_options)
    return result
