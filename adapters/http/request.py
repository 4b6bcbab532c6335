"""Parsing a poll: channels and last ids from a JSON or form body, ``__seq``, ``dlp``."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from shmbus import jsonlib
from shmbus.channels import channel_problem
from shmbus.presence.browser import VIEW_PREFIX, watched

from .interning import intern_bounded
from .options import Options
from .wire import MAX_ID, ProtocolError

_INT_RE = re.compile(r"[ \t]*-?[0-9]{1,20}[ \t]*\Z")


# ---------------------------------------------------------------------------------------------------- parsing
@dataclass
class PollRequest:
    """A parsed poll: ``channels`` maps channel -> requested id (None = "from now", as ``""``/``null``)."""

    client_id: str
    channels: dict[str, int | None]
    seq: int = 0
    dlp: bool = False
    dont_chunk: bool = False
    http11: bool = True


def _parse_id(channel: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise ProtocolError(400, f"invalid id for channel {channel[:80]!r}: {value!r}")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str):
        if value == "":
            return None
        if not _INT_RE.match(value):
            raise ProtocolError(400, f"invalid id for channel {channel[:80]!r}: {value[:40]!r} is not an integer")
        n = int(value)
    elif isinstance(value, float) and value.is_integer():
        n = int(value)
    else:
        raise ProtocolError(400, f"invalid id for channel {channel[:80]!r}: {str(value)[:40]!r}")
    if not -MAX_ID <= n <= MAX_ID:
        raise ProtocolError(400, f"id out of range for channel {channel[:80]!r} (|id| must be <= {MAX_ID})")
    return n


def _parse_seq(value: Any) -> int:
    if value is None or value == "":
        return 0
    n = _parse_id("__seq", value)
    return 0 if n is None else n


def parse_query_dlp(query: str) -> bool:
    """True when the query string has a ``dlp`` parameter whose value starts with ``t`` (``dlp=t``)."""
    if "dlp" not in query:
        return False
    for part in query.split("&"):
        name, _, value = part.partition("=")
        if name == "dlp" and value[:1] in ("t", "T", "1"):
            return True
    return False


def check_client_channel(channel: Any, what: str = "channel") -> str:
    """A channel (or pattern, or path) name from a client: the bus's one rule
    (:func:`shmbus.channels.channel_problem`) with its reserved ``/__`` names refused too; a ProtocolError(400)
    with the reason, never a crash. Every HTTP entry (polls, SSE, WebSocket, REST, guble) uses this; code inside
    the process uses :func:`shmbus.channels.check_channel` (the same rule, a typed ``InvalidChannel``)."""
    problem = channel_problem(channel, reserved=False, what=what)
    if problem is not None:
        raise ProtocolError(400, problem)
    return channel  # type: ignore[no-any-return]


def check_subscribe_channel(channel: Any) -> str:
    """A channel a client subscribes: :func:`check_client_channel`'s rule, except that the presence view of a
    channel (``/__presence/<channel>``, :mod:`shmbus.presence.browser`) may be read, never published."""
    if isinstance(channel, str) and channel.startswith(VIEW_PREFIX):
        if watched(channel) is None:
            raise ProtocolError(400, f"channel {channel[:80]!r} is no presence view of a channel")
        check_client_channel(watched(channel))
        return channel
    return check_client_channel(channel)


def parse_body(content_type: str | None, body: bytes, options: Options) -> tuple[dict[str, int | None], int]:
    """Parse a poll body into ``(channels, seq)``; raise :class:`ProtocolError` on bad input."""
    if len(body) > options.max_body_size:
        raise ProtocolError(413, f"request body too large (limit {options.max_body_size} bytes)")
    ctype = (content_type or "").lower()
    items: Iterable[tuple[Any, Any]]
    if "application/json" in ctype:
        if not body.strip():
            items = ()
        else:
            try:
                text = body.decode("utf-8")
            except UnicodeDecodeError:
                raise ProtocolError(400, "request body is not valid UTF-8")
            try:
                obj = jsonlib.loads(body)
            except (ValueError, RecursionError):  # RecursionError: the stdlib parser on deep nesting
                raise ProtocolError(400, "malformed JSON body")
            if obj is None:
                obj = {}
            if not isinstance(obj, dict):
                raise ProtocolError(400, "JSON body must be an object mapping channel to last id")
            items = obj.items()
    elif not ctype or ctype.startswith("application/x-www-form-urlencoded"):
        try:
            text = body.decode("ascii") if body.isascii() else body.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError(400, "request body is not valid UTF-8")
        try:
            items = _parse_form(text, options.max_channels_per_poll + 1)
        except UnicodeDecodeError:
            raise ProtocolError(400, "form body is not valid UTF-8 (after percent-decoding)")
        except ValueError:
            raise ProtocolError(400, f"too many channels in one poll (limit {options.max_channels_per_poll})")
    else:
        raise ProtocolError(415, "unsupported content type (use application/x-www-form-urlencoded or application/json)")
    return _channels_from_items(items, options)


def _parse_form(text: str, max_fields: int) -> list[tuple[str, str]]:
    """``parse_qsl(text, keep_blank_values=True, errors="strict", max_num_fields=max_fields)``, with a fast path
    for bodies that need no decoding (the JS client's ``/channel=id&__seq=n``: no ``%`` and no ``+``)."""
    if "%" in text or "+" in text:
        return parse_qsl(text, keep_blank_values=True, encoding="utf-8", errors="strict", max_num_fields=max_fields)
    if 1 + text.count("&") > max_fields:
        raise ValueError("Max number of fields exceeded")
    out = []
    for part in text.split("&"):
        if part:
            name, _, value = part.partition("=")
            out.append((name, value))
    return out


_CHANNEL_NAMES: dict[str, str] = {}


def shared_channel(ch: str) -> str:
    """One str object per channel name (bounded): a parked client holds its channel names in several places
    (its channels, index keys and last ids), and thousands of clients name the same channels."""
    return _CHANNEL_NAMES.get(ch) or intern_bounded(_CHANNEL_NAMES, ch, 20_000)  # a hit costs no call


def _channels_from_items(items: Iterable[tuple[Any, Any]], options: Options) -> tuple[dict[str, int | None], int]:
    channels: dict[str, int | None] = {}
    seq = 0
    for key, value in items:
        if key == "__seq":
            seq = _parse_seq(value)
            continue
        ch = shared_channel(check_subscribe_channel(key))
        channels[ch] = _parse_id(ch, value)
        if len(channels) > options.max_channels_per_poll:
            raise ProtocolError(400, f"too many channels in one poll (limit {options.max_channels_per_poll})")
    return channels, seq


def channels_override(value: Any, seq: Any, options: Options) -> tuple[dict[str, int | None], int]:
    """The gem's ``env['message_bus.channels']``/``env['message_bus.seq']`` set by an upstream middleware."""
    if not isinstance(value, Mapping):
        raise TypeError("message_bus.channels must be a mapping of channel -> last id")
    channels, _ = _channels_from_items(value.items(), options)
    return channels, _parse_seq(seq)


def poll_request(
    client_id: str,
    content_type: str | None,
    body: bytes,
    query: str,
    options: Options,
    *,
    override: Any = None,
    override_seq: Any = None,
    dont_chunk: bool = False,
    http11: bool = True,
) -> PollRequest:
    """A poll's :class:`PollRequest`: channels from ``override`` (the gem's ``message_bus.channels``, with
    ``message_bus.seq``) when set, else from the body; ``dlp`` from the query string."""
    if override is not None:
        channels, seq = channels_override(override, override_seq, options)
    else:
        channels, seq = parse_body(content_type, body, options)
    return PollRequest(client_id, channels, seq, dlp=parse_query_dlp(query), dont_chunk=dont_chunk, http11=http11)


def form_params(query: str, body: bytes, content_type: str | None) -> dict[str, str]:
    """Query plus form parameters (the broadcast route)."""
    params: dict[str, str] = {}
    try:
        for k, v in parse_qsl(query, keep_blank_values=True, errors="strict"):
            params[k] = v
        if body and (not content_type or content_type.lower().startswith("application/x-www-form-urlencoded")):
            for k, v in parse_qsl(body.decode("utf-8"), keep_blank_values=True, errors="strict"):
                params[k] = v
    except (UnicodeDecodeError, ValueError):
        raise ProtocolError(400, "malformed form parameters")
    return params
