"""A browser's push subscription as stored (:class:`Registration`), how one is validated, and who a message is for.

Sans-IO: no store, no HTTP. The REST app parses what a page posts (:func:`parse_registration`); the sender asks a
:class:`Recipients` index which devices a message goes to. The rules for "who" are the message_bus middleware's
(``Waiter.allowed``: ``client_ids`` never match a device, ``user_ids`` by the registering user, ``group_ids``
through a send-time lookup), guble's user spaces on top (``/user/<id>/...`` reaches only that user's devices), plus
the site and the bus's client message filters. Anything that cannot be decided safely is not pushed.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from shmbus.channels import channel_problem
from shmbus.message import Message

from ..http import ProtocolError
from ..http.waiter import Lookups, Waiter, filter_allows
from ..transports.replay import site_matches

__all__ = [
    "MAX_ENDPOINT",
    "MAX_TOPICS",
    "Recipients",
    "Registration",
    "b64url_decode",
    "default_endpoint_allowed",
    "may_receive",
    "parse_registration",
    "topic_matches",
    "user_key",
]

MAX_ENDPOINT = 2048  # bytes of an endpoint URL (browsers' are 150-500)
MAX_TOPICS = 50  # topics one device may subscribe to
USER_SPACE = "/user/"  # guble's user topics (the same prefix as shmbus.adapters.guble)
_INTERNAL = "/__"


def b64url_decode(text: str) -> bytes:
    """Base64url with or without padding (browsers send it unpadded); ValueError when it is not."""
    if not isinstance(text, str) or not text.isascii():
        raise ValueError("not base64url text")
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"not base64url: {exc}") from None


def user_key(user_id: Any) -> str:
    """The stored form of a user id: JSON, so ``42`` and ``"42"`` stay what ``user_id_lookup`` returned and
    targeting compares them exactly as the HTTP middleware does."""
    return json.dumps(user_id, separators=(",", ":"))


@dataclass(frozen=True)
class Registration:
    """One device: its endpoint (the primary key: one browser profile, one endpoint), its RFC 8291 keys, the user
    who registered it, the site it registered on and the topics (guble-style prefixes) it wants."""

    endpoint: str
    p256dh: str
    auth: str
    user_id: Any
    topics: tuple[str, ...]
    site_id: str | None = None
    created: float = 0.0

    @property
    def origin(self) -> str:
        """``scheme://host[:port]`` of the push service: the VAPID audience and the sender's lane key."""
        parts = urlsplit(self.endpoint)
        return f"{parts.scheme}://{parts.netloc}"

    def subscription_info(self) -> dict[str, Any]:
        """The browser's ``PushSubscription.toJSON()`` shape (what pywebpush takes)."""
        return {"endpoint": self.endpoint, "keys": {"p256dh": self.p256dh, "auth": self.auth}}

    def to_json(self) -> dict[str, Any]:
        return {**self.subscription_info(), "user_id": self.user_id, "topics": list(self.topics),
                "site_id": self.site_id, "created": self.created}  # fmt: skip

    @classmethod
    def from_json(cls, item: dict[str, Any]) -> Registration:
        return cls(
            item["endpoint"],
            item["keys"]["p256dh"],
            item["keys"]["auth"],
            item["user_id"],
            tuple(item["topics"]),
            item.get("site_id"),
            float(item.get("created") or 0.0),
        )


