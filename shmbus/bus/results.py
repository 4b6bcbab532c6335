"""What reads and subscriptions hand back: :class:`Backlog` (messages, and what is missing) and
:class:`Subscription`."""

from __future__ import annotations

import inspect
import weakref
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


def _gone(msg: Message) -> None:
    """The callback of a subscription whose owner was garbage collected: nothing."""


class Subscription:
    """A registered callback; pass it (or the callback) to ``unsubscribe``.

    ``owner`` (the iodine draft's pub/sub instance: one subscription per owner, channel and kind) is held weakly
    when it allows weak references, and so is a callback that is a bound method of the owner: the draft's
    "closed when the pub/sub object is garbage collected". ``on_owner_gone`` is then called (from the garbage
    collector, in any thread: it must only take note) and :attr:`owner_gone` turns True.
    """

    __slots__ = (
        "_callback",
        "_callback_ref",
        "_owner",
        "_owner_ref",
        "channel",
        "direct",
        "kind",
        "matcher",
        "site_id",
        "skip_gid",
    )

    def __init__(
        self,
        channel: str | None,
        callback: Callback,
        kind: str | None,
        site_id: str | None,
        owner: object = None,
        on_owner_gone: Callable[[], None] | None = None,
    ):
        self.channel = channel
        self.kind = kind  # None (exact / all channels), "glob" or "prefix"
        self.matcher = compile_pattern(channel, kind) if kind and channel is not None else None
        self.site_id = site_id  # set for local_subscribe: only this site's messages
        self.skip_gid = 0  # messages up to this global id were already delivered by the replay
        self._owner: object = owner
        self._owner_ref: weakref.ref[Any] | None = None
        self._callback: Callback = callback
        self._callback_ref: weakref.WeakMethod[Any] | None = None
        #: the callback, when a delivery needs no other check than ``skip_gid`` (no owner held weakly, no site to
        #: match): the dispatch calls it inline; None otherwise. Fixed once made, like what it depends on.
        self.direct: Callback | None = callback if site_id is None else None
        if owner is not None:
            try:
                self._owner_ref = weakref.ref(owner, (lambda _r: on_owner_gone()) if on_owner_gone else None)
            except TypeError:  # no weak references (e.g. a bare object()): held as given
                return
            self._owner = None
            self.direct = None  # the owner may be collected: every delivery checks it
            if inspect.ismethod(callback) and callback.__self__ is owner:
                self._callback_ref = weakref.WeakMethod(callback)
                self._callback = _gone  # a strong reference to the bound method would keep the owner alive

    @property
    def owner(self) -> object:
        """The owner given to ``subscribe`` (None when none was, or once it was garbage collected)."""
        ref = self._owner_ref
        return ref() if ref is not None else self._owner

    @property
    def owner_gone(self) -> bool:
        """The owner was garbage collected: this subscription is closed (never called again)."""
        ref = self._owner_ref
        return ref is not None and ref() is None

    @property
    def callback(self) -> Callback:
        ref = self._callback_ref
        if ref is None:
            return self._callback
        method = ref()
        return _gone if method is None else method

    def __repr__(self) -> str:
        return f"Subscription({self.channel!r}, kind={self.kind!r}, site_id={self.site_id!r})"
