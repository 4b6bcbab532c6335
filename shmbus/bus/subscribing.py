"""Subscribing: a new subscription gets its replay first, then live messages, with no gap and no duplicate."""

from __future__ import annotations

from collections.abc import Callable

from ..channels import check_channel
from ..errors import BusDestroyed, InvalidChannel
from ..message import Message
from .attachment import Attachment
from .names import Names
from .reading import Reader
from .results import Callback, Subscription
from .subscriptions import SubscriptionTable, call

__all__ = ["Subscriber"]


class Subscriber:
    """Validates a subscription, starts the listener (``start_listener``), replays what it is owed from the
    reader and adds it to the table, all under the table's ``dispatch_lock``: the listener dispatches nothing
    in between, and the subscription skips what its replay delivered (``skip_gid``)."""

    def __init__(
        self,
        attachment: Attachment,
        names: Names,
        reader: Reader,
        table: SubscriptionTable,
        start_listener: Callable[[], None],
    ) -> None:
        self._attachment = attachment
        self._names = names
        self._reader = reader
        self._table = table
        self._start_listener = start_listener
        self.off = False  #: ``Bus.off()``: subscribe returns None

    def subscribe(
        self,
        channel: str | None,
        callback: Callback,
        last_id: int | None,
        pattern: bool | str,
        only_site: str | None,
        replay_site: str | None,
        owner: object = None,
    ) -> Subscription | None:
        """See :meth:`Bus.subscribe <shmbus.bus.Bus.subscribe>`; ``only_site``: deliver that site's messages
        only; ``replay_site``: the site whose backlog a channel's replay reads."""
        if self._attachment.destroyed:
            raise BusDestroyed(f"bus {self._attachment.name!r} was destroyed; call on() to use it again")
        if self.off:
            return None
        if not callable(callback):
            raise TypeError("callback must be callable")
        kind = None
        if pattern:
            kind = "glob" if pattern is True else str(pattern)
            if channel is None:
                raise InvalidChannel("a pattern subscription needs a pattern string")
        if channel is not None:
            if kind is None:
                self._names.channel_key(channel)
            else:
                check_channel(channel, what="pattern")  # the channel rule; compile_pattern checks the glob
        if last_id is not None and (isinstance(last_id, bool) or not isinstance(last_id, int)):
            raise TypeError(f"last_id must be an int or None, got {last_id!r}")
        table = self._table
        sub = Subscription(channel, callback, kind, only_site, owner, table.note_owner_gone)
        seg = self._attachment.segment
        self._start_listener()
        with table.dispatch_lock:
            sub.skip_gid = seg.global_id()
            replay: list[Message] = []
            if last_id is not None and last_id != -1:
                replay = self._reader.replay(channel, kind, last_id, replay_site)
                if replay:
                    sub.skip_gid = max(sub.skip_gid, max(m.global_id for m in replay))
            replaced = table.add(sub)
            if replaced and not replay:
                # a replacement continues the old subscription: messages appended but not yet dispatched
                # (above the old one's floor) still reach the owner
                sub.skip_gid = min(sub.skip_gid, *(r.skip_gid for r in replaced))
            for msg in replay:
                call(sub, msg)
        return sub
