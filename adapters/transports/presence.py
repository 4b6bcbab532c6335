"""One connection's part in presence (docs/presence.md): an SSE or WebSocket connection is present on each
channel it subscribes (exact channels the app's ``presence`` option covers and ``subscribe_allowed`` did not
refuse) for as long as it holds it, and ``presence_grace`` seconds after. The sink calls it as its channels come
and go (:class:`~.sink.Sink`); patterns never count."""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from typing import Any

from shmbus.presence import hub_for
from shmbus.presence.browser import watched

from .gate import ChannelGate
from .identity import Identity

__all__ = ["SinkPresence", "ask_view_snapshot"]


def ask_view_snapshot(bus: Any, channel: str, client_id: str | None) -> None:
    """A connection subscribed a view channel (``/__presence/<channel>``): this process announces, and sends the
    connection the current list when it named a client id (the snapshot is addressed to it alone)."""
    target = watched(channel)
    if target is None:
        return
    hub = hub_for(bus)
    hub.serve_views()
    if client_id:
        hub.request_snapshot(target, client_id)


class SinkPresence:
    """The presence of one connection: its client id (a random one when the client named none), user id, the
    channels it holds, and the rule it was opened under."""

    __slots__ = ("bus", "client_id", "gate", "grace", "held", "rule", "user_id")

    def __init__(
        self, bus: Any, client_id: str | None, user_id: Any, rule: bool | tuple[str, ...], grace: float, gate: Any
    ) -> None:
        self.bus = bus
        self.client_id = client_id or "conn-" + secrets.token_hex(8)
        self.user_id = user_id
        self.rule = rule
        self.grace = grace
        self.gate: ChannelGate | None = gate
        self.held: set[str] = set()

    @classmethod
    def of(cls, bus: Any, identity: Identity, gate: ChannelGate | None) -> SinkPresence | None:
        """The presence of a connection of ``identity`` (None while its app's ``presence`` option is off)."""
        if identity.presence is None:
            return None
        rule, grace = identity.presence
        return cls(bus, identity.client_id, identity.lookups.user_id, rule, grace, gate)

    def covers(self, channel: str) -> bool:
        """Does presence record ``channel`` for this connection? Not when the hook refused it (or was never asked:
        an app's server-side subscription under a hook counts only once the hook said yes)."""
        rule = self.rule
        if not (rule is True or (rule and channel.startswith(rule))):
            return False
        return self.gate is None or self.gate.verdicts.get(channel) is True

    def joined(self, channel: str) -> None:
        if channel not in self.held and self.covers(channel):
            self.held.update(hub_for(self.bus).hold(self.client_id, self.user_id, (channel,)))

    def left(self, channels: Iterable[str]) -> None:
        gone = [ch for ch in channels if ch in self.held]
        if gone:
            self.held.difference_update(gone)
            hub_for(self.bus).release(self.client_id, gone, self.grace)
