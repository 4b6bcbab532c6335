"""Subscriptions and their positions, sans-IO: what to ask the server for, and who gets what it answers.

Each subscription keeps its own position (the last id it was handed), so a second subscription to a channel
from id 0 replays the backlog to itself only. A poll asks, per channel, from the lowest position of the
channel's subscriptions; an answer reaches a subscription only past its own position (no duplicate, no
replay to the others). A subscription that starts at a negative id (-1: "from now", -k: "the last k-1") has
no position until the server resolves it; when the same channel also has subscriptions with positions, it is
first resolved alone by an immediate request (see :meth:`Tracker.next_request`), so nobody else skips a message.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .message import STATUS_CHANNEL, ClientMessage

_new = tuple.__new__  # a named tuple made without its Python-level __new__: the hot path makes one per message

__all__ = ["CallbackDelivery", "NextPoll", "Reset", "ClientSubscription", "Tracker", "channel_matches"]


@dataclass(eq=False)
class ClientSubscription:
    """One ``subscribe()``: a channel, a callback and this subscription's own positions."""

    channel: str
    callback: Any
    #: the last id received for it (or its start: ``-1``, ``-k``); asked from on the next poll
    position: int
    #: the last id its callback was handed (or the status it was moved to): what ``positions`` reports
    delivered: int
    active: bool = True
    #: the last message received: after an outage, the server's message under the same id must be this one (same
    #: global id and data), or the server's history was replaced (a restart that reused the ids)
    last_seen: ClientMessage | None = None
    #: ask from one before ``position`` and compare (set by :meth:`Tracker.distrust`)
    verify: bool = False

    @property
    def resolved(self) -> bool:
        return self.position >= 0


@dataclass
class NextPoll:
    """One poll: ``body`` maps channel to the id sent; ``targets`` are the subscriptions it serves."""

    body: dict[str, int]
    targets: dict[str, list[ClientSubscription]]
    #: an immediate request that only resolves new subscriptions' negative start ids
    resolving: bool = False


class CallbackDelivery(NamedTuple):
    """Hand ``message`` to ``subscription`` (or, with ``message`` None, move its position to ``position``)."""

    subscription: ClientSubscription
    message: ClientMessage | None
    position: int


@dataclass(frozen=True)
class Reset:
    """The server's history is not the one our position counts in: it is behind a position we sent, or holds a
    different message under our last id (a restart, a new bus, an expired channel)."""

    channel: str
    sent: int
    server: int
    replaced: bool = False


@dataclass
class Applied:
    deliveries: list[CallbackDelivery] = field(default_factory=list)
    resets: list[Reset] = field(default_factory=list)
    duplicates: int = 0
    messages: int = 0  # deliveries of a message (the others move a position)


def channel_matches(pattern: str, channel: str) -> bool:
    """``unsubscribe``'s channel argument, as the JS client reads it: a trailing ``*`` makes the rest a prefix
    (``/x/*``: every channel under ``/x/``); anything else is one channel's name, as it is (``[``, ``?`` or an
    inner ``*`` are characters of the name, not a pattern)."""
    if pattern.endswith("*"):
        return channel.startswith(pattern[:-1])
    return channel == pattern


