"""The optional in-memory publish queue (``queue_in_memory=True``): publishes made while the backend is unreachable
or read-only are kept (at most ``limit``, the oldest dropped and counted) and sent in order once it takes writes."""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Iterable

from shmbus.engines import Envelope
from shmbus.errors import EngineError, PublishOutcomeUnknown

__all__ = ["PublishQueue"]


class PublishQueue:
    """``send(envelope)`` publishes one queued message (raising the bridge's errors while the backend is down)."""

    def __init__(self, send: Callable[[Envelope], None], limit: int, log: logging.Logger) -> None:
        self.send = send
        self.limit = limit
        self.log = log
        self.dropped = 0
        self.after_fork()

    def after_fork(self) -> None:
        self._lock = threading.Lock()
        self._queue: collections.deque[Envelope] = collections.deque()
        self._flusher: threading.Thread | None = None
        self.stop = threading.Event()

    def __len__(self) -> int:
        return len(self._queue)

    def offer_if_queueing(self, envs: Iterable[Envelope]) -> bool:
        """Queue behind earlier messages still waiting (order is kept); False when none waits."""
        with self._lock:
            if not self._queue:
                return False
            self._push(envs)
        return True

    def put(self, envs: Iterable[Envelope]) -> None:
        with self._lock:
            self._push(envs)
        if self._flusher is None or not self._flusher.is_alive():
            t = threading.Thread(target=self._flush_loop, name="shmbus-bridge-flush", daemon=True)
            self._flusher = t
            t.start()

    def _push(self, envs: Iterable[Envelope]) -> None:
        for env in envs:
            self._queue.append(env)
            if len(self._queue) > self.limit:
                self._queue.popleft()
                self.dropped += 1
                self.log.warning(
                    "shmbus bridge: in-memory publish queue full (%d); dropped the oldest message", self.limit
                )

    def _flush_loop(self) -> None:
        """Republish queued messages in order once the backend takes writes again (probing once a second)."""
        while not self.stop.is_set():
            with self._lock:
                if not self._queue:
                    return
                env = self._queue[0]
            try:
                self.send(env)
            except EngineError:
                self.stop.wait(1.0)
                continue
            except PublishOutcomeUnknown as exc:  # sent, reply lost: sending it again could store it twice
                self.log.warning(
                    "shmbus bridge: a queued message's publish has an unknown outcome, not resent: %s", exc
                )
            with self._lock:
                if self._queue and self._queue[0] is env:
                    self._queue.popleft()

    def close(self) -> None:
        self.stop.set()
        t = self._flusher
        if t is not None and t is not threading.current_thread():
            t.join(10)
        self._flusher = None
