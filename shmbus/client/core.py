"""The asyncio client: one poll loop and one dispatcher per client, over httpx.

The poll loop sends one poll at a time (never two in flight), reads the answer as it streams in, moves the
subscriptions' positions (:mod:`.positions`) and queues the deliveries; the dispatcher runs the callbacks in
order, one at a time, so a slow or failing callback never holds up the reading, and a subscribe or unsubscribe
made from a callback aborts the current poll at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import re
import uuid
from collections import deque
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

import httpx

from .chunks import MAX_BODY_BYTES, AnswerTooLarge, ProtocolViolation
from .exchange import PollExchange
from .message import STATUS_CHANNEL, AsyncCallback, Message
from .outcomes import ClientStats, NoFirstChunk, PollFailed, RateLimited, Repoll
from .pacing import MIN_RETRY_AFTER, Backoff, pause_after_poll
from .positions import Delivery, PollRequest, Subscription, Tracker

__all__ = ["AsyncMessageBusClient", "ClientStats", "PollFailed"]

log = logging.getLogger("shmbus.client")
_CLIENT_ID_RE = re.compile(r"[A-Za-z0-9._~-]{1,64}\Z")
_STOP = object()


def _seconds(name: str, value: float, minimum: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= minimum:
        raise ValueError(f"{name} must be a number of seconds >= {minimum:g}, got {value!r}")
    return float(value)


class AsyncMessageBusClient:
    """Subscribe to a message_bus server (shmbus or the gem) over HTTP, from asyncio.

    ``base_url`` is where the server mounts ``message-bus/`` (its path is kept: ``https://host/forum``
    polls ``https://host/forum/message-bus/<client id>/poll``). Options carry the Ruby client's names and
    defaults (seconds): ``long_polling`` (else poll with ``?dlp=t`` every ``background_callback_interval``),
    ``chunked`` (ask for a streamed answer), ``min_poll_interval`` (the first backoff step and the least time
    between two polls), ``max_poll_interval`` (the backoff's cap), ``callback_interval`` (a long poll that
    brought nothing is repeated at most this often), ``headers`` (sent last, so they override), ``client_id``
    (default: 32 random hex digits), ``timeout`` (every poll's read timeout, an injected client's too: longer
    than the server's long-poll interval), ``first_chunk_timeout`` (no first chunk by then: a buffering proxy;
    fall back to non-chunked for ``retry_chunked_after`` polls). ``positions`` (from :attr:`positions`) are
    where ``subscribe`` starts a channel when no ``last_id`` is given. ``max_body_bytes`` bounds what one answer,
    or one piece of a streamed answer, may hold (a server that never ends one would fill the memory).
    ``http_client`` or ``transport`` inject httpx's (auth, proxies, tests); an injected client is not closed by
    :meth:`stop`.
    """

    def __init__(
        self,
        base_url: str,
        *,
        long_polling: bool = True,
        chunked: bool = True,
        min_poll_interval: float = 0.1,
        max_poll_interval: float = 180.0,
        background_callback_interval: float = 60.0,
        callback_interval: float = 15.0,
        headers: Mapping[str, str] | None = None,
        client_id: str | None = None,
        timeout: float = 60.0,
        first_chunk_timeout: float = 3.0,
        retry_chunked_after: int = 30,
        positions: Mapping[str, int] | None = None,
        max_body_bytes: int = MAX_BODY_BYTES,
        http_client: httpx.AsyncClient | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"base_url must be an http(s) URL, got {base_url!r}")
        if client_id is not None and not _CLIENT_ID_RE.match(client_id):
            raise ValueError(f"client_id must be 1-64 characters of A-Z a-z 0-9 . _ ~ -, got {client_id!r}")
        if http_client is not None and transport is not None:
            raise ValueError("pass http_client or transport, not both")
        self.base_url = base_url if base_url.endswith("/") else base_url + "/"
        self.client_id = client_id or uuid.uuid4().hex
        self.poll_url = f"{self.base_url}message-bus/{self.client_id}/poll"
        self.long_polling = bool(long_polling)
        self.chunked = bool(chunked)
        self.min_poll_interval = _seconds("min_poll_interval", min_poll_interval)
        self.max_poll_interval = _seconds("max_poll_interval", max_poll_interval)
        self.background_callback_interval = _seconds("background_callback_interval", background_callback_interval)
        self.callback_interval = _seconds("callback_interval", callback_interval)
        self.timeout = _seconds("timeout", timeout, 0.001)
        self.first_chunk_timeout = _seconds("first_chunk_timeout", first_chunk_timeout, 0.001)
        self.retry_chunked_after = int(retry_chunked_after)
        if isinstance(max_body_bytes, bool) or not isinstance(max_body_bytes, int) or max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be an int >= 1024, got {max_body_bytes!r}")
        self.max_body_bytes = max_body_bytes
        self.headers = dict(headers or {})
        #: a 429 is retried no sooner than this (seconds)
        self.min_retry_after = MIN_RETRY_AFTER
        self._start_positions = dict(positions or {})
        self._http = http_client
        self._own_http = http_client is None
        self._transport = transport
        self._tracker = Tracker()
        self._backoff = Backoff(self.min_poll_interval, self.max_poll_interval)
        self._empty_polls = 0  # successful polls in a row that brought nothing (their pause grows)
        self._stats = ClientStats()
        self._exchange = PollExchange(self, self._stats, self._take)
        self._queue: deque[Delivery] = deque()
        self._listeners: set[asyncio.Queue[Any]] = set()
        self._state = "new"
        self._halted = False  # set first by stop(): no callback runs after it, from any thread
        self._changed: asyncio.Event | None = None
        self._queued: asyncio.Event | None = None
        self._resumed: asyncio.Event | None = None
        self._tasks: list[asyncio.Task[None]] = []

    # ------------------------------------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Start polling (and running callbacks). Again after :meth:`stop`: a fresh start from the positions."""
        if self._tasks:
            return
        if self._http is None or (self._own_http and self._http.is_closed):
            self._http = httpx.AsyncClient(transport=self._transport)  # each poll carries its timeouts
            self._own_http = True
        self._changed, self._queued, self._resumed = asyncio.Event(), asyncio.Event(), asyncio.Event()
        if self._state != "paused":
            self._resumed.set()
            self._state = "started"
        self._halted = False
        self._tasks = [
            asyncio.create_task(self._poll_loop(), name=f"shmbus.client poll {self.client_id}"),
            asyncio.create_task(self._dispatch_loop(), name=f"shmbus.client dispatch {self.client_id}"),
        ]

    async def stop(self) -> None:
        """Stop now: the poll in flight is aborted, no callback runs after this returns, ``listen`` loops end."""
        self._halted = True
        tasks, self._tasks = self._tasks, []
        me = asyncio.current_task()
        for t in tasks:
            t.cancel()
        for t in tasks:
            if t is not me:  # stop() awaited in a callback: the dispatcher ends when that callback returns
                with contextlib.suppress(asyncio.CancelledError):
                    await t
        self._state = "stopped"
        self._queue.clear()
        for q in self._listeners:
            q.put_nowait(_STOP)
        if self._own_http and self._http is not None:
            await self._http.aclose()
            self._http = None

    async def __aenter__(self) -> AsyncMessageBusClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def pause(self) -> None:
        """Hold callbacks (polling goes on; what arrives is kept and delivered on :meth:`resume`)."""
        if self._state == "started":
            self._state = "paused"
            if self._resumed is not None:
                self._resumed.clear()

    def resume(self) -> None:
        if self._state == "paused":
            self._state = "started" if self._tasks else "new"
            if self._resumed is not None:
                self._resumed.set()

    @property
    def status(self) -> str:
        """``"new"``, ``"started"``, ``"paused"`` or ``"stopped"``."""
        return self._state

    @property
    def stats(self) -> ClientStats:
        return replace(self._stats)

    @property
    def positions(self) -> dict[str, int]:
        """Per subscribed channel, the last id every callback of it has had: pass it as ``positions=`` to a new
        client to resume exactly there (no loss, no duplicate)."""
        return self._tracker.positions()

    @property
    def channels(self) -> list[str]:
        return list(self._tracker.by_channel())

    # ------------------------------------------------------------------------------------------------ subscriptions
    def subscribe(self, channel: str, callback: AsyncCallback, last_id: int | None = None) -> Subscription:
        """Call ``callback(message)`` for each message on ``channel`` after ``last_id``: -1 (default, unless
        ``positions`` names the channel) from now, 0 the whole backlog, ``n`` after id n, ``-k`` the last k-1.
        A poll in flight is aborted and the next one includes the channel at once."""
        if not isinstance(channel, str) or not channel.startswith("/") or channel == STATUS_CHANNEL:
            raise ValueError(f"a channel is a string starting with '/' (not {STATUS_CHANNEL}), got {channel!r}")
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {callback!r}")
        if last_id is None:
            last_id = self._start_positions.get(channel, -1)
        if isinstance(last_id, bool) or not isinstance(last_id, int):
            raise TypeError(f"last_id must be an int, got {last_id!r}")
        sub = self._tracker.add(channel, callback, last_id)
        self._poll_again()
        return sub

    def unsubscribe(self, channel: str, callback: AsyncCallback | None = None) -> bool:
        """Remove ``channel``'s subscriptions (only ``callback``'s if given; a trailing ``*`` makes ``channel`` a
        prefix: ``/x/*`` is every channel under ``/x/``). True if any was removed; their queued messages are
        dropped, the poll in flight aborted."""
        removed = bool(self._tracker.remove(channel, callback))
        if removed:
            self._poll_again()
        return removed

    def remove(self, subscription: Subscription) -> None:
        """Remove one subscription (the value :meth:`subscribe` returned)."""
        if subscription.active:
            self._tracker.discard([subscription])
            self._poll_again()

    async def listen(self, channel: str, last_id: int | None = None) -> AsyncIterator[Message]:
        """``async for msg in client.listen("/chat")``: the channel's messages until the client stops (or the
        loop is left: the subscription ends with it). Starts the client if needed."""
        q: asyncio.Queue[Any] = asyncio.Queue()
        sub = self.subscribe(channel, q.put_nowait, last_id)
        self._listeners.add(q)
        try:
            await self.start()
            while True:
                item = await q.get()
                if item is _STOP:
                    return
                yield item
        finally:
            self._listeners.discard(q)
            self.remove(sub)

    def _poll_again(self) -> None:
        if self._changed is not None:
            self._changed.set()

    # ------------------------------------------------------------------------------------------------ dispatch
    async def _dispatch_loop(self) -> None:
        queue, queued, resumed = self._queue, self._queued, self._resumed
        assert queued is not None and resumed is not None
        while True:
            if not queue:
                queued.clear()
                await queued.wait()
                continue
            if not resumed.is_set():
                await resumed.wait()
                continue
            sub, message, position = queue.popleft()
            if not sub.active or self._halted:
                continue
            if message is not None:
                try:
                    result = sub.callback(message)
                    if result is not None and inspect.isawaitable(result):
                        await result
                except Exception:
                    self._stats.callback_errors += 1
                    log.exception("shmbus.client: callback %r on %s failed", sub.callback, sub.channel)
            sub.delivered = position

    def _deliver(self, deliveries: list[Delivery]) -> None:
        if deliveries:
            self._queue.extend(deliveries)
            assert self._queued is not None
            self._queued.set()

    # ------------------------------------------------------------------------------------------------ polling
    async def _poll_loop(self) -> None:
        assert self._changed is not None
        loop = asyncio.get_running_loop()
        while True:
            self._changed.clear()
            request = self._tracker.next_request()
            if request is None:
                await self._changed.wait()
                continue
            started = loop.time()
            try:
                assert self._http is not None
                got_data, interrupted = await self._until_changed(self._exchange.poll(self._http, request))
            except RateLimited as exc:
                self._stats.rate_limited += 1
                self._stats.last_error = str(exc)
                await self._wait(exc.seconds, interruptible=False)
                continue
            except Repoll:
                continue
            except NoFirstChunk:
                self._exchange.unchunked(self.retry_chunked_after)
                self._stats.chunked_fallbacks += 1
                log.warning(
                    "shmbus.client: no first chunk from %s within %g s (a buffering proxy?): not chunked for the "
                    "next %d polls",
                    self.poll_url,
                    self.first_chunk_timeout,
                    self.retry_chunked_after,
                )
                continue
            except (httpx.HTTPError, OSError, PollFailed, ProtocolViolation) as exc:
                self._stats.failures += 1
                self._stats.consecutive_failures += 1
                self._tracker.distrust()
                self._stats.last_error = f"{type(exc).__name__}: {exc}"
                delay = self._backoff.failure()
                if isinstance(exc, AnswerTooLarge):  # a broken or hostile server, or a limit too low for it
                    self._stats.too_large += 1
                    log.warning("shmbus.client: %s from %s: closed; next in %.2f s", exc, self.poll_url, delay)
                else:
                    log.info("shmbus.client: poll failed (%s); next in %.2f s", self._stats.last_error, delay)
                await self._wait(delay)
                continue
            if interrupted or request.resolving:
                continue
            self._backoff.success()
            self._stats.consecutive_failures = 0
            self._empty_polls = 0 if got_data else self._empty_polls + 1
            await self._wait(
                pause_after_poll(
                    elapsed=loop.time() - started,
                    got_data=got_data,
                    long_polling=self.long_polling,
                    min_poll_interval=self.min_poll_interval,
                    callback_interval=self.callback_interval,
                    background_callback_interval=self.background_callback_interval,
                    empty_in_a_row=self._empty_polls,
                )
            )

    async def _wait(self, seconds: float, interruptible: bool = True) -> None:
        """Sleep ``seconds``; a subscribe or unsubscribe ends the sleep early unless ``interruptible`` is False."""
        if seconds <= 0:
            return
        if not interruptible:
            await asyncio.sleep(seconds)
            return
        assert self._changed is not None
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._changed.wait(), seconds)

    async def _until_changed(self, poll: Any) -> tuple[bool, bool]:
        """Run ``poll`` until it ends or the subscriptions change: (its result, whether it was interrupted)."""
        assert self._changed is not None
        task = asyncio.ensure_future(poll)
        changed = asyncio.ensure_future(self._changed.wait())
        try:
            done, _ = await asyncio.wait({task, changed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (task, changed):
                t.cancel()
            for t in (task, changed):  # the poll closes its response before we go on (or stop)
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
        if task in done:
            return bool(task.result()), False
        return False, True

    def _take(self, request: PollRequest, items: list[dict[str, Any]]) -> bool:
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
        self._deliver(applied.deliveries)
        if applied.resets:
            raise Repoll()
        return bool(items)
