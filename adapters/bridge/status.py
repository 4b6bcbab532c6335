"""What a bridge reports: one object per bridge, written by the kit and the backend, read by ``health()``, the
metrics (``Engine.relay_figures``), the admin page and ``shmbus top``; nothing reaches into private attributes."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from shmbus.figures import RelayFigures, RelayState

from .lifecycle import RelayLifecycle

__all__ = ["BridgeStatus", "Calls", "PublishState", "RelayState"]

#: The publish side's state, as ``health()`` reports it (``"stalled"``: reported, never stored, see :class:`Calls`).
PublishState = Literal["unknown", "ok", "unreachable", "readonly", "error", "stalled"]


class Calls:
    """The backend calls waiting now, by start time. The last outcome says nothing while a server is frozen (every
    call is still waiting), their age does: ``health()`` says ``stalled`` once the oldest waited ``stall_after``
    seconds.

    ``started`` maps a calling thread's id to its call's start (a thread makes one call at a time). The publish path
    stores and pops it inline, with no function of ours between: an exception a signal handler raises can land only
    after a call returns, so with the pop one C call in a ``finally`` no interrupted publish leaves an entry behind
    (a token handed out by a method could be lost between the method's return and the ``try``, and health would
    say "stalled" for good)."""

    def __init__(self, stall_after: float) -> None:
        self.stall_after = stall_after
        self.started: dict[int, float] = {}

    def waiting(self) -> tuple[int, float]:
        """How many calls wait now, and the oldest one's age in seconds (0.0: none)."""
        started = list(self.started.values())
        return len(started), (time.monotonic() - min(started) if started else 0.0)

    def clear(self) -> None:
        self.started = {}


@dataclass
class BridgeStatus:
    """A bridge's publish state, counters and relay (:class:`~.lifecycle.RelayLifecycle`: its state and figures).
    Counters describe the bridge, so they survive fork; ``relay`` describes this process's relay and is cleared in
    the child."""

    kind: str
    where: str  #: the backend without secrets (for log lines)
    log: logging.Logger = field(repr=False)
    state: PublishState = "unknown"
    last_error: str | None = None
    last_error_at: float | None = None
    published: int = 0
    relayed: int = 0
    relay_lost: int = 0  #: ids the backend no longer held when this process's relay read after them
    unrelayable: int = 0  #: messages read that could not be stored (undecodable)
    resets: int = 0
    takeovers: int = 0
    #: publishes waiting for the backend now; the bridge sets ``stall_after`` (half its command timeout)
    calls: Calls = field(default_factory=lambda: Calls(2.5), repr=False)
    relay: RelayLifecycle = field(init=False, repr=False)  #: this process's relay (set from the fields above)

    def __post_init__(self) -> None:
        self.relay = RelayLifecycle(self.kind, self.where, self.log)

    def set_state(self, state: PublishState, error: BaseException | None = None) -> None:
        self._record(error)
        if state != self.state:
            old, self.state = self.state, state
            self._log(logging.INFO if state == "ok" else logging.WARNING, "publish", old, state, state != "ok")

    def set_relay_state(self, state: RelayState, error: BaseException | None = None) -> None:
        """Move the relay to ``state`` (:data:`~.lifecycle.MOVES`; an illegal move raises), logging a change."""
        self._record(error)
        old = self.relay.move(state)
        if state != old:
            level = logging.WARNING if state == "reconnecting" else logging.INFO
            self._log(level, f"relay (pid {os.getpid()})", old, state, error is not None)

    def _record(self, error: BaseException | None) -> None:
        if error is not None:
            self.last_error = f"{type(error).__name__}: {error}"
            self.last_error_at = time.time()

    def _log(self, level: int, side: str, old: str, new: str, with_error: bool) -> None:
        suffix = f" ({self.last_error})" if with_error and self.last_error else ""
        self.log.log(level, "shmbus %s bridge %s: %s state %s -> %s%s", self.kind, self.where, side, old, new, suffix)

    def figures(self) -> RelayFigures:
        """The relay's part of the host metrics (``Engine.relay_figures``)."""
        relay = self.relay
        return RelayFigures(relay.holding, relay.current(), relay.backend_newest, self.relay_lost)

    def after_fork(self) -> None:
        self.relay.after_fork()
        self.calls.clear()  # the parent's threads' calls

    def health(self) -> dict[str, Any]:
        """The kit's fields of ``health()`` (the backend adds its own). ``state`` is ``stalled`` while a publish has
        waited longer than ``calls.stall_after`` (a frozen server), whatever the last outcome was."""
        waiting, oldest = self.calls.waiting()
        stalled = oldest > self.calls.stall_after
        state = "stalled" if stalled else self.state
        error = self.last_error if state in ("readonly", "unreachable", "error") else None
        if stalled:
            limit = self.calls.stall_after
            error = f"a publish has waited {oldest:.1f} s for the {self.kind} server (stalled after {limit} s)"
        return {
            "state": state,
            "error": error,
            "calls_waiting": waiting,
            "oldest_call_seconds": round(oldest, 3),
            "relay": self.relay.holding,
            "relay_state": self.relay.current(),
            "last_error": self.last_error,
            "last_error_at": self.last_error_at,
            "published": self.published,
            "relayed": self.relayed,
            "relay_highest_global_id": self.relay.position,
            "relay_backend_global_id": self.relay.backend_newest,
            "relay_lost": self.relay_lost,
            "unrelayable": self.unrelayable,
            "resets": self.resets,
            "takeovers": self.takeovers,
        }