def default_endpoint_allowed(url: str) -> bool:
    """The default endpoint policy: ``https`` to a host name, never an IP address in any spelling or ``localhost``.

    Why: the sender POSTs to whatever URL a browser registered, so an endpoint is a request a user can make the
    server send (SSRF). Push services are public HTTPS hosts; pass ``allow_endpoint`` to narrow it further (e.g.
    to ``fcm.googleapis.com``, ``updates.push.services.mozilla.com``, ``*.push.apple.com``). The sender checks
    the addresses a host name resolves to as well (``allow_address``, default :func:`~.addresses.public_address`):
    a name is no proof of where it points."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower().rstrip(".")
    if parts.scheme != "https" or not host or host == "localhost" or host.endswith(".localhost"):
        return False
    # no top-level domain is numeric: ``2130706433``, ``127.1``, ``0x7f.1`` are IPv4 addresses to the resolver
    last = host.rsplit(".", 1)[-1]
    if last.isdigit() or re.fullmatch(r"0x[0-9a-f]*", last):
        return False
    try:
        ipaddress.ip_address(host)
        return False
    except ValueError:
        return True


def _check_endpoint(endpoint: Any, allow: Callable[[str], bool]) -> str:
    if not isinstance(endpoint, str) or not endpoint or len(endpoint.encode()) > MAX_ENDPOINT:
        raise ProtocolError(400, f"subscription.endpoint must be a URL of at most {MAX_ENDPOINT} bytes")
    try:
        parts = urlsplit(endpoint)
        parts.port  # noqa: B018 (raises ValueError on a bad port)
    except ValueError:
        raise ProtocolError(400, "subscription.endpoint is not a valid URL") from None
    if parts.scheme not in ("https", "http") or not parts.hostname or parts.username or parts.password:
        raise ProtocolError(400, "subscription.endpoint must be an http(s) URL without credentials")
    if any(c in endpoint for c in "\r\n\t "):
        raise ProtocolError(400, "subscription.endpoint must not contain whitespace")
    if not allow(endpoint):
        raise ProtocolError(403, "subscription.endpoint is not an allowed push service")
    return endpoint


def _check_keys(keys: Any) -> tuple[str, str]:
    from cryptography.hazmat.primitives.asymmetric import ec

    if not isinstance(keys, dict):
        raise ProtocolError(400, "subscription.keys must be an object with p256dh and auth")
    p256dh, auth = keys.get("p256dh"), keys.get("auth")
    if not isinstance(p256dh, str) or not isinstance(auth, str):
        raise ProtocolError(400, "subscription.keys.p256dh and .auth must be base64url strings")
    try:
        point = b64url_decode(p256dh)
        if len(point) != 65 or point[0] != 4:
            raise ValueError("must be an uncompressed P-256 point (65 bytes)")
        ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), point)  # ValueError when not on the curve
    except ValueError as exc:
        raise ProtocolError(400, f"subscription.keys.p256dh: {exc}"[:200]) from None
    try:
        if len(b64url_decode(auth)) != 16:
            raise ValueError("must be 16 bytes")
    except ValueError as exc:
        raise ProtocolError(400, f"subscription.keys.auth: {exc}"[:200]) from None
    return p256dh, auth


def check_topic(topic: Any, user_id: Any, pushes: Callable[[str], bool]) -> str:
    """A topic a user may subscribe a device to: a valid channel (a guble-style prefix), one the app pushes, and
    within the user's own space when it is under ``/user/<id>``. 400/403 as ProtocolError."""
    problem = channel_problem(topic)
    if problem is not None or not topic.startswith("/") or topic.startswith(_INTERNAL):
        raise ProtocolError(400, f"invalid topic {str(topic)[:80]!r}: {problem or 'must start with / (not /__)'}")
    name: str = str(topic).rstrip("/") or "/"
    # a topic above the user spaces (``/``, ``/user``) is fine: delivery checks each user topic's owner
    if name.startswith(USER_SPACE) and name[len(USER_SPACE) :].split("/", 1)[0] != str(user_id):
        raise ProtocolError(403, f"topic {name[:80]!r} is another user's space")
    if not pushes(name):
        raise ProtocolError(403, f"topic {name[:80]!r} is not a push channel")
    return name


