"""Subscriptions: callbacks per channel, pattern or every channel, with replay and no gap to live messages."""

from __future__ import annotations

from collections.abc import Callable

from ..channels import check_channel
from ..errors import BusDestroyed, InvalidChannel
from ..message import Message
from ..patterns import compile_pattern
from .results import Callback, Subscription
from .state import BatchListener, BusState

__all__ = ["Subscribing"]


class Subscribing(BusState):
    def subscribe(
        self,
        channel: str | None,
        callback: Callback,
        last_id: int | None = None,
        *,
        pattern: bool | str = False,
        site_id: str | None = None,
        owner: object = None,
    ) -> Subscription | None:
        """Call ``callback(message)`` for every message on ``channel`` (all sites), on this process's listener.

        ``channel=None`` receives every channel. ``last_id``: None (or -1) = only new messages; 0 = the whole
        retained backlog first; n = messages after n; -k (k >= 2) = the last k-1 messages first. The replay runs
        in the calling thread before this returns, and live messages follow with no gap and no duplicate.
        ``pattern=True``/``"glob"`` or ``"prefix"`` subscribes to a pattern (see :mod:`shmbus.patterns`).
        ``owner`` (any object, e.g. a connection) gives the iodine draft's rule: a new subscription *replaces*
        the owner's existing one to the same channel (or pattern of the same kind), and the owner is held weakly
        when it allows it (so is a callback that is its bound method): once it is garbage collected its
        subscriptions close. Without an owner, several callbacks may share a channel, as in the gem. Returns the
        :class:`Subscription`, or None when the bus is ``off()``.
        """
        return self._subscribe(channel, callback, last_id, pattern, None, site_id, owner)

    def local_subscribe(
        self, channel: str | None, callback: Callback, last_id: int | None = None, *, pattern: bool | str = False
    ) -> Subscription | None:
        """Like :meth:`subscribe`, but only for messages of the current site (``site_id_lookup()``)."""
        site = self.site_id_lookup() if self.site_id_lookup else None
        return self._subscribe(channel, callback, last_id, pattern, site or None, site or None)

    def _subscribe(
        self,
        channel: str | None,
        callback: Callback,
        last_id: int | None,
        pattern: bool | str,
        only_site: str | None,
        replay_site: str | None,
        owner: object = None,
    ) -> Subscription | None:
        if self._destroyed:
            raise BusDestroyed(f"bus {self.name!r} was destroyed; call on() to use it again")
        if self._off:
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
                self._channel_key(channel)
            else:
                check_channel(channel, what="pattern")  # the channel rule; compile_pattern checks the glob
        if last_id is not None and (isinstance(last_id, bool) or not isinstance(last_id, int)):
            raise TypeError(f"last_id must be an int or None, got {last_id!r}")
        sub = Subscription(channel, callback, kind, only_site, owner, self._note_owner_gone)
        seg = self.segment
        self._ensure_listener()
        with self._dispatch_lock:
            sub.skip_gid = seg.global_id()
            replay: list[Message] = []
            if last_id is not None and last_id != -1:
                replay = self._replay(channel, kind, last_id, replay_site)
                if replay:
                    sub.skip_gid = max(sub.skip_gid, max(m.global_id for m in replay))
            with self._lock:
                if kind is not None:
                    self._patterns.append(sub)
                elif channel is None:
                    self._catch_all.append(sub)
                else:
                    self._exact.setdefault(channel, []).append(sub)
                for to, is_pat in self._engine_keys(channel, kind):
                    self._engine_ref(to, is_pat, +1)
                if owner is not None:  # after the new one counts: engines see no unsubscribe/subscribe flap
                    replaced = self._drop_owned(sub)
                    if replaced and not replay:
                        # a replacement continues the old subscription: messages appended but not yet
                        # dispatched (above the old one's floor) still reach the owner
                        sub.skip_gid = min(sub.skip_gid, *(r.skip_gid for r in replaced))
            for msg in replay:
                self._call(sub, msg)
        return sub

    def _replay(self, channel: str | None, kind: str | None, last_id: int, site: str | None) -> list[Message]:
        if channel is not None and kind is None:
            site = self._resolve_site(channel, site)
            after = last_id
            if last_id < -1:
                after = self.look_back(channel, -last_id - 1, site)
            return list(self.backlog(channel, after, site))
        msgs = self.global_backlog(0 if last_id < 0 else last_id)
        if last_id < -1:
            msgs = msgs[last_id + 1 :]
        if kind is not None and channel is not None:
            match = compile_pattern(channel, kind)
            msgs = [m for m in msgs if match(m.channel)]
        return msgs

    def unsubscribe(
        self,
        channel: str | None = None,
        callback: Callback | Subscription | None = None,
        *,
        pattern: bool | str = False,
        owner: object = None,
    ) -> int:
        """Remove subscriptions on ``channel`` (or pattern): the one given, or all of them (all of ``owner``'s,
        when given). Returns how many."""
        removed = 0
        is_pat = bool(pattern)
        with self._lock:
            if is_pat:
                lst = self._patterns
            elif channel is None:
                lst = self._catch_all
            else:
                lst = self._exact.get(channel, [])
            keep = []
            gone: list[Subscription] = []
            for sub in lst:
                hit = (
                    sub.channel == channel
                    and (callback is None or callback is sub or callback == sub.callback)
                    and (owner is None or sub.owner is owner)
                )
                if hit:
                    gone.append(sub)
                else:
                    keep.append(sub)
            lst[:] = keep
            if channel is not None and not is_pat and not keep:
                self._exact.pop(channel, None)
            for sub in gone:
                for to, is_pattern in self._engine_keys(sub.channel, sub.kind):
                    self._engine_ref(to, is_pattern, -1)
            removed = len(gone)
        return removed

    def _drop_owned(self, new: Subscription) -> list[Subscription]:
        """Remove the earlier subscriptions of ``new.owner`` to ``new``'s channel or pattern (caller holds
        ``_lock``): the draft's "a subscription to the same channel replaces the old one". Returns them."""
        channel, kind, owner = new.channel, new.kind, new.owner
        if kind is not None:
            lst = self._patterns
        elif channel is None:
            lst = self._catch_all
        else:
            lst = self._exact.get(channel, [])
        keep = [s for s in lst if s is new or not (s.owner is owner and s.channel == channel and s.kind == kind)]
        replaced = [s for s in lst if s not in keep]
        lst[:] = keep
        for _ in replaced:
            for to, is_pattern in self._engine_keys(channel, kind):
                self._engine_ref(to, is_pattern, -1)
        return replaced

    def _note_owner_gone(self) -> None:
        """A subscription's owner was garbage collected (called by the collector, in any thread: only a note;
        the listener thread removes such subscriptions, see :meth:`_sweep_owners`)."""
        self._owners_gone = True

    def _sweep_owners(self) -> None:
        """Remove the subscriptions whose owner was garbage collected (the draft: they close), telling engines."""
        self._owners_gone = False
        with self._dispatch_lock, self._lock:
            gone: list[Subscription] = []
            for lst in (*self._exact.values(), self._patterns, self._catch_all):
                dead = [s for s in lst if s.owner_gone]
                if dead:
                    lst[:] = [s for s in lst if not s.owner_gone]
                    gone.extend(dead)
            for channel in [ch for ch, lst in self._exact.items() if not lst]:
                del self._exact[channel]
            for sub in gone:
                for to, is_pattern in self._engine_keys(sub.channel, sub.kind):
                    self._engine_ref(to, is_pattern, -1)

    def tap(self, listener: BatchListener, linger: float = 0.0) -> None:
        """Call ``listener(messages)`` on the listener thread with every batch of new messages (all channels,
        unfiltered). This is how web adapters wake their waiting clients: one call per batch, not per client.

        ``linger`` (seconds): the listener may wait that long after a batch before it looks again, so messages
        published meanwhile come as one batch: one wake-up of this process (a thread switch, the GIL) per
        ``linger`` instead of one per message. It applies only while every consumer in the process lingers
        (the smallest value wins); a subscription (:meth:`subscribe`) turns it off, as it expects each message
        at once. The first message after a quiet spell is never delayed."""
        if linger < 0:
            raise ValueError("linger must be >= 0")
        self._ensure_listener()
        with self._lock:
            self._batch_listeners.append(listener)
            self._lingers[listener] = linger

    def untap(self, listener: BatchListener) -> None:
        with self._lock:
            if listener in self._batch_listeners:
                self._batch_listeners.remove(listener)
                if listener not in self._batch_listeners:
                    self._lingers.pop(listener, None)

    def register_client_message_filter(self, prefix: str, fn: Callable[[Message], bool] | None = None) -> None:
        """Register ``fn(message) -> bool`` deciding whether HTTP clients get messages on channels starting
        with ``prefix``. Every applicable filter must pass (checked newest first). ``fn=None`` registers nothing,
        as in the gem."""
        if fn is None:
            return
        if not callable(fn):
            raise TypeError("filter must be callable")
        self.client_message_filters.append((prefix, fn))

    def allowed_by_filters(self, msg: Message) -> bool:
        for prefix, fn in reversed(self.client_message_filters):
            if msg.channel.startswith(prefix) and not fn(msg):
                return False
        return True
