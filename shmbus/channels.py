"""Channel, site and bus names: what is accepted, and how a (channel, site) pair is stored.

This is the one rule for channel names, used by the bus, the HTTP protocol, the SSE/WebSocket/REST transports, the
admin page and the Spark sink (:func:`channel_problem`; the error is always :class:`~shmbus.errors.InvalidChannel`,
which the HTTP layers answer with a 400). A channel name:

* is a non-empty ``str`` that starts with ``/`` (the gem's own ``MessageBus::HTTPClient`` refuses anything else,
  and its ``/global/`` and ``/__`` conventions are path prefixes; ``publish("chat", ...)`` is an error, not a
  second spelling of ``/chat``);
* holds no NUL, CR or LF and not the gem's site separator ``$|$``;
* is at most :data:`MAX_CHANNEL_BYTES` bytes in UTF-8.

Names under :data:`RESERVED_PREFIX` (``/__``) belong to the bus itself (the keepalive, ``/__status``, the
DistributedCache, the Spark sink's progress records): the bus's Python API reads and writes them, but input from
outside (an HTTP poll, a transport, a Spark row) that names one is refused (``reserved=False``).

Stored names follow message_bus: ``<channel>$|$<site>`` when a site applies, never for ``/global/`` channels.

A bus name (:func:`check_bus_name`) is a file name in ``/dev/shm``: ASCII letters, digits and ``_ . @ + : = -``,
1 to 200 of them, not starting with ``.`` or ``-``. No whitespace or control character (a newline made
``shmbus list`` show two buses), no ``/``.
"""

from __future__ import annotations

import re
from typing import Any

from .errors import InvalidArgument, InvalidChannel

__all__ = [
    "GLOBAL_PREFIX",
    "MAX_CHANNEL_BYTES",
    "MAX_SITE_BYTES",
    "SITE_SEPARATOR",
    "RESERVED_PREFIX",
    "backend_name",
    "check_bus_name",
    "channel_key",
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
_BUS_NAME = re.compile(r"[A-Za-z0-9_@+:=][A-Za-z0-9_.@+:=-]{0,199}")
#: Channels under this prefix are the bus's own; input from outside may not name them.
RESERVED_PREFIX = "/__"


def channel_problem(channel: Any, *, reserved: bool = True, what: str = "channel") -> str | None:
    """Why ``channel`` cannot be a channel name, or None when it can (the module doc states the rule).

    ``reserved=False`` also refuses the bus's own ``/__`` names (input from outside); ``what`` names the thing in
    the reason (``"pattern"``, ``"path"``)."""
    if not isinstance(channel, str):
        return f"{what} must be a str, got {type(channel).__name__}: {channel!r}"[:200]
    if not channel:
        return f"{what} must not be empty"
    if not channel.startswith("/"):
        return f"{what} must start with '/' (message_bus channel names are paths): {channel[:80]!r}"
    if "\x00" in channel:
        return f"{what} must not contain NUL: {channel[:80]!r}"
    if "\r" in channel or "\n" in channel:
        return f"{what} must not contain CR or LF: {channel[:80]!r}"
    if SITE_SEPARATOR in channel:
        return f"{what} must not contain the site separator '{SITE_SEPARATOR}': {channel[:80]!r}"
    if len(channel) > MAX_CHANNEL_BYTES:  # at least as many bytes as characters: no need to encode it all
        return f"{what} is longer than {MAX_CHANNEL_BYTES} bytes in UTF-8"
    try:
        size = len(channel.encode())
    except UnicodeEncodeError as exc:
        return f"{what} is not valid unicode: {exc}"
    if size > MAX_CHANNEL_BYTES:
        return f"{what} is {size} bytes in UTF-8; the limit is {MAX_CHANNEL_BYTES}"
    if not reserved and channel.startswith(RESERVED_PREFIX):
        return f"{what} {channel[:80]!r} is reserved (names starting with '{RESERVED_PREFIX}' are the bus's own)"
    return None


def check_channel(channel: Any, *, reserved: bool = True, what: str = "channel") -> str:
    """The one channel check: returns ``channel`` (a ``str``) when it is a valid name, raises
    :class:`~shmbus.errors.InvalidChannel` (a ``ValueError``) with :func:`channel_problem`'s reason otherwise.

    ``reserved=True`` (the bus's own callers) accepts the bus's ``/__`` names; ``reserved=False`` (input from
    outside) refuses them. ``what`` names the thing in the reason. Code that must answer otherwise (the web
    adapters answer HTTP 400) calls :func:`channel_problem` and raises its own error with the same reason."""
    problem = channel_problem(channel, reserved=reserved, what=what)
    if problem is not None:
        raise InvalidChannel(problem)
    return channel  # type: ignore[no-any-return]


def channel_key(channel: Any) -> bytes:
    """The UTF-8 name of a valid channel, as the segment stores it; :class:`~shmbus.errors.InvalidChannel`
    otherwise."""
    return check_channel(channel).encode()


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


def check_bus_name(name: Any) -> str:
    """``name`` when it can name a bus (see the module doc); :class:`~shmbus.errors.InvalidArgument` otherwise.

    The bus, the segment and the command line all check names here, so a name that one accepts the others do."""
    if not isinstance(name, str) or _BUS_NAME.fullmatch(name) is None:
        raise InvalidArgument(
            "a bus name is 1-200 of the characters A-Z a-z 0-9 _ . @ + : = - (not starting with '.' or '-'), "
            f"got {name!r}"[:300]
        )
    return name
