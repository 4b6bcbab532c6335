"""The relay: the one process per host that copies the backend's history into the segment, for every backend.

The rules, written once:

* **The backend is the truth, notices are doorbells.** A notice only says "read": the relay stores what
  :meth:`Backend.read_after` returns after its position, in id order. A stale, repeated or forged notice costs at
  most one read that finds nothing; it can neither store, duplicate nor reset anything. The one shortcut: a line
  the backend's own publish code *sealed* (:mod:`.seals`) for the history the segment records, and whose id is
  the very next after the position, is the backend's word already and is stored without the read.
* **Loss is counted.** Ids the backend no longer holds when the relay reads past them (trimmed or expired before
  this host read them; a writer that outlived the backend's timeout) are added to ``relay_lost`` and logged, and
  every channel's next message starts a new chain (``Segment.break_chains``), so a backlog read across the loss
  reports ``gap=True`` (or is completed from the backend) instead of silently skipping.
* **A reset only for another history.** The backend names its history (:meth:`Backend.history_id`); the segment
  records the one it holds. Only a different name, confirmed by :meth:`Backend.history_continues` on a message
  of the segment read first, empties the bus. Ids compared at different moments never decide it, so a local
  publisher landing its own message cannot make the segment look ahead.
* **No duplicate window.** The position is the only memory: a read starts after ``max(position, segment's id)``
  and the segment skips ids it holds, so nothing is stored twice and nothing newer is ever taken for "already
  stored" (a reset sets the position back to 0 with the bus).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from shmbus.channels import split_backend_name
from shmbus.engines import Envelope
from shmbus.errors import PayloadTooLarge

from .backend import Backend, Doorbell, Ring, Row
from .election import RelayElection
from .losses import LossBook
from .seals import Sealer, sealed_rows
from .status import BridgeStatus
from .wire import decode_envelope

if TYPE_CHECKING:
    from shmbus.host import BusHost

__all__ = ["Relay"]

PAGE = 1000  # messages per history read
HISTORY_CHECK_INTERVAL = 1.0  # seconds between history checks while relaying (one small backend call each)
STALE_CHECK_INTERVAL = 0.1  # at most this often, a notice below the position triggers a history check at once
IDLE_CHECK = 5.0  # seconds without notices before the doorbell's keepalive and a read (writes without a notice)
METRICS_INTERVAL = 1.0  # the relay flushes the process's metrics itself (a process may relay without a listener)


class Relay:
    """Runs the election and, while this process holds it, the relay loop (one thread per process)."""

    def __init__(
        self,
        bus: BusHost,
        backend: Backend,
        status: BridgeStatus,
        election: RelayElection,
        log: logging.Logger,
        *,
        election_interval: float,
        reconnect_max: float,
        trim_interval: float = 0.0,
    ) -> None:
        self.bus = bus
        self.backend = backend
        self.status = status
        self.election = election
        self.log = log
        self.election_interval = election_interval
        self.reconnect_max = reconnect_max
        self.trim_interval = trim_interval
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        self._bell: Doorbell | None = None
        self._active: dict[str, int] = {}  # channel -> newest id stored since the last maintain()
        self._named = False  # the backend named its history at the last check
        self._marked_unreachable = False  # the publish state says unreachable because of the relay
        self._mark = 0  # the segment's newest id when the backend's history was last confirmed (see check_history)
        self._sealer: Sealer | None = None  # verifies seals for the last key and history seen
        self.losses = LossBook(status, log)
        self._joining = False  # a brand-new segment: its first read says what the host was never owed

    # ------------------------------------------------------------------ thread
    def start(self) -> None:
        self.stop = threading.Event()
        t = threading.Thread(
            target=self._elect_loop, name=f"shmbus-{self.status.kind}-relay-{self.bus.name}", daemon=True
        )
        self.thread = t
        t.start()

    def after_fork(self) -> None:
        """In a forked child: the parent's thread is gone and its doorbell is the parent's (closing our copy would
        shut the parent's socket down), so forget both."""
        self.thread = None
        self._bell = None
        self._active = {}
        self._mark = 0
        self._named = self._marked_unreachable = self._joining = False
        self.losses.after_fork()

    def close(self, join: bool) -> None:
        self.stop.set()
        bell = self._bell
        if bell is not None:
            try:
                bell.close()  # wakes the relay out of its wait at once
            except Exception:
                pass
        t = self.thread
        if join and t is not None and t is not threading.current_thread():
            t.join(10)
        self.thread = None

    def _elect_loop(self) -> None:
        stop = self.stop
        while not stop.is_set():
            try:
                if self.election.try_take():
                    self.status.relaying = True
                    self.status.takeovers += 1
                    try:
                        self._relay_loop()
                    finally:
                        self.election.release()
                        self.status.relaying = False
                        if not stop.is_set():
                            self.status.set_relay_state("standby")
                        self._flush_metrics()
            except Exception as exc:
                if stop.is_set():
                    return
                self.log.exception("shmbus %s bridge: election/relay error (retrying)", self.status.kind)
                self.status.set_relay_state("standby", exc)
            stop.wait(self.election_interval)

    def _relay_loop(self) -> None:
        """Open the doorbell (first, so nothing published after the catch-up read goes unnoticed), check the
        history, catch up, then read on every ring; on any error reconnect with capped backoff."""
        stop = self.stop
        backoff = 0.05
        self.status.set_relay_state("connecting")
        self._flush_metrics()
        while not stop.is_set():
            self.status.step()
            try:
                self._bell = self.backend.open_doorbell()
                self.check_history()
                self.catch_up()
                self.status.set_relay_state("relaying")
                if self._marked_unreachable and self.status.state == "unreachable":
                    self.status.set_state("ok")  # the relay's own failure said so; it is reachable again
                self._marked_unreachable = False
                self._flush_metrics()
                backoff = 0.05
                self._pump(self._bell)
            except Exception as exc:
                if stop.is_set():
                    return
                if not isinstance(exc, (*self.backend.errors, OSError, ValueError)):
                    self.log.exception("shmbus %s bridge: relay error", self.status.kind)
                if isinstance(exc, self.backend.unreachable) and self.status.state in ("ok", "unknown"):
                    self.status.set_state("unreachable", exc)  # health() must not say ok while it is down
                    self._marked_unreachable = True
                self.status.set_relay_state("reconnecting", exc)
                self._flush_metrics()
                stop.wait(backoff)
                backoff = min(backoff * 2, self.reconnect_max)
            finally:
                bell, self._bell = self._bell, None
                if bell is not None:
                    try:
                        bell.close()
                    except Exception:
                        pass

    def _pump(self, bell: Doorbell) -> None:
        stop = self.stop
        seg = self.bus.segment
        now = time.monotonic()
        idle_since = now
        next_history = now + HISTORY_CHECK_INTERVAL
        next_stale_check = now
        next_trim = now + self.trim_interval
        next_metrics = now + METRICS_INTERVAL
        while not stop.is_set():
            ring = bell.ring(0.25)
            self.status.step()
            now = time.monotonic()
            if ring.top:
                idle_since = now
                # publishers land only right after the segment's newest: every id up to it is settled
                self.status.position = max(self.status.position, seg.global_id())
                if ring.top > self.status.position and not self.store_sealed(ring):
                    self.catch_up()  # else stale, repeated, already landed by its publisher, or forged: nothing
                elif ring.top < self.status.position and now >= next_stale_check:
                    # An id below the position may be a new history's (a FLUSHDB, a TRUNCATE ... RESTART
                    # IDENTITY): look now, not at the next periodic check, so the bus is reset before that history
                    # reaches this position and a publisher here lands one of its ids in the old epoch.
                    next_stale_check = now + STALE_CHECK_INTERVAL
                    next_history = now + HISTORY_CHECK_INTERVAL
                    if self.check_history():
                        self.catch_up()
            if now >= next_history:
                next_history = now + HISTORY_CHECK_INTERVAL
                if self.check_history():
                    self.catch_up()
            if now - idle_since > IDLE_CHECK:
                idle_since = now
                bell.keepalive()
                self.catch_up()  # rows written without a notice (a connection lost between insert and notify)
            if self.trim_interval > 0 and now >= next_trim:
                next_trim = now + self.trim_interval
                active, self._active = self._active, {}
                self.backend.maintain(self.bus, self.status.position, active)
            if now >= next_metrics:
                next_metrics = now + METRICS_INTERVAL
                self._flush_metrics()

    def _flush_metrics(self) -> None:
        """Write this process's figures now: a process that relays may have no listener thread to do it."""
        try:
            self.bus.metrics.flush()
        except Exception:
            self.log.debug("shmbus: metrics flush from the relay failed", exc_info=True)

    # ------------------------------------------------------------------ history
    def check_history(self, mark: int = 0) -> bool:
        """Reset the bus if the backend's history is another one than the segment holds; True if it did.

        The segment's newest id is read *before* the backend's identity: when the identity is unchanged, that
        message belongs to the recorded history (the ``mark``; every catch-up read that came from the recorded
        history confirms one the same way). When it changed, the backend compares the message at the newest
        confirmed mark, so messages of the new history stored since (a publisher landing its own) cannot vouch
        for the old one."""
        seg = self.bus.segment
        newest_before = seg.global_id()
        current = self.backend.history_id()
        recorded = seg.history_id()
        self.status.backend_newest = max(self.status.backend_newest, self.backend.newest_id())
        self._named = current != 0
        if current == 0:  # the backend cannot name its history now (a replica without one): nothing to decide
            return False
        if current == recorded:
            self._mark = newest_before
            return False
        self._joining = not recorded and not newest_before  # a brand-new segment joins this history
        mark = self._mark or mark or newest_before
        reset = bool(seg.global_id()) and not self.backend.history_continues(seg, bool(recorded), mark)
        if reset:
            self.status.resets += 1
            # A publisher lands its message when it directly follows the segment's newest; a backend that cannot
            # say which history it wrote into (PostgreSQL's procedures) lets one written just after a TRUNCATE land
            # in the old epoch: the catch-up from 0 stores it again in the new one. Say which ids may be so.
            newest = seg.global_id()
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
                self.bus.name,
                again,
            )
            self.bus.reset()
            self.status.position = 0
            self.status.backend_newest = self.backend.newest_id()
            self._active.clear()
        seg.set_history_id(current)
        self._mark = 0 if reset else newest_before
        return reset

    # ------------------------------------------------------------------ catch-up
    def catch_up(self) -> None:
        """Store every message after the segment's newest, in id order, from the backend's history.

        A missing id may be in flight: the read waits once for the backend's writers (:meth:`Backend.settle`) and
        reads again. What is still missing then is lost when the backend says it is gone (at or below
        :meth:`Backend.gone_upto`: trimmed before this host read it) or a writer outlived the timeout; otherwise it
        never was a message (rolled back)."""
        seg = self.bus.segment
        pos = max(self.status.position, seg.global_id())
        settled = pos  # missing ids at or below this one were waited for
        timed_out = 0  # missing ids at or below this one had a writer that outlived the timeout: lost
        rereads = 0
        while not self.stop.is_set():
            self.status.step()
            newest_before = seg.global_id()
            page = self.backend.read_after(pos, PAGE)
            if self._joining:
                self._joining = False
                self.losses.joined(self.backend.gone_upto())
            if page.history and page.history == seg.history_id():
                self._mark = newest_before  # stored before a read that came from the recorded history: its own
            elif page.rows:
                # messages of another (or an unnamed) history: decide before storing any of them; every message
                # stored so far came from the recorded history, so the segment's newest is the mark
                if self.check_history(mark=newest_before):
                    pos = settled = timed_out = 0
                    continue
                if self._named:
                    rereads += 1
                    if rereads > 3:
                        break  # it keeps changing: the next ring reads again
                    continue  # the backend names its history now: read again, the page carries the name
                # else the backend cannot name it (a replica that has none): go by the ids
            rows = page.rows
            waited = False
            for row in rows:
                gid = row.global_id
                if gid <= pos:
                    continue
                if gid != pos + 1:
                    if gid - 1 > max(settled, timed_out):
                        waited = True  # a hole that may still fill: wait for its writers, then read again
                        break
                    self._lose(pos + 1, gid - 1, max(self.backend.gone_upto(), timed_out))
                self._store(row)
                pos = gid
            if waited:
                top = rows[-1].global_id  # every id missing below it was drawn before it was
                if not self.backend.settle(self.stop):
                    timed_out = top
                settled = top
                pos = max(pos, seg.global_id())
                continue
            if len(rows) < PAGE:
                gone = self.backend.gone_upto()
                if gone > pos:  # the newest ids are gone too (trimmed or expired before this read)
                    self._lose(pos + 1, gone, gone)
                    pos = gone
                break
        self.losses.report(self.bus.name)
        self.status.position = max(self.status.position, pos)
        self.status.backend_newest = max(self.status.backend_newest, self.status.position, self.backend.newest_id())

    def store_sealed(self, ring: Ring) -> bool:
        """Store the sealed runs of ``ring`` that continue the position one id after another; True if that covered
        every id it names (no read needed). A seal proves its lines are the backend's, written in the history the
        segment records; only runs that continue the position are taken, so nothing is skipped, stored twice or
        counted here."""
        if not ring.seals:
            return False
        seg = self.bus.segment
        sealer = self._sealer_for(seg.history_id())
        if sealer is None:
            return False
        status = self.status
        after = max(status.position, seg.global_id())  # its publisher may have landed it: nothing to verify
        for row in sealed_rows(ring, sealer, after):
            newest = seg.global_id()
            pos = max(status.position, newest)
            if row.global_id <= pos:
                continue  # landed by its publisher meanwhile
            if row.global_id != pos + 1:
                return False  # its publisher landed a later one: the read decides
            self._mark = newest  # stored before a message of the recorded history: its own
            self._store(row)
        status.backend_newest = max(status.backend_newest, status.position)
        return max(status.position, seg.global_id()) >= ring.top

    def _sealer_for(self, history: int) -> Sealer | None:
        """The verifier for the backend's seal key and the recorded ``history`` (built once per key and history)."""
        key = self.backend.seal_key()
        if key is None or not history:
            return None
        sealer = self._sealer
        if sealer is None or sealer.key is not key or sealer.history != history:  # one backend: one hash
            sealer = self._sealer = Sealer(self.backend.seal_hash, key, history)
        return sealer

    def _lose(self, first: int, last: int, lost_upto: int) -> None:
        """Move past ``first``..``last``, which the backend does not hold: those at or below ``lost_upto`` were
        messages this host never stored (the rest were rolled back: never messages); :class:`.losses.LossBook`
        counts those it was owed and logs them once per catch-up."""
        first = max(first, self.bus.segment.global_id() + 1)  # its publisher may have landed some meanwhile
        if self.losses.lose(first, min(last, lost_upto)) and self.backend.sparse_ids:
            self.bus.segment.break_chains()

    def _store(self, row: Row) -> None:
        """Store one message read from the backend; the position moves past it whether it was stored, already
        there, or unstorable (an error of the segment itself propagates, and the next read tries it again)."""
        bus = self.bus
        if row.value is None:  # the id existed; its message is gone (trimmed from its channel since)
            self._lose(row.global_id, row.global_id, row.global_id)
            self.status.position = row.global_id
            return
        try:
            channel, site = split_backend_name(row.channel)
            payload, meta = decode_envelope(bus.codec, row.value)
            env = Envelope(channel, site, payload, meta, bus.max_backlog_size, bus.max_backlog_age)
            stored = bus.store(env, global_id=row.global_id, message_id=row.message_id, timestamp=time.time())
        except PayloadTooLarge as exc:  # published on a host with a larger ring: this one cannot hold it
            self.losses.too_large(row.global_id, exc, bus.name)
            if self.backend.sparse_ids:
                bus.segment.break_chains()  # a backlog read across it says gap=True (and is filled from the backend)
            self.status.position = row.global_id
            return
        except (ValueError, UnicodeDecodeError, TypeError) as exc:
            self.status.unrelayable += 1
            self.log.warning(
                "shmbus %s bridge: cannot store message %d locally (%s); skipped", self.status.kind, row.global_id, exc
            )
            self.status.position = row.global_id
            return
        self.status.position = row.global_id
        if stored:  # 0: already there (its publisher on this host stored it itself)
            self.status.relayed += 1
        self._active[row.channel] = row.global_id
