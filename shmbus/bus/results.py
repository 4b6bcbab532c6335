"""What reads and subscriptions hand back: :class:`Backlog` (messages, and what is missing) and
:class:`Subscription`."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ..message import Message
from ..patterns import compile_pattern

__all__ = ["Backlog", "Callback", "Subscription"]

Callback = Callable[[Message], Any]


class Backlog(list[Message]):
    """A list of messages that also says what could not be returned.

    ``first_available`` is the oldest message id still readable; when it is above ``after_id + 1`` (``gap`` is
    True) the messages in between were trimmed or overwritten: the loss is reported, never silent.
    """

    __slots__ = ("after_id", "first_available", "last_id")

    def __init__(self, messages: Iterable[Message], *, after_id: int, last_id: int, first_available: int):
        super().__init__(messages)
        self.after_id = after_id
        self.last_id = last_id
        self.first_available = first_available

    @property
    def gap(self) -> bool:
        return self.first_available > self.after_id + 1


class Subscription:
    """A registered callback; pass it (or the callback) to ``unsubscribe``."""

    __slots__ = ("callback", "channel", "kind", "matcher", "owner", "site_id", "skip_gid")

    def __init__(
        self, channel: str | None, callback: Callback, kind: str | None, site_id: str | None, owner: object = None
    ):
        self.channel = channel
        self.callback = callback
        self.kind = kind  # None (exact / all channels), "glob" or "prefix"
        self.matcher = compile_pattern(channel, kind) if kind and channel is not None else None
        self.site_id = site_id  # set for local_subscribe: only this site's messages
        self.skip_gid = 0  # messages up to this global id were already delivered by the replay
        self.owner = owner  # the iodine draft's pub/sub instance: one subscription per (owner, channel, kind)

    def __repr__(self) -> str:
        return f"Subscription({self.channel!r}, kind={self.kind!r}, site_id={self.site_id!r})"