class Tracker:
    """The subscriptions of one client, in subscription order."""

    def __init__(self) -> None:
        self.subscriptions: list[ClientSubscription] = []

    def add(self, channel: str, callback: Any, last_id: int) -> ClientSubscription:
        sub = ClientSubscription(channel, callback, last_id, last_id)
        self.subscriptions.append(sub)
        return sub

    def remove(self, pattern: str, callback: Any = None) -> list[ClientSubscription]:
        """Remove the subscriptions of ``pattern`` (all, or only ``callback``'s); they get nothing more."""
        gone = [
            s
            for s in self.subscriptions
            if channel_matches(pattern, s.channel) and (callback is None or s.callback == callback)
        ]
        self.discard(gone)
        return gone

    def discard(self, subs: Iterable[ClientSubscription]) -> None:
        for s in subs:
            s.active = False
        self.subscriptions = [s for s in self.subscriptions if s.active]

    def by_channel(self) -> dict[str, list[ClientSubscription]]:
        out: dict[str, list[ClientSubscription]] = {}
        for s in self.subscriptions:
            out.setdefault(s.channel, []).append(s)
        return out

    def next_request(self) -> NextPoll | None:
        """The next poll: a resolving request when some channel mixes unresolved and other positions, else the
        poll of every channel. None without subscriptions."""
        groups = self.by_channel()
        if not groups:
            return None
        body: dict[str, int] = {}
        targets: dict[str, list[ClientSubscription]] = {}
        for channel, subs in groups.items():
            starts = {s.position for s in subs if not s.resolved}
            if starts and (len(starts) > 1 or len(starts) < len({s.position for s in subs})):
                first = next(s.position for s in subs if not s.resolved)
                body[channel] = first
                targets[channel] = [s for s in subs if s.position == first]
        if body:
            return NextPoll(body, targets, resolving=True)
        for channel, subs in groups.items():
            body[channel] = min(s.position - 1 if s.verify else s.position for s in subs)
            targets[channel] = subs
        return NextPoll(body, targets)

    def distrust(self) -> None:
        """After a failed poll (the server may have restarted with ids from 1 again): the next poll re-reads each
        subscription's last message, and a different message under that id means a reset."""
        for s in self.subscriptions:
            s.verify = s.position >= 1 and s.last_seen is not None

    def apply(self, request: NextPoll, items: Iterable[Mapping[str, Any]]) -> Applied:
        """What the server answered to ``request``: positions move now; the deliveries are for the dispatcher."""
        out = Applied()
        reset_now: set[int] = set()  # subscriptions sent back to 0 by this answer: the rest of it is not theirs
        targets = request.targets
        deliveries = out.deliveries
        for item in items:
            channel = item.get("channel")
            if channel.__class__ is not str:  # (not a key: the server's JSON may hold anything)
                continue
            subs = targets.get(channel)
            if subs is None:
                if channel == STATUS_CHANNEL:
                    data = item.get("data")
                    if isinstance(data, Mapping):
                        self._status(request, data, out, reset_now)
                continue
            mid, gid = item.get("message_id"), item.get("global_id")
            if not isinstance(mid, int) or not isinstance(gid, int):
                continue
            msg = _new(ClientMessage, (channel, item.get("data"), mid, gid))  # (ClientMessage(...) costs twice as much)
            for s in subs:
                if not s.active or (reset_now and id(s) in reset_now):
                    continue
                if s.verify and mid >= s.position:
                    s.verify = False
                    seen = s.last_seen
                    if mid == s.position and seen is not None and (seen.global_id, seen.data) != (gid, msg.data):
                        out.resets.append(Reset(channel, mid, mid, replaced=True))
                        s.position = 0
                        reset_now.add(id(s))
                        out.deliveries.append(CallbackDelivery(s, None, 0))
                        continue
                if s.position >= 0 and mid <= s.position:  # resolved, and seen
                    out.duplicates += 1
                    continue
                s.position = mid
                s.last_seen = msg
                deliveries.append(_new(CallbackDelivery, (s, msg, mid)))
                out.messages += 1
        # Still no position after the first answer (the backlog, at once): "-k" on an empty channel. It is at 0.
        for subs in request.targets.values():
            for s in subs:
                if s.active and not s.resolved:
                    s.position = 0
                    out.deliveries.append(CallbackDelivery(s, None, 0))
        return out

    def _status(self, request: NextPoll, data: Mapping[str, Any], out: Applied, reset_now: set[int]) -> None:
        for channel, last in data.items():
            subs = request.targets.get(channel)
            if not subs or not isinstance(last, int) or isinstance(last, bool):
                continue
            sent = request.body[channel]
            reset = 0 <= last < sent
            if reset:
                out.resets.append(Reset(channel, sent, last))
            # Forward only: a status within a replay must not send anyone back. Except on a reset: the server's
            # ids 1..last were all published after it (a restart, a new bus), so they are read again from 0.
            to = 0 if reset else last
            for s in subs:
                if s.active and id(s) not in reset_now and (reset or s.position < last):
                    s.position = to
                    s.verify = False
                    out.deliveries.append(CallbackDelivery(s, None, to))

    def positions(self) -> dict[str, int]:
        """Per channel, the position to resume from: the lowest delivered one (what every callback has had)."""
        out: dict[str, int] = {}
        for channel, subs in self.by_channel().items():
            known = [s.delivered for s in subs if s.delivered >= 0]
            out[channel] = min(known) if known else subs[0].delivered
        return out
