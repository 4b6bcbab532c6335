"""Per-process state fed by one bus tap: :class:`ProcessTap` (one state per process, the WSGI shells) and
:class:`LoopTap` (one per event loop of the process, the ASGI middleware and the transports' hub).

The bus listener thread calls the tap once per batch and hands it to the state(s) of this process
(``deliver(state, msgs)``, still on the listener thread: it must only queue or hand on work). After a fork the
child starts empty (:class:`shmbus.perprocess.PerProcess`) and re-arms the tap on first use, so a parent's
state is never touched.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from shmbus.bus import Bus
from shmbus.message import Message
from shmbus.perprocess import PerProcess

__all__ = ["LoopTap", "ProcessTap"]

T = TypeVar("T")


class ProcessTap(Generic[T]):
    """``get()``: this process's state (made by ``factory()``), tapping the bus once per process."""

    def __init__(
        self, bus: Bus, factory: Callable[[], T], deliver: Callable[[T, list[Message]], None], linger: float = 0.0
    ) -> None:
        self.bus = bus
        self.linger = linger  # the bus listener's linger (Bus.tap)
        self._factory = factory
        self._deliver = deliver
        self._state: PerProcess[T] = PerProcess(self._arm)

    def _arm(self) -> T:
        state = self._factory()
        self.bus.untap(self._on_batch)  # the parent's tap, inherited by a forked child
        self.bus.tap(self._on_batch, self.linger)
        return state

    def get(self) -> T:
        return self._state.get()

    def current(self) -> T | None:
        """This process's state if it was made here, else ``None``."""
        return self._state.current()

    def _on_batch(self, msgs: list[Message]) -> None:
        """Listener thread: hand the batch to this process's state (nothing in a child until it re-arms)."""
        state = self._state.current()
        if state is not None:
            self._deliver(state, msgs)

    def close(self) -> T | None:
        """Stop the tap; return this process's state (for closing), forgotten from now on."""
        self.bus.untap(self._on_batch)
        return self._state.clear()


class LoopTap(Generic[T]):
    """``get()``: the running loop's state (made by ``factory(loop)``), tapping the bus once per process."""

    def __init__(
        self,
        bus: Bus,
        factory: Callable[[asyncio.AbstractEventLoop], T],
        deliver: Callable[[T, list[Message]], None],
        linger: float = 0.0,
    ) -> None:
        self._factory = factory
        self._deliver = deliver
        self._lock = threading.Lock()
        # the states of this process's loops: a dict that the listener thread reads a snapshot of
        self._loops: ProcessTap[dict[asyncio.AbstractEventLoop, T]] = ProcessTap(bus, dict, self._fan_out, linger)

    @property
    def bus(self) -> Bus:
        return self._loops.bus

    @property
    def linger(self) -> float:
        return self._loops.linger

    def get(self) -> T:
        loop = asyncio.get_running_loop()
        states = self._loops.get()
        state = states.get(loop)
        if state is not None:
            return state
        with self._lock:
            state = states.get(loop)
            if state is None:
                for old in [lp for lp in states if lp.is_closed()]:
                    del states[old]
                state = states[loop] = self._factory(loop)
        return state

    def values(self) -> tuple[T, ...]:
        """The states of this process's loops (a snapshot)."""
        states = self._loops.current()
        return tuple(states.values()) if states is not None else ()

    def _fan_out(self, states: dict[asyncio.AbstractEventLoop, T], msgs: list[Message]) -> None:
        for state in tuple(states.values()):
            self._deliver(state, msgs)

    def close(self) -> None:
        self._loops.close()
