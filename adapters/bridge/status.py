"""What a bridge reports: one object per bridge, written by the kit and the backend, read by ``health()``, the
metrics (``Engine.relay_figures``), the admin page and ``shmbus top``; nothing reaches into private attributes."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from shmbus.figures import RelayFigures, RelayState

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


#: Seconds a relay that holds the election may go without a step (a doorbell wait, a history page) before its
#: state reads "stalled": its longest honest step is a backend call or a wait for writers (5 s each by default).
STALL_AFTER = 30.0


@dataclass
class BridgeStatus:
    """A bridge's states and counters. Counters describe the bridge, so they survive fork; ``relaying``,
    ``position`` and ``backend_newest`` describe this process's relay and are cleared in the child."""

    kind: str
    where: str  #: the backend without secrets (for log lines)
    log: logging.Logger = field(repr=False)
    state: PublishState = "unknown"
    relay_state: RelayState = "standby"
    relaying: bool = False  #: this process holds the host's relay election
    last_error: str | None = None
    last_error_at: float | None = None
    published: int = 0
    relayed: int = 0
    relay_lost: int = 0  #: ids the backend no longer held when this process's relay read after them
    unrelayable: int = 0  #: messages read that could not be stored (undecodable)
    resets: int = 0
    takeovers: int = 0
    position: int = 0  #: the newest global id the relay has handled (stored, skipped, or counted lost)
    backend_newest: int = 0  #: the backend's newest global id as the relay last read it
    stall_after: float = STALL_AFTER
    stepped_at: float = 0.0  #: ``time.monotonic()`` of the relay's last step (0: none yet)
    _stall_told: float = field(default=0.0, repr=False)  # the step whose stall was logged

    def step(self) -> None:
        """The relay made a step (called by the relay thread at each one): it is not stalled."""
        if self._stall_told and self._stall_told == self.stepped_at:
            self.log.info("shmbus %s bridge %s: relay (pid %d) progresses again", self.kind, self.where, os.getpid())
        self.stepped_at = time.monotonic()

    def current_relay_state(self, now: float | None = None) -> RelayState:
        """The relay state as reported: "stalled" when the relay holds the election but its thread made no step for
        ``stall_after`` s (a stalled thread cannot say so itself: whoever reads health or the figures does)."""
        state = self.relay_state
        if state not in ("connecting", "relaying") or not self.relaying or not self.stepped_at:
            return state
        now = time.monotonic() if now is None else now
        if now - self.stepped_at <= self.stall_after:
            return state
        if self._stall_told != self.stepped_at:
            self._stall_told = self.stepped_at
            self.log.warning(
                "shmbus %s bridge %s: relay (pid %d) made no progress for %.0f s (state %s -> stalled)",
                self.kind,
                self.where,
                os.getpid(),
                now - self.stepped_at,
                state,
            )
        return "stalled"

    #: publishes waiting for the backend now; the bridge sets ``stall_after`` (half its command timeout)
    calls: Calls = field(default_factory=lambda: Calls(2.5), repr=False)

    def set_state(self, state: PublishState, error: BaseException | None = None) -> None:
        self._record(error)
        if state != self.state:
            old, self.state = self.state, state
            self._log(logging.INFO if state == "ok" else logging.WARNING, "publish", old, state, state != "ok")

    def set_relay_state(self, state: RelayState, error: BaseException | None = None) -> None:
        self._record(error)
        if state != self.relay_state:
            old, self.relay_state = self.relay_state, state
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
        return RelayFigures(self.relaying, self.current_relay_state(), self.backend_newest, self.relay_lost)

    def after_fork(self) -> None:
        self.relaying = False
        self.relay_state = "standby"
        self.position = self.backend_newest = 0
        self.stepped_at = 0.0
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
            "relay": self.relaying,
            "relay_state": self.current_relay_state(),
            "last_error": self.last_error,
            "last_error_at": self.last_error_at,
            "published": self.published,
            "relayed": self.relayed,
            "relay_highest_global_id": self.position,
            "relay_backend_global_id": self.backend_newest,
            "relay_lost": self.relay_lost,
            "unrelayable": self.unrelayable,
            "resets": self.resets,
            "takeovers": self.takeovers,
        }
