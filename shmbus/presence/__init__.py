"""Presence: which clients hold a subscription to a channel, as the servers of this host see them.

Web workers record the clients they serve (:meth:`PresenceHub.touch`, from the poll flow when the middleware's
``presence`` option covers the channel) and announce them on the bus's own ``/__presence`` channel; any process
of the host reads the union with :meth:`Bus.presence <shmbus.Bus.presence>` or follows joins and leaves with
:meth:`Bus.follow_presence <shmbus.Bus.follow_presence>`. See docs/presence.md.
"""

from __future__ import annotations

from .hub import PRESENCE_CHANNEL, PresenceHub, hub_for, stop_hub
from .view import Member, PresenceEvent

__all__ = ["PRESENCE_CHANNEL", "Member", "PresenceEvent", "PresenceHub", "hub_for", "stop_hub"]
