"""The protocol engine of one middleware: starting polls (backlog and ``/__status`` rules) and ending them."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Literal

from shmbus.bus import Bus
from shmbus.message import Message
from shmbus.presence import hub_for

from .interning import intern_bounded
from .options import Options, Route, match_route
from .registry import Registry
from .request import PollRequest, check_client_channel
from .waiter import Ending, Lookups, Waiter, filter_allows
from .wire import (
    BASE_HEADERS,
    EMPTY,
    EMPTY_CHUNK,
    STREAM_HEADERS,
    ProtocolError,
    Response,
    encode_message,
    encode_status,
    frame_chunk,
)

log = logging.getLogger("shmbus.adapters")


_GROUP_SETS: dict[frozenset[Any], frozenset[Any]] = {}


def _shared_groups(groups: frozenset[Any]) -> frozenset[Any]:
    """One frozenset object per distinct group set (bounded): many clients have the same groups, and each parked
    one would otherwise hold its own copy (~200 bytes); a shared one also hashes once (visibility classes)."""
    return _GROUP_SETS.get(groups) or intern_bounded(_GROUP_SETS, groups, 10_000)  # a hit costs no call


# ---------------------------------------------------------------------------------------------------- polls
#: ``immediate``: send the response now; ``long``: wait, then send the long poll's body; ``stream``: send the head
#: and first chunk now, more chunks as woken.
PollMode = Literal["immediate", "long", "stream"]


class Poll:
    """The outcome of starting a poll.

    ``mode`` is ``"immediate"`` (send ``response`` and stop), ``"long"`` (wait for ``waiter`` to be woken or the
    interval to pass, then send :meth:`MessageBusProtocol.long_poll_response`) or ``"stream"`` (send ``headers``
    and ``first_chunk`` now, then :meth:`MessageBusProtocol.stream_chunks` whenever woken, and
    :meth:`MessageBusProtocol.stream_end` at the end).
    """

    __slots__ = ("first_chunk", "headers", "mode", "response", "waiter")

    def __init__(
        self,
        mode: PollMode,
        response: Response | None = None,
        waiter: Waiter | None = None,
        headers: list[tuple[str, str]] | None = None,
        first_chunk: bytes = b"",
    ) -> None:
        self.mode = mode
        self.response = response
        self.waiter = waiter
        self.headers = headers or []
        self.first_chunk = first_chunk


class MessageBusProtocol:
    """The protocol engine of one middleware instance: options, registry and reply computation."""

    def __init__(self, bus: Bus, options: Options, lock: AbstractContextManager[Any] | None = None) -> None:
        self.bus = bus
        self.options = options
        self.registry = Registry(bus, lock if lock is not None else threading.Lock(), options.max_stream_buffer)
        self.is_json = bus.codec.is_json

    def route(self, method: str, path: str) -> Route:
        """What ``path`` (relative to the app root) means under these options."""
        return match_route(method, path, self.options)

    # -- simple responses
    def headers(self, extra: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """A poll's headers; without extras the shared :data:`BASE_HEADERS` itself (shells may compare by
        identity to send a pre-encoded block; nobody mutates it)."""
        return BASE_HEADERS + extra if extra else BASE_HEADERS

    def options_response(self, extra: list[tuple[str, str]]) -> Response:
        return Response(200, self.headers(extra), b"OK")

    def broadcast(self, params: Mapping[str, str]) -> Response:
        channel = params.get("channel")
        if not channel:
            raise ProtocolError(400, "broadcast needs a channel parameter")
        check_client_channel(channel)
        self.bus.publish(channel, params.get("data"))
        return Response(200, [("content-type", "text/html")], b"sent")

    @staticmethod
    def extra_headers(value: Any) -> list[tuple[str, str]]:
        """Normalise ``extra_response_headers_lookup``'s result (mapping or pairs); ``set-cookie`` is dropped."""
        if not value:
            return []
        items = value.items() if isinstance(value, Mapping) else value
        out = []
        for name, val in items:
            name = str(name)
            if name.lower() == "set-cookie":
                continue
            out.append((name, str(val)))
        return out

    @staticmethod
    def lookups(user_id: Any, group_ids: Any, site_id: Any) -> Lookups:
        """The lookups' results as a client keeps them (equal group sets shared: see :func:`_shared_groups`)."""
        groups: frozenset[Any] = frozenset()
        if group_ids:
            if isinstance(group_ids, (str, bytes)):
                group_ids = (group_ids,)
            groups = _shared_groups(frozenset(group_ids))
        site = None
        if site_id is not None and site_id != "":
            site = str(site_id)
        return Lookups(user_id, groups, site)

    # -- polls
    def note_presence(self, client_id: str, user_id: Any, channels: Mapping[str, Any]) -> None:
        """A poll of ``client_id`` begins on ``channels`` (those ``subscribe_allowed`` let through): the ones
        the ``presence`` option covers are present for one long-polling interval plus the grace."""
        opts = self.options
        names = opts.presence_of(channels)
        if names:
            hub_for(self.bus).touch(client_id, user_id, names, opts.long_polling_interval + opts.presence_grace)

    def start_poll(
        self,
        req: PollRequest,
        lookups: Lookups,
        extra: list[tuple[str, str]],
        *,
        can_park: bool = True,
        waker: Callable[[Waiter], Any] | None = None,
        signal: Any = None,
    ) -> Poll:
        """Compute the reply to a poll; register the request when it will wait.

        ``can_park`` is the shell's verdict (e.g. False on a sync WSGI worker): when False the request is
        answered at once, like ``dlp=t``. ``waker(waiter)`` is called when a waiting request has something
        to send or must end (it may already have been called when this returns: check ``waiter.done`` and
        ``waiter.pending`` before waiting); ``signal`` is stored on the waiter for the waker.
        """
        opts = self.options
        reg = self.registry
        long_poll = can_park and opts.long_polling_enabled and not req.dlp and reg.parked < opts.max_active_clients
        streaming = long_poll and req.http11 and not req.dont_chunk and opts.chunked_encoding_enabled
        epoch = self.bus.epoch if long_poll else 0
        c = Waiter(req.client_id, req.seq, lookups, req.channels, streaming, epoch, waker, signal)
        if long_poll:
            reg.capture(c)
        try:
            items, status = self.read_backlog(c, req.channels)
        except BaseException:
            if long_poll:
                reg.discard(c)
            raise
        if items:
            self.bus.metrics.deliveries += len(items)
        if status:
            items.append(encode_status(status))
        if not long_poll or (items and not streaming):
            if long_poll:
                reg.discard(c)
            return Poll("immediate", Response(200, self.headers(extra), b"[" + b",".join(items) + b"]"))
        first = frame_chunk(b"[" + b",".join(items) + b"]") if items else EMPTY_CHUNK
        accepted, wake = reg.park(c)
        for other in wake:
            if other is not c:
                self.wake(other)
        if not accepted:  # a newer request of this client id is parked: answer at once
            if streaming:  # the gem: one chunk (the backlog or []) and the terminator, no closing []
                c.end(Ending.STALE)
                return Poll(
                    "stream", waiter=c, headers=STREAM_HEADERS + extra if extra else STREAM_HEADERS, first_chunk=first
                )
            return Poll("immediate", Response(200, self.headers(extra), EMPTY))
        if streaming:
            return Poll(
                "stream", waiter=c, headers=STREAM_HEADERS + extra if extra else STREAM_HEADERS, first_chunk=first
            )
        return Poll("long", waiter=c, headers=self.headers(extra))

    def wake(self, c: Waiter) -> None:
        w = c.waker
        if w is not None:
            try:
                w(c)
            except Exception:
                log.exception("shmbus: waking %r failed", c)

    def dispatch(self, msgs: list[Message]) -> None:
        """Deliver a batch and wake the concerned clients (call on the thread that owns the registry)."""
        for c in self.registry.dispatch(msgs):
            self.wake(c)

    def dispatch_batches(self, batches: list[list[Message]]) -> None:
        """Deliver batches gathered over ``batch_window`` as one (one chunk per client) and wake the concerned
        clients (see :meth:`deliver_batches`)."""
        for c in self.deliver_batches(batches):
            self.wake(c)

    def deliver_batches(self, batches: list[list[Message]]) -> list[Waiter]:
        """Deliver batches as one, never mixing epochs (a reset between two batches splits them); the clients to
        wake, which the caller may wake a slice at a time (a client woken late still writes what it has then)."""
        if len(batches) == 1:
            return self.registry.dispatch(batches[0])
        wake: list[Waiter] = []
        merged: list[Message] = []
        epoch = None
        for batch in batches:
            if not batch:
                continue
            if merged and (batch[0].epoch != epoch or batch[-1].epoch != epoch):
                wake += self.registry.dispatch(merged)
                merged = []
            if not merged:
                epoch = batch[-1].epoch if batch[0].epoch == batch[-1].epoch else None
            merged.extend(batch)
        if merged:
            wake += self.registry.dispatch(merged)
        return wake

    def read_backlog(self, c: Waiter, channels: Mapping[str, int | None]) -> tuple[list[bytes], dict[str, int]]:
        """The gem's ``Client#backlog`` with its ``/__status`` rules; records per channel the last id covered."""
        items: list[bytes] = []
        status: dict[str, int] = {}
        if not channels:
            return items, status
        bus = self.bus
        site = c.site_id or ""  # "" = explicitly no site (never the bus's zero-argument site lookup)
        lasts = bus.last_ids(*channels, site_id=site)
        filters = bool(bus.client_message_filters)
        is_json = self.is_json
        for ch, v in channels.items():
            last = lasts[ch]
            if v is None or v == last:
                c.last[ch] = last
                continue
            if v == -1 or v > last:
                c.last[ch] = last
                status[ch] = last
                continue
            after = bus.look_back(ch, -v - 1, site) if v < -1 else v  # -2: the last message, -3: two, ...
            bl = bus.backlog(ch, after, site)
            top = max(last, bl.last_id)
            c.last[ch] = top
            for m in bl:
                if m.message_id > top:
                    c.last[ch] = top = m.message_id
                if c.allowed(m) and (not filters or filter_allows(self.bus, m)):
                    items.append(encode_message(m, is_json))
                else:
                    status[ch] = top
            if v >= 0 and bl.gap:
                status[ch] = top
            if ch in status:
                status[ch] = c.last[ch]
        return items, status

    # -- ends of waiting requests
    def long_poll_response(self, c: Waiter) -> bytes:
        """Finish a long poll: the body to send (``[]`` on timeout)."""
        pending, st = self.registry.finish(c)
        if st is not None:
            pending.append(st)
        if not pending:
            return EMPTY
        if len(pending) == 1:
            return b"[" + pending[0] + b"]"
        return b"[" + b",".join(pending) + b"]"

    def stream_chunks(self, c: Waiter) -> list[bytes]:
        return self.registry.take(c)

    def stream_end(self, c: Waiter) -> list[bytes]:
        """Finish a stream: remaining chunks plus the closing chunk (``[]``, or the due ``/__status``)."""
        pending, st = self.registry.finish(c)
        if c.dropped:
            return []
        if c.ending is not None:  # RESET: its status was already queued; STALE: the first chunk was the answer
            return pending
        pending.append(frame_chunk(b"[" + st + b"]") if st is not None else EMPTY_CHUNK)
        return pending

    def end(self, c: Waiter, ending: Ending) -> None:
        """End ``c`` now for ``ending`` (the shell saw its client go); a thread-safe :meth:`Waiter.end`."""
        self.registry.end(c, ending)

    def abandon(self, c: Waiter) -> None:
        """The client went away: unregister at once."""
        self.registry.finish(c)


def null_lock() -> AbstractContextManager[Any]:
    return nullcontext()
