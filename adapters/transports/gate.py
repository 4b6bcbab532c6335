"""One connection's ``subscribe_allowed`` verdicts (:mod:`shmbus.adapters.http.subscribe`): the app's hook asked
once per channel and remembered for the connection's life.

Why per channel, also under a pattern: a pattern (``prefix=/chat``, ``glob=/rooms/*``, guble's ``+ /foo``) is not
a channel, and a rule written for channels ("everything but ``/admin``") would let ``/**`` through if it were
asked about the pattern. So a pattern's channels are asked about one by one, as their messages come. Exact
channels a client names are asked before anything is subscribed (:meth:`ChannelGate.decide`), so it can be told.

A verdict that needs awaiting (an ``async`` hook, on ASGI) cannot be had inside the fan-out; :meth:`known` starts
awaiting it and says "not yet" (None), and the sink holds that message and everything queued after it until the
verdict comes (:meth:`~.hub.Sink.deliver`), so the order of what the client receives never changes.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable
from typing import Any

from shmbus.presence.browser import hook_channel

from ..asgi_support import maybe_await
from ..http.subscribe import RequestInfo, SubscribeAllowed, verdict

__all__ = ["ChannelGate"]

log = logging.getLogger(__name__)

#: Verdicts one connection remembers (a ``prefix=/`` stream meets any number of channels); past it they are
#: forgotten and asked again, which costs calls, never correctness.
MAX_VERDICTS = 10_000


class ChannelGate:
    """The verdicts of one connection: ``hook(info, channel)`` asked once per channel, remembered (bounded).

    ``on_decided`` (set by the sink) is called on the event loop when an awaited verdict arrives."""

    def __init__(self, hook: SubscribeAllowed, info: RequestInfo) -> None:
        self.hook = hook
        self.info = info
        self.verdicts: dict[str, bool] = {}
        self.asking: dict[str, asyncio.Future[Any]] = {}
        self.on_decided: Callable[[], None] = _noop

    def _remember(self, channel: str, allowed: bool) -> bool:
        if len(self.verdicts) >= MAX_VERDICTS:
            self.verdicts.clear()
        self.verdicts[channel] = allowed
        return allowed

    async def decide(self, channel: str) -> bool:
        """The verdict for a channel a client names (awaited when it must be); the hook's errors propagate."""
        known = self.verdicts.get(channel)
        if known is not None:
            return known
        return self._remember(channel, verdict(await maybe_await(self.hook(self.info, hook_channel(channel)))))

    def decide_sync(self, channel: str) -> bool:
        """:meth:`decide` where nothing can be awaited (WSGI): an awaitable answer is an error, never a yes."""
        known = self.verdicts.get(channel)
        if known is not None:
            return known
        return self._remember(channel, verdict(self.hook(self.info, hook_channel(channel))))

    def known(self, channel: str) -> bool | None:
        """The verdict now, for a message about to be sent: a plain hook is asked at once; an awaitable answer is
        awaited on the running loop (None until then). The hook failing refuses the channel (logged)."""
        allowed = self.verdicts.get(channel)
        if allowed is not None:
            return allowed
        if channel in self.asking:
            return None
        try:
            value = self.hook(self.info, hook_channel(channel))
        except Exception:
            log.exception("shmbus: subscribe_allowed failed on %r; channel refused", channel)
            return self._remember(channel, False)
        if not inspect.isawaitable(value):
            return self._remember(channel, bool(value))
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # a WSGI stream: nothing can await it
            verdict_error(value, channel)
            return self._remember(channel, False)
        future = asyncio.ensure_future(value, loop=loop)
        self.asking[channel] = future
        future.add_done_callback(lambda f: self._decided(channel, f))
        return None

    def _decided(self, channel: str, future: asyncio.Future[Any]) -> None:
        if self.asking.get(channel) is future:
            del self.asking[channel]
        if future.cancelled():  # the connection ended
            return
        exc = future.exception()
        if exc is not None:
            log.error("shmbus: subscribe_allowed failed on %r; channel refused", channel, exc_info=exc)
        self._remember(channel, exc is None and bool(future.result()))
        self.on_decided()

    def close(self) -> None:
        """The connection ended: stop awaiting verdicts nobody will use."""
        for task in self.asking.values():
            task.cancel()
        self.asking.clear()


def verdict_error(value: Any, channel: str) -> None:
    """Log (and close) an awaitable answer that cannot be awaited: the channel is refused, not allowed."""
    try:
        verdict(value)
    except TypeError:
        log.error("shmbus: subscribe_allowed returned an awaitable on a WSGI stream; %r refused", channel)


def _noop() -> None:
    pass
