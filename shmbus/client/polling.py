"""The poll loop: one poll at a time, what each outcome means for the next one, and what an answer moves.

A poll that brought something is followed at once (paced by :func:`.pacing.pause_after_poll`); a failure backs off
and makes the next poll verify the positions (a restarted server); a 429 waits its ``Retry-After``; a change of
the subscriptions aborts the poll in flight and ends any wait. The answer's arrays go to the tracker as they
arrive and its deliveries to the dispatcher; the hooks hear of connections, failures, resets and 429s.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import anyio
import httpx

from .chunks import AnswerTooLarge, ProtocolViolation
from .dispatch import Dispatcher
from .exchange import PollExchange, PollSettings
from .hooks import Hooks
from .outcomes import ClientStats, NoFirstChunk, PollFailed, RateLimited, Repoll
from .pacing import Backoff, pause_after_poll
from .positions import NextPoll, Tracker
from .runs import Flag

__all__ = ["LoopSettings", "PollLoop"]

log = logging.getLogger("shmbus.client")


class LoopSettings(PollSettings, Protocol):
    """The client options the loop reads, besides a poll's own."""

    @property
    def min_poll_interval(self) -> float: ...
    @property
    def max_poll_interval(self) -> float: ...
    @property
    def callback_interval(self) -> float: ...
    @property
    def background_callback_interval(self) -> float: ...
    @property
    def retry_chunked_after(self) -> int: ...


class PollLoop:
    """The poll loop of one client (:meth:`run`); :meth:`poll_again` aborts the poll in flight or the wait."""

    def __init__(
        self, settings: LoopSettings, tracker: Tracker, stats: ClientStats, hooks: Hooks, dispatcher: Dispatcher
    ) -> None:
        self._settings = settings
        self._tracker = tracker
        self._stats = stats
        self._hooks = hooks
        self._dispatcher = dispatcher
        self._backoff = Backoff(settings.min_poll_interval, settings.max_poll_interval)
        room: Callable[[], Awaitable[None]] | None = dispatcher.room if dispatcher.blocking else None
        self.exchange = PollExchange(settings, stats, self._take, self.answered, room)
        self.empty_polls = 0  # successful polls in a row that brought nothing (their pause grows)
        self.connected = False  # a 200 since the start or the last failure (on_connect is due at the next)
        self.changed: Flag | None = None
        self._poll_scope: anyio.CancelScope | None = None  # the poll in flight's

    def open(self) -> None:
        """Make the loop's flag on the running loop (each start)."""
        self.changed = Flag()
        self.connected = False

    def poll_again(self) -> None:
        """The subscriptions changed: abort the poll in flight, or end the wait for the next one."""
        if self.changed is not None:
            self.changed.set()
        if self._poll_scope is not None:
            self._poll_scope.cancel()

    async def run(self, http: httpx.AsyncClient) -> None:
        """The poll loop: one poll at a time, until cancelled."""
        assert self.changed is not None
        settings = self._settings
        while True:
            self.changed.clear()
            request = self._tracker.next_request()
            if request is None:
                await self.changed.wait()
                continue
            started = anyio.current_time()
            try:
                got_data, interrupted = await self._until_changed(http, request)
            except RateLimited as exc:
                self._stats.rate_limited += 1
                self._stats.last_error = str(exc)
                self._hooks.rate_limited(exc.seconds)
                await self._wait(exc.seconds, interruptible=False)
                continue
            except Repoll:
                continue
            except NoFirstChunk:
                self.exchange.unchunked(settings.retry_chunked_after)
                self._stats.chunked_fallbacks += 1
                log.warning(
                    "shmbus.client: no first chunk from %s within %g s (a buffering proxy?): not chunked for the "
                    "next %d polls",
                    settings.poll_url,
                    settings.first_chunk_timeout,
                    settings.retry_chunked_after,
                )
                continue
            except (httpx.HTTPError, OSError, PollFailed, ProtocolViolation) as exc:
                self._stats.failures += 1
                self._stats.consecutive_failures += 1
                self.connected = False
                self._tracker.distrust()
                self._stats.last_error = f"{type(exc).__name__}: {exc}"
                delay = self._backoff.failure()
                if isinstance(exc, AnswerTooLarge):  # a broken or hostile server, or a limit too low for it
                    self._stats.too_large += 1
                    log.warning("shmbus.client: %s from %s: closed; next in %.2f s", exc, settings.poll_url, delay)
                else:
                    log.info("shmbus.client: poll failed (%s); next in %.2f s", self._stats.last_error, delay)
                self._hooks.error(exc, delay)
                await self._wait(delay)
                continue
            if interrupted or request.resolving:
                continue
            self._backoff.success()
            self._stats.consecutive_failures = 0
            self.empty_polls = 0 if got_data else self.empty_polls + 1
            await self._wait(
                pause_after_poll(
                    elapsed=anyio.current_time() - started,
                    got_data=got_data,
                    long_polling=settings.long_polling,
                    min_poll_interval=settings.min_poll_interval,
                    callback_interval=settings.callback_interval,
                    background_callback_interval=settings.background_callback_interval,
                    empty_in_a_row=self.empty_polls,
                )
            )

    async def _wait(self, seconds: float, interruptible: bool = True) -> None:
        """Sleep ``seconds``; a subscribe or unsubscribe ends the sleep early unless ``interruptible`` is False."""
        if seconds <= 0:
            return
        if not interruptible:
            await anyio.sleep(seconds)
            return
        assert self.changed is not None
        with anyio.move_on_after(seconds):
            await self.changed.wait()

    async def _until_changed(self, http: httpx.AsyncClient, request: NextPoll) -> tuple[bool, bool]:
        """Poll until the answer ends or the subscriptions change (:meth:`poll_again` cancels the poll's scope; the
        poll closes its response before this returns): (whether it brought anything, whether it was aborted)."""
        assert self.changed is not None
        got: bool | None = None
        with anyio.CancelScope() as scope:
            self._poll_scope = scope
            try:
                if self.changed.is_set():  # changed while the request was made
                    scope.cancel()
                got = await self.exchange.poll(http, request)
            except Exception:
                if not scope.cancel_called:
                    raise  # an aborted poll's failure (a connection closed under it) is no failure
            finally:
                self._poll_scope = None
        return (False, True) if got is None else (got, False)

    def answered(self) -> None:
        """A 200 answer's head arrived."""
        if not self.connected:
            self.connected = True
            self._hooks.connected()

    def _take(self, request: NextPoll, items: list[dict[str, Any]]) -> bool:
        if items and self._backoff.failures:
            # The server is serving: a stream that then breaks (a restart) backs off from the start again,
            # instead of adding to the failures of earlier outages until every retry waits max_poll_interval.
            self._backoff.success()
            self._stats.consecutive_failures = 0
        applied = self._tracker.apply(request, items)
        self._stats.duplicates += applied.duplicates
        self._stats.messages += applied.messages
        for r in applied.resets:
            self._stats.resets += 1
            what = (
                f"holds another message under our last id {r.sent}"
                if r.replaced
                else f"is at id {r.server}, behind our position {r.sent}"
            )
            log.warning(
                "shmbus.client: %s: the server %s (a restart, a new bus or an expired channel): reading its ids "
                "again from 0",
                r.channel,
                what,
            )
            self._hooks.reset(r)
        self._dispatcher.deliver(applied.deliveries)
        if applied.resets:
            raise Repoll()
        return bool(items)
