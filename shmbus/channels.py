"""Channel and site names: what is accepted, and how a (channel, site) pair is stored.

This is the one validator of names. The bus, the HTTP protocol and the transports all use
:func:`channel_problem` (the transports add their own policy on top: a leading ``/``, no internal ``/__`` names).
Stored names follow message_bus: ``<channel>$|$<site>`` when a site applies, never for ``/global/`` channels.
"""

from __future__ import annotations

from typing import Any

from .errors import InvalidChannel

__all__ = [
    "GLOBAL_PREFIX",
    "MAX_CHANNEL_BYTES",
    "MAX_SITE_BYTES",
    "SITE_SEPARATOR",
    "backend_name",
    "channel_problem",
    "check_channel",
    "check_site",
    "split_backend_name",
]

#: Longest channel name accepted, in UTF-8 bytes (the channel index stores names inline).
MAX_CHANNEL_BYTES = 160
#: Longest site id accepted, in UTF-8 bytes.
MAX_SITE_BYTES = 29
#: Joins a channel and its site in stored names (the gem's separator; refused inside names).
SITE_SEPARATOR = "$|$"
SITE_SEPARATOR_BYTES = SITE_SEPARATOR.encode()
#: Channels under this prefix are shared by every site.
GLOBAL_PREFIX = "/global/"


def channel_problem(channel: Any) -> str | None:
    """Why ``channel`` cannot be a channel name, or None when it can."""
    if not isinstance(channel, str):
        return f"channel must be a str, got {type(channel).__name__}: {channel!r}"[:200]
    if not channel:
        return "channel must not be empty"
    if "\x00" in channel:
        return f"channel must not contain NUL: {channel[:80]!r}"
    if SITE_SEPARATOR in channel:
        return f"channel must not contain the site separator '{SITE_SEPARATOR}': {channel[:80]!r}"
    if len(channel) > MAX_CHANNEL_BYTES:  # at least as many bytes as characters: no need to encode it all
        return f"channel is longer than {MAX_CHANNEL_BYTES} bytes in UTF-8"
    try:
        size = len(channel.encode())
    except UnicodeEncodeError as exc:
        return f"channel is not valid unicode: {exc}"
    if size > MAX_CHANNEL_BYTES:
        return f"channel is {size} bytes in UTF-8; the limit is {MAX_CHANNEL_BYTES}"
    return None


def check_channel(channel: Any) -> bytes:
    """The UTF-8 name of a valid channel; :class:`~shmbus.errors.InvalidChannel` otherwise."""
    problem = channel_problem(channel)
    if problem is not None:
        raise InvalidChannel(problem)
    return channel.encode()  # type: ignore[no-any-return,unused-ignore]


def check_site(site_id: Any) -> bytes:
    """The UTF-8 name of a valid site id; :class:`~shmbus.errors.InvalidChannel` otherwise."""
    if not isinstance(site_id, str):
        raise InvalidChannel(f"site_id must be a str, got {type(site_id).__name__}: {site_id!r}")
    if "\x00" in site_id or SITE_SEPARATOR in site_id:
        raise InvalidChannel(f"site_id must be a str without NUL or '{SITE_SEPARATOR}', got {site_id!r}")
    try:
        encoded = site_id.encode()
    except UnicodeEncodeError as exc:
        raise InvalidChannel(f"site_id is not valid unicode: {exc}") from None
    if len(encoded) > MAX_SITE_BYTES:
        raise InvalidChannel(f"site_id is {len(encoded)} bytes in UTF-8; the limit is {MAX_SITE_BYTES}")
    return encoded


def backend_name(channel: str, site_id: str | None) -> str:
    """The stored name: ``<channel>$|$<site>`` when a site applies (never to a ``/global/`` channel)."""
    if site_id and not channel.startswith(GLOBAL_PREFIX):
        return channel + SITE_SEPARATOR + site_id
    return channel


def split_backend_name(name: str) -> tuple[str, str | None]:
    """``(channel, site or None)`` of a stored name (inverse of :func:`backend_name`)."""
    channel, separator, site = name.partition(SITE_SEPARATOR)
    return channel, (site or None) if separator else None
