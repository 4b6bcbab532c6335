"""The sync client: the asyncio core on an event-loop thread of its own.

Callbacks run on that thread, one at a time and in order. Every method may be called from any thread (a
callback included); :meth:`MessageBusClient.stop` cancels the poll in flight, so it returns at once, and once
it has returned no callback runs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import queue
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

from ..threads import interruptible_get, start_without_signals
from .core import AsyncMessageBusClient, ClientStats
from .message import Callback, ClientMessage
from .positions import ClientSubscription

__all__ = ["MessageBusClient"]

T = TypeVar("T")
_STOP = object()


class MessageBusClient:
    """Subscribe to a message_bus server over HTTP from plain (threaded) code.

    Same options as :class:`~shmbus.client.AsyncMessageBusClient` (``transport`` is an httpx *async*
    transport: the core is asyncio). Callbacks, hooks, a ``headers`` callable and a ``decoder`` run on the
    client's own thread. Use it as a context manager, or call :meth:`start` and :meth:`stop`.
    """

    def __init__(self, base_url: str, **options: Any) -> None:
        self._core = AsyncMessageBusClient(base_url, **options)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._listeners: set[queue.SimpleQueue[Any]] = set()

    # ------------------------------------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the loop thread and polling (again after :meth:`stop`: from the positions reached)."""
        with self._lock:
            if self._thread is not None:
                return
            loop = asyncio.new_event_loop()
            ready = threading.Event()
            thread = threading.Thread(
                target=self._run, args=(loop, ready), name=f"shmbus.client {self._core.client_id}", daemon=True
            )
            start_without_signals(thread)  # Ctrl-C must reach the caller's main thread, never the loop's
            ready.wait()
            self._loop, self._thread = loop, thread
        self._call(self._core.start())

    @staticmethod
    def _run(loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
        asyncio.set_event_loop(loop)
        loop.call_soon(ready.set)
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())  # name lookups' threads: none left behind
            loop.close()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop polling and the loop thread; no callback runs once this has returned (called from a callback,
        the rest of the stop happens once that callback returns). ``timeout`` bounds the wait for the loop; the
        last save to a ``position_store`` follows, in this thread, however long the store takes."""
        self._core._halt()  # before anything else: a callback about to run on the loop thread won't
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        for q in list(self._listeners):
            q.put(_STOP)
        if loop is None or thread is None:
            return
        in_callback = threading.current_thread() is thread
        stopping = asyncio.run_coroutine_threadsafe(self._core._stop(save=in_callback), loop)
        stopping.add_done_callback(lambda _: loop.call_soon_threadsafe(loop.stop))
        if in_callback:
            return
        try:
            stopping.result(timeout)
        except concurrent.futures.TimeoutError:
            loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)
        self._core._save_now()  # here, not bounded by ``timeout``: a slow store still gets the last positions

    def __enter__(self) -> MessageBusClient:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            coro.close()
            raise RuntimeError("the client is not started")
        if threading.current_thread() is thread:
            raise RuntimeError("cannot wait for the client's loop from its own thread")
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    def _on_loop(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` where the core's state lives: the loop thread (directly when not started or already there)."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None or threading.current_thread() is thread:
            return fn()

        async def call() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(call(), loop).result()

    # ------------------------------------------------------------------------------------------------ API
    def subscribe(self, channel: str, callback: Callback, last_id: int | None = None) -> ClientSubscription:
        """See :meth:`AsyncMessageBusClient.subscribe`; ``callback`` runs on the client's thread."""
        return self._on_loop(lambda: self._core.subscribe(channel, callback, last_id))

    def unsubscribe(self, channel: str, callback: Callback | None = None) -> bool:
        return self._on_loop(lambda: self._core.unsubscribe(channel, callback))

    def remove(self, subscription: ClientSubscription) -> None:
        self._on_loop(lambda: self._core.remove(subscription))

    def listen(self, channel: str, last_id: int | None = None, timeout: float | None = None) -> Iterator[ClientMessage]:
        """``for msg in client.listen("/chat")``: the channel's messages until the client stops, or none arrives
        for ``timeout`` seconds; leaving the loop ends the subscription. Starts the client if needed."""
        q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._listeners.add(q)
        sub = self.subscribe(channel, q.put, last_id)
        try:
            self.start()
            with contextlib.suppress(queue.Empty):  # nothing for ``timeout`` seconds
                yield from iter(lambda: interruptible_get(q, timeout), _STOP)
        finally:
            self._listeners.discard(q)
            self.remove(sub)

    def pause(self) -> None:
        self._on_loop(self._core.pause)

    def resume(self) -> None:
        self._on_loop(self._core.resume)

    @property
    def status(self) -> str:
        return self._core.status

    @property
    def stats(self) -> ClientStats:
        return self._on_loop(lambda: self._core.stats)

    @property
    def positions(self) -> dict[str, int]:
        return self._on_loop(lambda: self._core.positions)

    @property
    def client_id(self) -> str:
        return self._core.client_id

    @property
    def core(self) -> AsyncMessageBusClient:
        """The asyncio client underneath (its loop is this client's thread)."""
        return self._core
