"""The relay keywords every bridge takes (``relay``, ``election_interval``, ``reconnect_max``, ``local_wait``,
``autostart``; documented on :class:`~shmbus.adapters.redis.RedisBridge`), written once: :class:`RelayKeywords`
types them for a constructor's ``**relay: Unpack[RelayKeywords]`` (mypy checks each one) and
:func:`relay_options` turns them, with their defaults, into the bridge kit's
:class:`~shmbus.adapters.bridge.RelayOptions`. It lives outside the kit because only the bridges' constructors
use it."""

from __future__ import annotations

from typing import TypedDict

from .engine import RelayOptions

__all__ = ["RelayKeywords", "relay_options"]


class RelayKeywords(TypedDict, total=False):
    """``relay=False``: this process never relays (a script). ``election_interval``: how often a standby process
    tries the relay lock. ``reconnect_max``: cap of the relay's reconnect backoff (seconds). ``local_wait``: how
    long a publish waits for the relay to store it locally when it cannot do so itself, and the relay for a publisher
    of this host landing a message the backend trimmed before the relay read it. ``autostart``: start the
    election thread when attached (False: call ``start()``)."""

    relay: bool
    election_interval: float
    reconnect_max: float
    local_wait: float
    autostart: bool


_NAMES = frozenset(RelayKeywords.__optional_keys__)


def relay_options(keywords: RelayKeywords, trim_interval: float = 0.0) -> RelayOptions:
    """The kit's options from a bridge's relay keywords; the defaults: relay, try the lock every 0.25 s, back off
    up to 1 s, wait up to 1 s for the relay, start when attached. An unknown keyword is a ``TypeError``, as in a
    signature."""
    unknown = keywords.keys() - _NAMES
    if unknown:
        raise TypeError(f"unexpected keyword argument(s): {', '.join(sorted(unknown))}")
    return RelayOptions(
        relay=keywords.get("relay", True),
        election_interval=keywords.get("election_interval", 0.25),
        reconnect_max=keywords.get("reconnect_max", 1.0),
        local_wait=keywords.get("local_wait", 1.0),
        autostart=keywords.get("autostart", True),
        trim_interval=trim_interval,
    )
