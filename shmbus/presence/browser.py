"""The browser-visible form of presence: ``/__presence/<channel>``, an ordinary channel to a client (sans-IO).

Why a channel per watched channel and not a poll-time answer: a client of the poll protocol, SSE or WebSocket
already knows how to follow a channel (ids, long polls, reconnects), so joins and leaves travel as its messages.
Who publishes them: every announcing process assembles the same union from the one ordered ``/__presence``
channel, so each change is published once, by the process whose own announcement caused it. A change no
announcement caused (a worker gone silent, or saying goodbye) is published by every announcer that saw it (a
process serving a view channel announces too): rare, and a leave of a client already gone is a no-op to the
client, whereas electing one publisher would lose the change whenever the elected one had not known the worker.
A current list is sent on request: a client that subscribes with last id ``-1`` (the npm client's default) gets
a ``snapshot`` message addressed to its client id alone.

Messages (JSON to the client)::

    {"type": "snapshot", "channel": "/chat/1", "members": [member, ...], "truncated": 0}
    {"type": "change", "channel": "/chat/1", "join": [member, ...], "leave": [member, ...]}

with ``member = [client_id, user_id, since, host]`` (:func:`member_data`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..channels import RESERVED_PREFIX
from .view import Member, PresenceEvent

__all__ = [
    "SNAPSHOT_LIMIT",
    "VIEW_BACKLOG",
    "VIEW_PREFIX",
    "change_messages",
    "hook_channel",
    "member_data",
    "snapshot_message",
    "view_channel",
    "watched",
]

#: ``/__presence/<channel>``: the presence of ``<channel>`` as a client reads it.
VIEW_PREFIX = "/__presence/"
#: Messages a view channel keeps (a client that comes back with its last id catches up on these; older changes
#: are covered by asking for a snapshot again).
VIEW_BACKLOG = 50
#: Members one snapshot message lists (about 100 bytes each); ``truncated`` counts those left out.
SNAPSHOT_LIMIT = 2_000


def watched(channel: str) -> str | None:
    """The channel whose presence ``channel`` shows (``/__presence/x`` -> ``/x``), or None when ``channel`` is no
    view channel. A view of a reserved channel (``/__presence//__status``, ``/__presence/__presence/...``) is none."""
    if not channel.startswith(VIEW_PREFIX):
        return None
    target = channel[len(VIEW_PREFIX) - 1 :]
    if target == "/" or target.startswith(RESERVED_PREFIX) or target.startswith("//"):
        return None
    return target


def view_channel(channel: str) -> str:
    """The view channel of ``channel`` (``/x`` -> ``/__presence/x``)."""
    return VIEW_PREFIX + channel[1:]


def hook_channel(channel: str) -> str:
    """The channel ``subscribe_allowed`` is asked about when a client names ``channel``: a view channel is
    readable exactly by those who may read the channel it shows."""
    return watched(channel) or channel


def member_data(m: Member) -> list[Any]:
    """``[client id, user id, since, host]``: an array, not an object, as 10,000 joins in objects would spend
    about 0.4 MB of ring on repeating the four key names."""
    return [m.client_id, m.user_id, round(m.since, 3), m.host]


def snapshot_message(channel: str, members: list[Member]) -> dict[str, Any]:
    """The current list of ``channel``, at most :data:`SNAPSHOT_LIMIT` members (the earliest)."""
    shown = members[:SNAPSHOT_LIMIT]
    return {
        "type": "snapshot",
        "channel": channel,
        "members": [member_data(m) for m in shown],
        "truncated": len(members) - len(shown),
    }


def change_messages(events: Iterable[PresenceEvent]) -> dict[str, dict[str, Any]]:
    """``events`` grouped per channel as one ``change`` message each, keyed by channel, in the events' order.
    A join and a leave of one client in one batch both stay: the client applies them in order."""
    out: dict[str, dict[str, Any]] = {}
    for e in events:
        msg = out.get(e.channel)
        if msg is None:
            msg = out[e.channel] = {"type": "change", "channel": e.channel, "join": [], "leave": []}
        msg[e.kind].append(member_data(e.member))
    return out
