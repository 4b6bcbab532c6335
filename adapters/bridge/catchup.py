"""The relay machine's rules for reading the backend: the catch-up (with its loss accounting) and storing sealed
lines. Part of :class:`~.machine.RelayMachine` (a mixin: the state is the machine's, the rules are written here by
topic); no I/O: each method returns the next action.

* **The backend is the truth, notices are doorbells**: what is stored comes from ``Backend.read_after`` after the
  position, in id order, or is a line the backend's own publish code sealed (:mod:`.seals`) for the history the
  segment records whose id is the very next after the position.
* **Loss is counted**: ids the backend no longer holds when the relay reads past them go to ``relay_lost``
  (:class:`~.losses.LossBook`), and on sparse ids every channel's next message starts a new chain.
* **A host's own messages are its publisher's**: a message the backend trimmed from its channel before the relay
  read it (a burst larger than the channel's backlog) may be one a publisher of this host is landing; the relay
  waits for it (``landing_wait``, once per catch-up when it does not come) before counting it lost.
* **No duplicate window**: a read starts after ``max(position, segment's id)`` and the segment skips ids it holds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .events import (
    ASK_GONE,
    ASK_NEWEST,
    BREAK_CHAINS,
    SETTLE,
    Action,
    Done,
    GoneUpto,
    Halted,
    Landed,
    Newest,
    PageRead,
    Read,
    Settled,
    Stored,
    StoreRows,
    WaitLanded,
)
from .history import CatchUpFor, HistoryRules
from .seals import Sealer, sealed_rows
from .steps import Step

if TYPE_CHECKING:
    from .backend import DoorbellRing, Page, Row

__all__ = ["PAGE", "CatchUpRules"]

PAGE = 1000  # messages per history read


class CatchUpRules(HistoryRules):
    """The catch-up and the sealed store (see the module doc)."""

    def clear_session(self) -> None:
        """Forget a check or catch-up under way (a failure ends it; what it stored stays stored)."""
        super().clear_session()
        self._catch_up_for: CatchUpFor = "start"
        self._pos = self._settled = self._timed_out = self._rereads = self._newest_before = self._top = 0
        self._page: Page | None = None
        self._rows: list[Row] = []
        self._i = 0  # the next row of the page to look at
        self._run: list[Row] = []  # rows handed to the driver to store
        self._run_i = 0  # the next of them it has not stored yet
        self._sealed: list[Row] | None = None  # the sealed rows being stored (None: a catch-up's rows)
        self._sealed_i = 0
        self._landing_missed = False  # a wait for a publisher of this host ran out in this catch-up

    # ------------------------------------------------------------------ the catch-up
    def catch_up(self, purpose: CatchUpFor) -> Action:
        """Store every message after the segment's newest, in id order, from the backend's history.

        A missing id may be in flight: the read waits once for the backend's writers (``settle``) and reads again.
        What is still missing then is lost when the backend says it is gone (at or below ``gone_upto``: trimmed
        before this host read it) or a writer outlived the timeout; otherwise it never was a message (rolled
        back)."""
        self._catch_up_for = purpose
        self._pos = self._settled = max(self.relay.position, self.view.global_id())
        self._timed_out = 0  # missing ids at or below this one had a writer that outlived the timeout: lost
        self._rereads = 0
        self._sealed = None
        self._landing_missed = False
        return self._next_page()

    def _next_page(self) -> Action:
        self.tick()
        self._newest_before = self.view.global_id()
        self.step = Step.READING
        return Read(self._pos, PAGE)

    def page_read(self, event: PageRead) -> Action:
        self._page = event.page
        if self.joining:
            self.joining = False
            self.step = Step.JOINING
            return ASK_GONE
        return self._take_page(event.page)

    def joined(self, event: GoneUpto) -> Action:
        self.losses.joined(event.upto)
        assert self._page is not None
        return self._take_page(self._page)

    def _take_page(self, page: Page) -> Action:
        if page.history and page.history == self.view.history_id():
            self.mark = self._newest_before  # stored before a read that came from the recorded history: its own
        elif page.rows:
            # messages of another (or an unnamed) history: decide before storing any of them; every message
            # stored so far came from the recorded history, so the segment's newest is the mark
            return self.check_history("page", mark=self._newest_before)
        return self._walk_page(page)

    def page_history_checked(self, reset: bool) -> Action:
        if reset:
            self._pos = self._settled = self._timed_out = 0
            return self._next_page()
        if self.named:
            self._rereads += 1
            if self._rereads > 3:
                return self.finish_catch_up()  # it keeps changing: the next ring reads again
            return self._next_page()  # the backend names its history now: read again, the page carries the name
        assert self._page is not None
        return self._walk_page(self._page)  # the backend cannot name it (a replica that has none): go by the ids

    def _walk_page(self, page: Page) -> Action:
        self._rows, self._i = page.rows, 0
        return self._walk()

    def _walk(self) -> Action:
        """Go on along the page: hand the next run of rows that continue the position to the driver; stop at what
        needs the backend first (a gap) or the segment (a loss on sparse ids)."""
        rows = self._rows
        while True:
            i, pos = self._i, self._pos
            run: list[Row] = []
            while i < len(rows):
                row = rows[i]
                gid = row.global_id
                if gid <= pos:
                    i += 1
                elif gid == pos + 1 and row.value is not None:
                    run.append(row)
                    pos = gid
                    i += 1
                else:
                    break
            self._i, self._pos = i, pos
            if run:
                self._run, self._run_i = run, 0
                self.step = Step.STORING
                return StoreRows(run)
            if i == len(rows):
                return self._page_done(waited=False)
            gid = rows[i].global_id
            if gid != pos + 1:
                if gid - 1 > max(self._settled, self._timed_out):
                    return self._page_done(waited=True)  # a hole that may still fill: wait for its writers, read again
                wait = self._landing(pos + 1)  # gone from the backend's history: a publisher here may hold them
                if wait is not None:
                    return wait
                self.step = Step.GAP
                return ASK_GONE
            # the id existed; its message is gone (trimmed from its channel since), unless a publisher here lands it
            wait = self._landing(gid)
            if wait is not None:
                return wait
            self._i, self._pos = i + 1, gid
            self.relay.position = gid
            if self.lose(gid, gid, gid):
                self.step = Step.BREAKING
                return BREAK_CHAINS

    def _landing(self, gid: int) -> WaitLanded | None:
        """The wait for ``gid``'s publisher on this host, before it counts as lost (None: no wait: none is set,
        one ran out in this catch-up, or the segment holds it already)."""
        wait = self.config.landing_wait
        if wait <= 0 or self._landing_missed or self.view.global_id() >= gid:
            return None
        self.step = Step.LANDING
        return WaitLanded(gid, wait)

    def landed(self, event: Landed) -> Action:
        """The wait for a trimmed message's publisher ended: what it landed (and anything after) is in the segment,
        the rows up to it are passed; if it did not come, no later one in this catch-up is waited for."""
        if not event.ok:
            self._landing_missed = True
        self._pos = max(self._pos, self.view.global_id())
        return self._walk()

    def gap_gone(self, event: GoneUpto) -> Action:
        gid = self._rows[self._i].global_id
        first, self._pos = self._pos + 1, gid - 1  # passed over: lost, or never messages
        return self._break_if(self.lose(first, gid - 1, max(event.upto, self._timed_out)), Step.BREAKING)

    def stored(self, event: Stored) -> Action:
        """The driver stored ``done`` rows of the run; the position moves past each (stored, already there, or
        refused), and a refused row is counted with its reason."""
        run, start = self._run, self._run_i
        end = start + event.done
        if event.done:
            active = self.active
            for row in run[start:end]:
                active[row.channel] = row.global_id
            self.relay.position = run[end - 1].global_id
            self.status.relayed += event.relayed
        self._run_i = end
        if event.failed is not None:
            return self.session_failed(event.failed)  # what went in before the failure stays counted
        refused = event.refused
        if refused is None:
            return self.go_on_storing()
        row = run[end]
        self._run_i = end + 1
        self.relay.position = row.global_id
        if refused.why == "too_large":  # published on a host with a larger ring: this one cannot hold it
            self.losses.too_large(row.global_id, refused.error, self.config.bus_name)
            # a backlog read across it says gap=True (and is filled from the backend)
            return self._break_if(self.config.sparse_ids, Step.BREAKING)
        self.status.unrelayable += 1
        self.log.warning(
            "shmbus %s bridge: cannot store message %d locally (%s); skipped",
            self.status.kind,
            row.global_id,
            refused.error,
        )
        return self.go_on_storing()

    def go_on_storing(self, _: Done | None = None) -> Action:
        if self._run_i < len(self._run):
            self.step = Step.STORING
            return StoreRows(self._run[self._run_i :])
        return self._next_sealed() if self._sealed is not None else self._walk()

    def _page_done(self, waited: bool) -> Action:
        rows = self._rows
        if waited:
            self._top = rows[-1].global_id  # every id missing below it was drawn before it was
            self.step = Step.SETTLING
            return SETTLE
        if len(rows) < PAGE:
            self.step = Step.TAIL
            return ASK_GONE
        return self._next_page()

    def settled(self, event: Settled) -> Action:
        if not event.ok:
            self._timed_out = self._top
        self._settled = self._top
        self._pos = max(self._pos, self.view.global_id())
        return self._next_page()

    def tail_gone(self, event: GoneUpto) -> Action:
        gone = event.upto
        if gone > self._pos:  # the newest ids are gone too (trimmed or expired before this read)
            wait = self._landing(self._pos + 1)
            if wait is not None:
                return wait
            first, self._pos = self._pos + 1, gone
            return self._break_if(self.lose(first, gone, gone), Step.BREAKING_TAIL)
        return self.finish_catch_up()

    def finish_catch_up(self, _: Done | Halted | None = None) -> Action:
        self.losses.report(self.config.bus_name)
        self.relay.position = max(self.relay.position, self._pos)
        self.step = Step.FINISHING
        return ASK_NEWEST

    def newest(self, event: Newest) -> Action:
        relay = self.relay
        relay.backend_newest = max(relay.backend_newest, relay.position, event.newest)
        return self.caught_up(self._catch_up_for)

    # ------------------------------------------------------------------ losses
    def lose(self, first: int, last: int, lost_upto: int) -> bool:
        """Move past ``first``..``last``, which the backend does not hold: those at or below ``lost_upto`` were
        messages this host never stored (the rest were rolled back: never messages); :class:`.losses.LossBook`
        counts those it was owed. True: the segment's chains must break (a loss on sparse ids)."""
        first = max(first, self.view.global_id() + 1)  # its publisher may have landed some meanwhile
        return bool(self.losses.lose(first, min(last, lost_upto))) and self.config.sparse_ids

    def _break_if(self, needed: bool, then: Step) -> Action:
        if needed:
            self.step = then
            return BREAK_CHAINS
        return self.finish_catch_up() if then is Step.BREAKING_TAIL else self.go_on_storing()

    # ------------------------------------------------------------------ sealed lines
    def store_sealed(self, ring: DoorbellRing, key: bytes | None) -> Action:
        """Store the sealed runs of ``ring`` that continue the position one id after another; when that covers
        every id it names no read is needed, else catch up. A seal proves its lines are the backend's, written in
        the history the segment records; only runs that continue the position are taken, so nothing is skipped,
        stored twice or counted here."""
        sealer = self._sealer_for(key, self.view.history_id()) if ring.seals else None
        if sealer is None:
            return self.catch_up("top")
        after = max(self.relay.position, self.view.global_id())  # its publisher may have landed it: nothing to verify
        self._sealed, self._sealed_i, self._top = sealed_rows(ring, sealer, after), 0, ring.top
        return self._next_sealed()

    def _next_sealed(self) -> Action:
        sealed, relay = self._sealed, self.relay
        assert sealed is not None
        while self._sealed_i < len(sealed):
            row = sealed[self._sealed_i]
            newest = self.view.global_id()
            pos = max(relay.position, newest)
            if row.global_id <= pos:
                self._sealed_i += 1
                continue  # landed by its publisher meanwhile
            if row.global_id != pos + 1:
                return self.catch_up("top")  # its publisher landed a later one: the read decides
            self._sealed_i += 1
            self.mark = newest  # stored before a message of the recorded history: its own
            self._run, self._run_i = [row], 0
            self.step = Step.STORING
            return StoreRows(self._run)
        self._sealed = None
        relay.backend_newest = max(relay.backend_newest, relay.position)
        if max(relay.position, self.view.global_id()) >= self._top:
            return self.caught_up("top")  # every id the ring named is stored: no read, the pump goes on
        return self.catch_up("top")

    def _sealer_for(self, key: bytes | None, history: int) -> Sealer | None:
        """The verifier for the backend's seal ``key`` and the recorded ``history`` (built once per key and
        history)."""
        if key is None or not history:
            return None
        sealer = self.sealer
        if sealer is None or sealer.key is not key or sealer.history != history:  # one backend: one hash
            sealer = self.sealer = Sealer(self.config.seal_hash, key, history)
        return sealer
