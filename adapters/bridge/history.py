"""The relay machine's history rule: a reset only for another history. Part of :class:`~.machine.RelayMachine`
(the base of its rule mixins: the state they share is declared here, the machine sets it); no I/O: each method
returns the next action.

The backend names its history (``Backend.history_id``); the segment records the one it holds. Only a different
name, confirmed by ``Backend.history_continues`` on a message of the segment read first, empties the bus. Ids
compared at different moments never decide it, so a local publisher landing its own message cannot make the
segment look ahead.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Literal

from .events import (
    NAME_HISTORY,
    RESET_BUS,
    Action,
    BusReset,
    Confirmed,
    ConfirmHistory,
    Done,
    Failed,
    HistoryNamed,
    RecordHistory,
)
from .steps import Step

if TYPE_CHECKING:
    from .lifecycle import RelayLifecycle
    from .losses import LossBook
    from .seals import Sealer
    from .status import BridgeStatus
    from .steps import RelayConfig, SegmentView

__all__ = ["CatchUpFor", "HistoryFor", "HistoryRules"]

#: Why a history check runs: where it goes on (:meth:`~.machine.RelayMachine.history_checked`).
HistoryFor = Literal["start", "page", "stale", "periodic"]
#: Why a catch-up runs: where it goes on (:meth:`~.machine.RelayMachine.caught_up`).
CatchUpFor = Literal["start", "top", "history", "idle"]


class HistoryRules:
    """The history check and reset (see the module doc)."""

    # the machine's state the rules share (set in RelayMachine.__init__)
    config: RelayConfig
    status: BridgeStatus
    relay: RelayLifecycle
    view: SegmentView
    log: logging.Logger
    losses: LossBook
    step: Step
    mark: int  #: the segment's newest id when the backend's history was last confirmed
    named: bool  #: the backend named its history at the last check
    joining: bool  #: a brand-new segment: its first read says what the host was never owed
    active: dict[str, int]  #: channel -> newest id stored since the last maintain
    sealer: Sealer | None  #: verifies seals for the last key and history seen

    def clear_session(self) -> None:
        """Forget a check under way (a failure ends it)."""
        self._history_for: HistoryFor = "start"
        self._page_mark = self._n0 = self._current = 0
        self._reset = False

    # where each rule goes on: the machine's (its pump, its session) and the catch-up's
    def tick(self) -> None:
        raise NotImplementedError

    def history_checked(self, reset: bool, purpose: HistoryFor) -> Action:
        raise NotImplementedError

    def caught_up(self, purpose: CatchUpFor) -> Action:
        raise NotImplementedError

    def session_failed(self, event: Failed) -> Action:
        raise NotImplementedError

    def check_history(self, purpose: HistoryFor, mark: int = 0) -> Action:
        """Reset the bus if the backend's history is another one than the segment holds.

        The segment's newest id is read *before* the backend's identity: when the identity is unchanged, that
        message belongs to the recorded history (the ``mark``; every catch-up read that came from the recorded
        history confirms one the same way). When it changed, the backend compares the message at the newest
        confirmed mark, so messages of the new history stored since (a publisher landing its own) cannot vouch
        for the old one."""
        self._history_for, self._page_mark = purpose, mark
        self._n0 = self.view.global_id()
        self.step = Step.NAMING
        return NAME_HISTORY

    def history_named(self, event: HistoryNamed) -> Action:
        relay = self.relay
        relay.backend_newest = max(relay.backend_newest, event.backend_newest)
        current, recorded = event.current, self.view.history_id()
        self.named = current != 0
        if current == 0:  # the backend cannot name its history now (a replica without one): nothing to decide
            return self.history_checked(False, self._history_for)
        if current == recorded:
            self.mark = self._n0
            return self.history_checked(False, self._history_for)
        self.joining = not recorded and not self._n0  # a brand-new segment joins this history
        self._current = current
        self._page_mark = self.mark or self._page_mark or self._n0
        if not self.view.global_id():  # an empty segment holds no history to lose
            return self._record(False)
        self.step = Step.CONFIRMING
        return ConfirmHistory(bool(recorded), self._page_mark)

    def history_confirmed(self, event: Confirmed) -> Action:
        if event.continues:
            return self._record(False)
        self.status.resets += 1
        # A publisher lands its message when it directly follows the segment's newest; a backend that cannot say
        # which history it wrote into (PostgreSQL's procedures) lets one written just after a TRUNCATE land in the
        # old epoch: the catch-up from 0 stores it again in the new one. Say which ids may be so.
        mark, newest = self._page_mark, self.view.global_id()
        again = (
            f"; ids {mark + 1}-{newest} came after it was last confirmed: those the new history holds are "
            "delivered again in the new epoch"
            if newest > mark
            else ""
        )
        self.log.warning(
            "shmbus %s bridge: the backend's history is not the one bus %r holds (flushed, restarted without "
            "persistence, truncated or recreated): resetting the bus so clients resynchronise%s",
            self.status.kind,
            self.config.bus_name,
            again,
        )
        self.step = Step.RESETTING
        return RESET_BUS

    def bus_reset(self, event: BusReset) -> Action:
        self.relay.position = 0
        self.relay.backend_newest = event.backend_newest
        self.active.clear()
        return self._record(True)

    def _record(self, reset: bool) -> Action:
        self._reset = reset
        self.step = Step.RECORDING
        return RecordHistory(self._current)

    def history_recorded(self, _: Done) -> Action:
        self.mark = 0 if self._reset else self._n0
        return self.history_checked(self._reset, self._history_for)
