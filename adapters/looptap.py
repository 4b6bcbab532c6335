"""Per process, per event loop state fed by one bus tap (shared by the ASGI middleware and the transports' hub).

The bus listener thread calls the tap once per batch; :class:`LoopTap` hands the batch to the state of every event
loop of this process (``deliver(state, msgs)``, still on the listener thread: it must only queue work for its
loop). After a fork the child starts empty and re-arms the tap on first use, so a parent's loops are never touched.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from shmbus.bus import Bus
from shmbus.message import Message

T = TypeVar("T")


class LoopTap(Generic[T]):
    """``get()``: the running loop's state (made by ``factory(loop)``), tapping the bus once per process."""

    def __init__(
        self,
        bus: Bus,
        factory: Callable[[asyncio.AbstractEventLoop], T],
        deliver: Callable[[T, list[Message]], None],
        linger: float = 0.0,
    ) -> None:
        self.bus = bus
        self.linger = linger  # the bus listener's linger (Bus.tap): the states gather batches for that long anyway
        self._factory = factory
        self._deliver = deliver
        self._states: dict[asyncio.AbstractEventLoop, T] = {}
        self._pid = 0
        self._lock = threading.Lock()

    def get(self) -> T:
        loop = asyncio.get_running_loop()
        if self._pid == os.getpid():
            state = self._states.get(loop)
            if state is not None:
                return state
        with self._lock:
            if self._pid != os.getpid():
                self._states = {}
                self._pid = os.getpid()
                self.bus.untap(self._on_batch)
                self.bus.tap(self._on_batch, self.linger)
            state = self._states.get(loop)
            if state is None:
                for old in [lp for lp in self._states if lp.is_closed()]:
                    del self._states[old]
                state = self._states[loop] = self._factory(loop)
        return state

    def values(self) -> tuple[T, ...]:
        """The states of this process's loops (a snapshot)."""
        return tuple(self._states.values())

    def _on_batch(self, msgs: list[Message]) -> None:
        """Listener thread: hand the batch to every loop's state (nothing in a child until it re-arms)."""
        if self._pid != os.getpid():
            return
        for state in tuple(self._states.values()):
            self._deliver(state, msgs)

    def close(self) -> None:
        self.bus.untap(self._on_batch)