def parse_registration(
    body: Any,
    user_id: Any,
    site_id: str | None,
    pushes: Callable[[str], bool],
    allow_endpoint: Callable[[str], bool],
    now: float,
) -> Registration:
    """``{"subscription": <PushSubscription JSON>, "topics": [...]}`` from a signed-in user -> a Registration."""
    if not isinstance(body, dict) or not isinstance(body.get("subscription"), dict):
        raise ProtocolError(400, 'body must be {"subscription": <PushSubscription.toJSON()>, "topics": [...]}')
    sub = body["subscription"]
    endpoint = _check_endpoint(sub.get("endpoint"), allow_endpoint)
    p256dh, auth = _check_keys(sub.get("keys"))
    topics = body.get("topics")
    if not isinstance(topics, list) or not topics or len(topics) > MAX_TOPICS:
        raise ProtocolError(400, f"topics must be a list of 1-{MAX_TOPICS} channels")
    checked = tuple(sorted({check_topic(t, user_id, pushes) for t in topics}))
    return Registration(endpoint, p256dh, auth, user_id, checked, site_id, now)


def may_receive(
    msg: Message, user_id: Any, site_id: str | None, groups: Callable[[], frozenset[Any]], bus: Any
) -> bool:
    """May ``user_id`` (on ``site_id``) receive ``msg``: guble's user spaces, the site, message_bus's targeting
    (``groups()`` is called only for a message with ``group_ids``) and the bus's client message filters."""
    if msg.channel.startswith(_INTERNAL):
        return False
    if msg.channel.startswith(USER_SPACE):
        owner = msg.channel[len(USER_SPACE) :].split("/", 1)[0]
        if user_id is None or owner != str(user_id):
            return False
    if not site_matches(msg, site_id):
        return False
    if msg.targeted:
        checker = Waiter("", 0, Lookups(user_id, groups() if msg.group_ids else frozenset(), site_id), (), True, 0)
        if not checker.allowed(msg):
            return False
    return not (bus is not None and bus.client_message_filters and not filter_allows(bus, msg))


def topic_matches(topic: str, channel: str) -> bool:
    """guble's hierarchy: ``/chat`` receives ``/chat`` and ``/chat/1``, never ``/chatter``."""
    return channel == topic or channel.startswith(topic + "/") or topic == "/"


def _ancestors(channel: str) -> list[str]:
    """``/a/b/c`` -> ``["/a/b/c", "/a/b", "/a", "/"]``: every topic that receives the channel."""
    out = [channel]
    while "/" in channel.rstrip("/")[1:]:
        channel = channel.rsplit("/", 1)[0]
        out.append(channel)
    out.append("/")
    return out


@dataclass
class Recipients:
    """The devices of a set of registrations, indexed by topic, and the targeting decision for one message.

    ``group_ids_for(user_id) -> iterable`` is called at send time (cached for one batch), never stored: a user
    removed from a group stops receiving the group's pushes at once. Without it, a message targeted only at groups
    reaches nobody (and is counted as ``unroutable``)."""

    registrations: Iterable[Registration]
    bus: Any = None
    group_ids_for: Callable[[Any], Any] | None = None
    by_topic: dict[str, list[Registration]] = field(default_factory=dict, init=False)
    _groups: dict[str, frozenset[Any]] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        for reg in self.registrations:
            for topic in reg.topics:
                self.by_topic.setdefault(topic, []).append(reg)

    def new_batch(self) -> None:
        self._groups.clear()

    def devices(self, msg: Message) -> list[Registration]:
        """The devices ``msg`` is for, each once (a device subscribed to ``/chat`` and ``/chat/1`` gets one)."""
        if msg.channel.startswith(_INTERNAL):
            return []
        seen: dict[str, Registration] = {}
        for topic in _ancestors(msg.channel):
            for reg in self.by_topic.get(topic, ()):
                if reg.endpoint not in seen and self.allowed(reg, msg):
                    seen[reg.endpoint] = reg
        return list(seen.values())

    def allowed(self, reg: Registration, msg: Message) -> bool:
        return may_receive(msg, reg.user_id, reg.site_id, lambda: self._groups_of(reg.user_id), self.bus)

    def _groups_of(self, user_id: Any) -> frozenset[Any]:
        if self.group_ids_for is None:
            return frozenset()
        key = user_key(user_id)
        got = self._groups.get(key)
        if got is None:
            value = self.group_ids_for(user_id) or ()
            got = self._groups[key] = frozenset((value,) if isinstance(value, (str, bytes)) else value)
        return got
