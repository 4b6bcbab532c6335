"""The relay's state in this process, in one place: what health and the metrics report of it, and the only moves
between its states (any other raises :class:`IllegalMove`).

The relay machine (:mod:`.machine`) moves it; :class:`~.status.BridgeStatus` reports it. "stalled" is never
stored: whoever reads the state judges it against the relay's last step (a stalled thread cannot say so itself).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import get_args

from shmbus.errors import IllegalTransition
from shmbus.figures import RelayState

__all__ = ["MOVES", "STALL_AFTER", "HELD", "IllegalMove", "RelayLifecycle"]

#: Seconds a relay that holds the election may go without a step (a doorbell wait, a history page) before its
#: state reads "stalled": its longest honest step is a backend call or a wait for writers (5 s each by default).
STALL_AFTER = 30.0

#: The states a relay is in while it holds the election (and may stall in: "connecting" and "relaying").
HELD: frozenset[RelayState] = frozenset({"connecting", "relaying", "reconnecting"})

#: Every legal move, from -> to (staying in a state is always legal: it only records an error). "standby": this
#: process does not relay (it stands for election); "connecting": it won and opens the doorbell, checks the history
#: and catches up; "relaying": caught up, it follows the doorbell; "reconnecting": a backend call failed, it waits
#: its backoff and connects again; "off": the bridge was closed (a closed bridge may be started again).
MOVES: dict[RelayState, frozenset[RelayState]] = {
    "standby": frozenset({"connecting", "off"}),
    "connecting": frozenset({"relaying", "reconnecting", "standby", "off"}),
    "relaying": frozenset({"reconnecting", "standby", "off"}),
    "reconnecting": frozenset({"relaying", "standby", "off"}),
    "off": frozenset({"connecting", "standby"}),
    "stalled": frozenset(),  # reported, never stored
}
assert set(MOVES) == set(get_args(RelayState))


class IllegalMove(IllegalTransition):
    """A move :data:`MOVES` does not allow: a fault in the relay's rules, never a backend's."""


class RelayLifecycle:
    """The relay's state (:data:`MOVES`), whether this process holds the host's relay election, its last step,
    and how far it got: ``position`` (the newest global id it handled: stored, skipped or counted lost) and
    ``backend_newest`` (the backend's newest id as it last read it). All describe this process's relay: cleared in
    a forked child (:meth:`after_fork`)."""

    def __init__(self, kind: str, where: str, log: logging.Logger, stall_after: float = STALL_AFTER) -> None:
        self.kind, self.where, self.log = kind, where, log
        self.stall_after = stall_after
        self.clock: Callable[[], float] = time.monotonic  #: the relay's clock (a test gives a fake one)
        self.state: RelayState = "standby"
        self.holding = False  #: this process holds the host's relay election
        self.position = 0
        self.backend_newest = 0
        self.stepped_at = 0.0  #: :attr:`clock`'s time of the relay's last step (0: none yet)
        self._stall_told = 0.0  # the step whose stall was logged

    def move(self, state: RelayState) -> RelayState:
        """Move to ``state``; the state it left. :class:`IllegalMove` if :data:`MOVES` has no such move."""
        old = self.state
        if state != old and state not in MOVES[old]:
            raise IllegalMove(f"relay state {old} -> {state} is not a move the relay makes")
        self.state = state
        return old

    def step(self, now: float) -> None:
        """The relay made a step at ``now`` (its clock): it is not stalled."""
        if self._stall_told and self._stall_told == self.stepped_at:
            self.log.info("shmbus %s bridge %s: relay (pid %d) progresses again", self.kind, self.where, os.getpid())
        self.stepped_at = now

    def current(self, now: float | None = None) -> RelayState:
        """The state as reported: "stalled" when the relay holds the election, is connecting or relaying, and made
        no step for ``stall_after`` s (logged once per stall)."""
        state = self.state
        if state not in ("connecting", "relaying") or not self.holding or not self.stepped_at:
            return state
        now = self.clock() if now is None else now
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

    def close(self) -> None:
        """The bridge was closed: its relay is off (and holds nothing)."""
        self.holding = False
        self.move("off")

    def after_fork(self) -> None:
        """In a forked child: the parent's relay is not this process's."""
        self.state, self.holding = "standby", False
        self.position = self.backend_newest = 0
        self.stepped_at = 0.0
