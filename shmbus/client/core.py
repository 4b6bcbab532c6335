"""The async client: its options, lifecycle and subscriptions; one poll loop and one dispatcher per client.

The poll loop (:mod:`.polling`) sends one poll at a time (never two in flight), reads the answer as it streams in,
moves the subscriptions' positions (:mod:`.positions`) and queues the deliveries; the dispatcher
(:mod:`.dispatch`) runs the callbacks in order, one at a time, so a slow or failing callback never holds up the
reading (unless ``max_pending`` asks it to), and a subscribe or unsubscribe made from a callback aborts the
current poll at once. A position store's saver (:mod:`.store`) is the third task, when there is a store.

It runs on asyncio and on trio (through anyio): ``async with client:`` runs the tasks in a task group of the
block's own, on either; ``start()`` / ``stop()`` outside such a block run them in an asyncio task (:mod:`.runs`).
"""

from __future__ import annotations

import logging
import math
import re
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import replace
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectSendStream

from .chunks import MAX_BODY_BYTES
from .dispatch import Dispatcher, Overflow
from .exchange import Headers
from .hooks import Hook, Hooks
from .message import STATUS_CHANNEL, AsyncCallback, ClientMessage
from .outcomes import ClientStats, PollFailed
from .pacing import MIN_RETRY_AFTER
from .polling import PollLoop
from .positions import ClientSubscription, Tracker
from .runs import Run, on_asyncio
from .store import PositionSaver, PositionStore, check_positions

__all__ = ["AsyncMessageBusClient", "ClientStats", "PollFailed"]

log = logging.getLogger("shmbus.client")
_CLIENT_ID_RE = re.compile(r"[A-Za-z0-9._~-]{1,64}\Z")


def _seconds(name: str, value: float, minimum: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= minimum:
        raise ValueError(f"{name} must be a number of seconds >= {minimum:g}, got {value!r}")
    return float(value)


class AsyncMessageBusClient:
    """Subscribe to a message_bus server (shmbus or the gem) over HTTP, from asyncio or trio.

    ``base_url`` is where the server mounts ``message-bus/`` (its path is kept: ``https://host/forum``
    polls ``https://host/forum/message-bus/<client id>/poll``). Options carry the Ruby client's names and
    defaults (seconds): ``long_polling`` (else poll with ``?dlp=t`` every ``background_callback_interval``),
    ``chunked`` (ask for a streamed answer), ``min_poll_interval`` (the first backoff step and the least time
    between two polls), ``max_poll_interval`` (the backoff's cap), ``callback_interval`` (a long poll that
    brought nothing is repeated at most this often), ``headers`` (sent last, so they override; a callable is
    called before each poll: rotating tokens), ``client_id`` (default: 32 random hex digits), ``timeout`` (every
    poll's read timeout, an injected client's too: longer than the server's long-poll interval),
    ``first_chunk_timeout`` (no first chunk by then: a buffering proxy; fall back to non-chunked for
    ``retry_chunked_after`` polls). ``positions`` (from :attr:`positions`), or a ``position_store`` (read now,
    written every ``save_interval`` and on stop), are where ``subscribe`` starts a channel when no ``last_id`` is
    given. ``max_body_bytes`` bounds what one answer, or one piece of a streamed answer, may hold. ``decoder``,
    ``max_pending`` and ``overflow``: see :mod:`.dispatch`; ``on_connect``, ``on_error``, ``on_reset``,
    ``on_rate_limited``: see :mod:`.hooks`. ``http_client`` or ``transport`` inject httpx's (auth, proxies,
    tests); an injected client is not closed by :meth:`stop`.
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
        headers: Headers | None = None,
        client_id: str | None = None,
        timeout: float = 60.0,
        first_chunk_timeout: float = 3.0,
        retry_chunked_after: int = 30,
        positions: Mapping[str, int] | None = None,
        position_store: PositionStore | None = None,
        save_interval: float = 1.0,
        max_body_bytes: int = MAX_BODY_BYTES,
        decoder: Callable[[Any], Any] | None = None,
        max_pending: int | None = None,
        overflow: Overflow = "block",
        on_connect: Hook | None = None,
        on_error: Hook | None = None,
        on_reset: Hook | None = None,
        on_rate_limited: Hook | None = None,
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
        if positions is not None and position_store is not None:
            raise ValueError("pass positions or position_store, not both (the store's are the positions)")
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
        #: a mapping, or a callable called before each poll (see :data:`.exchange.Headers`)
        self.headers: Headers = headers if callable(headers) else dict(headers or {})
        #: a 429 is retried no sooner than this (seconds)
        self.min_retry_after = MIN_RETRY_AFTER
        self._stats = ClientStats()
        self._saver: PositionSaver | None = None
        interval = _seconds("save_interval", save_interval, 0.001)
        if position_store is not None:
            if not isinstance(position_store, PositionStore):
                raise TypeError(f"position_store needs load() and save(positions), got {position_store!r}")
            positions = check_positions(position_store.load(), f"{position_store!r}.load()")
            self._saver = PositionSaver(position_store, interval, lambda: self.positions, self._stats, positions)
        self._start_positions = dict(positions or {})
        self._http = http_client
        self._own_http = http_client is None
        self._transport = transport
        self._tracker = Tracker()
        self._hooks = Hooks(
            self._stats, on_connect=on_connect, on_error=on_error, on_reset=on_reset, on_rate_limited=on_rate_limited
        )
        self._dispatcher = Dispatcher(self._stats, decoder, max_pending, overflow)
        self._loop = PollLoop(self, self._tracker, self._stats, self._hooks, self._dispatcher)
        self._listeners: set[MemoryObjectSendStream[ClientMessage]] = set()
        self._state = "new"
        self._run: Run | None = None
        self._blocks: list[TaskGroup | None] = []  # the ``async with client:`` blocks open: the first one's group

    # ------------------------------------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Start polling (and running callbacks). Again after :meth:`stop`: a fresh start from the positions.

        Inside ``async with client:`` the tasks run in that block's task group; outside one, in an asyncio task of
        their own (on trio, which has no tasks outliving their block, that is a RuntimeError: use ``async with``).
        """
        if self._run is not None:
            return
        group = self._blocks[0] if self._blocks else None
        if group is None and not on_asyncio():
            raise RuntimeError("start() outside `async with client:` runs on asyncio only: use `async with client:`")
        if self._http is None or (self._own_http and self._http.is_closed):
            self._http = httpx.AsyncClient(transport=self._transport)  # each poll carries its timeouts
            self._own_http = True
        self._loop.open()
        self._dispatcher.open(paused=self._state == "paused")
        if self._state != "paused":
            self._state = "started"
        run = self._run = Run(self._http, self._own_http)
        if group is not None:
            group.start_soon(run.member, self._supervise, run, name=f"shmbus.client {self.client_id}")
        else:
            run.detach(self._supervise, f"shmbus.client {self.client_id}")

    async def _supervise(self, run: Run) -> None:
        """The run's task: its poll loop, dispatcher, saver and coroutine hooks in one group, then its end."""
        name = f"shmbus.client %s {self.client_id}"
        try:
            with run.scope:
                async with anyio.create_task_group() as group:
                    self._hooks.open(lambda fn, *args: group.start_soon(run.member, fn, *args, name=name % "hook"))
                    group.start_soon(run.member, self._loop.run, run.http, name=name % "poll")
                    group.start_soon(run.member, self._dispatcher.run, name=name % "dispatch")
                    if self._saver is not None:
                        group.start_soon(run.member, self._saver.run, name=name % "save")
        finally:
            try:
                with anyio.CancelScope(shield=True):  # the save and the close happen however the run was ended
                    if self._run is None:  # not started again meanwhile (from a callback)
                        self._dispatcher.clear()
                    if run.save and self._saver is not None:
                        await self._saver.save()
                    if run.own_http:
                        await run.http.aclose()
                        if self._http is run.http:
                            self._http = None
            finally:
                run.finished.set()

    def _halt(self) -> None:
        """No callback runs after this (safe from any thread: the sync client's stop() calls it first)."""
        self._dispatcher.halted = True

    async def stop(self) -> None:
        """Stop now: the poll in flight is aborted, no callback runs after this returns, ``listen`` loops end; the
        positions are saved to the ``position_store`` (awaited: a slow store makes a slow stop). Awaited in a
        callback or a hook, it returns at once and the rest happens when that callback or hook returns."""
        await self._stop(save=True)

    def _save_now(self) -> None:
        """The ``position_store``'s last save, in the calling thread (the sync client's, after its loop ended)."""
        if self._saver is not None:
            self._saver.save_now()

    def _end(self, save: bool) -> Run | None:
        """The part of a stop that does not wait: the run (if any) is cancelled; what it still does is its end."""
        self._halt()
        run, self._run = self._run, None
        self._state = "stopped"
        self._dispatcher.clear()
        for stream in self._listeners:
            stream.close()
        if run is not None:
            run.cancel(save)
        return run

    async def _stop(self, save: bool) -> None:
        run = self._end(save)
        if run is None:  # not running: the positions are still saved
            if save and self._saver is not None:
                await self._saver.save()
        elif not run.is_member():  # a callback or a hook: its own task ends the run once it returns
            await run.finished.wait()

    async def __aenter__(self) -> AsyncMessageBusClient:
        """Start, in a task group of this block's own (on asyncio and on trio). A block entered while the client runs
        (started by :meth:`start`, or in an outer block) only stops it at its end."""
        if self._run is not None or self._blocks:
            self._blocks.append(None)
            await self.start()
            return self
        group = anyio.create_task_group()
        await group.__aenter__()
        self._blocks.append(group)
        try:
            await self.start()
        except BaseException:
            self._blocks.pop()
            await group.__aexit__(None, None, None)  # nothing was started in it
            raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        group = self._blocks.pop()
        if group is None:
            await self.stop()
            return None
        self._end(save=True)
        # The group waits for the run's end. It hears of a cancellation (its own, or one it must let through); the
        # block's other exceptions are not its business (trio's would come out wrapped in an ExceptionGroup).
        if isinstance(exc, anyio.get_cancelled_exc_class()):
            return await group.__aexit__(exc_type, exc, tb)
        await group.__aexit__(None, None, None)
        return None

    def pause(self) -> None:
        """Hold callbacks (polling goes on, unless ``max_pending`` deliveries wait with ``overflow="block"``;
        what arrives is kept and delivered on :meth:`resume`)."""
        if self._state == "started":
            self._state = "paused"
            if self._dispatcher.resumed is not None:
                self._dispatcher.resumed.clear()

    def resume(self) -> None:
        if self._state == "paused":
            self._state = "started" if self._run is not None else "new"
            if self._dispatcher.resumed is not None:
                self._dispatcher.resumed.set()

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
    def subscribe(self, channel: str, callback: AsyncCallback, last_id: int | None = None) -> ClientSubscription:
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

    def remove(self, subscription: ClientSubscription) -> None:
        """Remove one subscription (the value :meth:`subscribe` returned)."""
        if subscription.active:
            self._tracker.discard([subscription])
            self._poll_again()

    async def listen(self, channel: str, last_id: int | None = None) -> AsyncIterator[ClientMessage]:
        """``async for msg in client.listen("/chat")``: the channel's messages until the client stops (or the
        loop is left: the subscription ends with it). Starts the client if needed (see :meth:`start`)."""
        send, receive = anyio.create_memory_object_stream[ClientMessage](math.inf)
        sub = self.subscribe(channel, send.send_nowait, last_id)
        self._listeners.add(send)
        try:
            await self.start()
            async for item in receive:  # until stop() closes ``send``
                yield item
        finally:
            self._listeners.discard(send)
            send.close()
            receive.close()
            self.remove(sub)

    def _poll_again(self) -> None:
        self._loop.poll_again()
