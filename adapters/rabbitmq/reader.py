"""The relay's side of the stream: one consumer whose deliveries are both the doorbell and the history read.

The stream *is* the history, and its consumer delivers it in offset order with the broker's ``x-stream-offset``
on every message, so a message's global id is its offset + 1 on every host. :meth:`StreamReader.ring` waits for
deliveries (the doorbell: what arrived is the broker's own record, not anyone's notice); :meth:`read_after`
hands the kit the buffered messages after its position, restarting the consumer at that offset when it needs
older ones. An entry that is not a message (a body that is no ``channel|envelope``: a history probe, or anyone's
bytes) is passed over: its id is never a message, as a rolled-back id on PostgreSQL. Offsets are not dense (the broker's
own entries, a segment's tracking chunk, take offsets and are never delivered), so a jump between deliveries
(or a first delivery past the offset asked for) asks the stream for its oldest message: only what lies below it
was deleted by retention (:attr:`StreamReader.gone`; the kit counts what this host never stored as lost).

The consumer is started once per session and kept: a read again from a position it already passed (the kit reads
a page again after a hole, and offsets have holes wherever the broker wrote its own entries) is served from the
messages it keeps after the kit's position, not by a new consumer. A consumer is attached at an offset retention
has not deleted, and one that delivered nothing since the kit's last keepalive is attached again where it stands
(:meth:`StreamReader.revive`): RabbitMQ 3.10 was seen leaving a consumer attached just below the stream's first
offset, while retention deleted that segment, delivering nothing ever after (the host fell silently behind).

:meth:`StreamReader.message_at` answers the kit's history check: the stream's entry at an offset, or whether
the stream is shorter (a deleted and recreated stream restarts its offsets at 0).
"""

from __future__ import annotations

import time

from ..bridge.backend import Row
from ..bridge.rows import DoorbellRing
from ..bridge.seals import NO_RING
from ..bridge.wire import unescape_channel
from .connection import AmqpConnection, Delivery
from .errors import RabbitUnavailable

__all__ = ["PROBE", "StreamReader", "parse_body"]

PROBE = b""  #: the history probe's body: an entry that is no message
_MAIN, _SIDE = 1, 2  # the consumer's channel; the history check's
_PREFETCH = 2000
#: Deliveries acknowledged at once (credit for the next ones): one ack per delivery cost the broker and the relay a
#: frame each (a quarter of the credit keeps the broker delivering without pause)
ACK_EVERY = _PREFETCH // 4


def parse_body(gid: int, body: bytes) -> Row | None:
    """``channel|envelope`` (the gem's line without its ids) as the row of ``gid``; None for anything else."""
    chan, sep, envelope = body.partition(b"|")
    if not sep or not envelope or not chan.startswith(b"/"):
        return None
    try:
        return Row(gid, gid, unescape_channel(chan), envelope)
    except UnicodeDecodeError:
        return None


class StreamReader:
    """The relay's consumer on ``stream`` over ``conn`` (see the module doc)."""

    def __init__(self, conn: AmqpConnection, stream: str, timeout: float) -> None:
        self.conn = conn
        self.stream = stream
        self.timeout = timeout
        self.started = False
        self.base = 0  #: the reader holds every message after this id (:attr:`rows`, then what the consumer delivers)
        self.expect = 0  #: the id of the next entry the consumer should deliver
        self.gone = 0  #: ids at or below this one that it skipped are deleted (retention), never to appear
        self.newest = 0  #: the newest id delivered
        self.rows: list[Row] = []  #: messages delivered after :attr:`base`, in id order
        self.skipped = 0  #: entries that were no message
        self.handed = 0  #: the newest id handed out (or passed over) by :meth:`read_after`
        self.starts = 0  #: consumers started (the first, a read from before :attr:`base`, a revival)
        self.revived = 0  #: consumers attached again because they delivered nothing (:meth:`revive`)
        self._consumer = ""
        self._taken = 0  #: the delivery tag of the newest delivery taken
        self._acked = 0  #: every delivery up to this tag is acknowledged
        self._delivered = False  #: the consumer delivered something since the last :meth:`revive`
        conn.open_channel(_MAIN, timeout)

    # ------------------------------------------------------------------ the consumer
    def start(self, after: int) -> None:
        """(Re)start the consumer at the entry after id ``after``: the reader then holds every message after it."""
        self._attach(after)
        self.rows, self.base, self.handed = [], after, after

    def _attach(self, after: int) -> None:
        """A new consumer delivering from the entry after id ``after`` (offset ``after``), attached no lower than
        the stream's first offset as last seen (:attr:`gone`): what lies between was deleted, and a consumer
        attached inside a segment that retention is deleting may never deliver (see the module doc)."""
        conn = self.conn
        if self.started:
            self._ack()  # what the old consumer delivered, before it goes
            conn.cancel(_MAIN, self._consumer, self.timeout)
        self.starts += 1
        self._consumer = f"shmbus-relay-{self.starts}"
        conn.deliveries = [d for d in conn.deliveries if d.channel != _MAIN]
        conn.consume(_MAIN, self.stream, self._consumer, max(after, self.gone), _PREFETCH, self.timeout)
        self.started, self.expect, self._delivered = True, after + 1, False

    def revive(self) -> bool:
        """Attach the consumer again where it stands if it delivered nothing since the last call (the kit calls
        this after seconds without deliveries): True if it did. An idle stream costs a cancel and a consume."""
        if not self.started or self._delivered:
            self._delivered = False
            return False
        self._attach(self.expect - 1)  # the messages held after :attr:`base` stay held
        self.revived += 1
        return True

    def _take(self) -> None:
        """Move what the consumer delivered into :attr:`rows`, acknowledging it (the broker's credit). A jump
        between offsets asks the stream for its oldest message once for all the jumps of this batch."""
        conn = self.conn
        if _MAIN in conn.cancelled:
            raise RabbitUnavailable(f"the broker cancelled the relay's consumer of {self.stream!r} (stream deleted?)")
        if not conn.deliveries:
            return
        mine = [d for d in conn.deliveries if d.channel == _MAIN]
        conn.deliveries = [d for d in conn.deliveries if d.channel != _MAIN]
        if not mine:
            return
        self._delivered = True
        expect, rows = self.expect, self.rows
        jumps: list[int] = []  # ids of deliveries that came after a hole above :attr:`gone`
        for d in mine:
            if d.offset is None:
                continue
            gid = d.offset + 1
            if gid < expect:
                continue  # the chunk the consumer started in holds entries before the one asked for
            if gid > expect and gid - 1 > self.gone:
                jumps.append(gid)
            expect = gid + 1
            row = parse_body(gid, d.body)
            if row is None:
                self.skipped += 1
                continue
            rows.append(row)
        self.expect = expect
        self.newest = max(self.newest, expect - 1)
        self._taken = mine[-1].tag
        if self._taken - self._acked >= ACK_EVERY:
            self._ack()
        if jumps:
            first = self.deleted_upto()
            self.gone = max(self.gone, *(min(first, gid - 1) for gid in jumps))

    def _ack(self) -> None:
        if self._taken > self._acked:
            self.conn.ack(_MAIN, self._taken)
            self._acked = self._taken

    def deleted_upto(self) -> int:
        """Ids at or below this one were deleted: the offset of the stream's oldest message (its id - 1).

        A jump between two deliveries is not enough to say so: the broker's own entries (a segment's tracking
        chunk) take offsets too and are never delivered."""
        conn = self.conn
        conn.open_channel(_SIDE, self.timeout)
        try:
            conn.consume(_SIDE, self.stream, "shmbus-first", "first", 1, self.timeout)
            first = self._side_until(lambda d: d.offset is not None)
            return int(first.offset or 0)
        finally:
            conn.deliveries = [d for d in conn.deliveries if d.channel != _SIDE]
            conn.close_channel(_SIDE, self.timeout)

    def ring(self, timeout: float) -> DoorbellRing:
        """Wait up to ``timeout`` s for deliveries; the newest id buffered and not handed out (the kit reads it)."""
        self._take()  # what an earlier read's pump left buffered
        if not self.rows or self.rows[-1].global_id <= self.handed:
            self.conn.pump(timeout)
            while self.conn.pump(0):
                pass
            self._take()
        rows = self.rows
        return DoorbellRing(rows[-1].global_id, [], {}) if rows and rows[-1].global_id > self.handed else NO_RING

    def read_after(self, after: int, limit: int) -> list[Row]:
        """The messages after ``after`` (at most ``limit``). Those the reader holds are kept until a read from a
        later position (a page is read again after a hole); the consumer is restarted at ``after`` only when the
        reader no longer holds what follows it (a read from before :attr:`base`: a reset, a new session)."""
        if not self.started or after < self.base:
            self.start(after)
            self.conn.pump(0.05)
        while self.conn.pump(0):
            pass
        self._take()
        rows = self.rows
        i = 0
        while i < len(rows) and rows[i].global_id <= after:
            i += 1
        if i:
            del rows[:i]
        self.base = after
        out = rows[:limit]
        self.handed = max(self.handed, out[-1].global_id if out else after)
        return out

    # ------------------------------------------------------------------ the history check
    def message_at(self, gid: int, probe: bytes) -> tuple[str, Delivery | None]:
        """The stream's entry of id ``gid``: ``("here", entry)``, ``("trimmed", None)`` (retention deleted it)
        or ``("shorter", None)`` (the stream never reached it: another history). ``probe``: the frames that
        publish a probe entry, so the stream's end is seen even when nothing else is published."""
        conn = self.conn
        conn.open_channel(_SIDE, self.timeout)
        try:
            conn.consume(_SIDE, self.stream, "shmbus-probe-end", "last", 100, self.timeout)
            conn.sock.sendall(probe)
            newest = self._side_until(lambda d: d.offset is not None and (d.offset + 1 >= gid or d.body == PROBE))
            if newest.offset is None or newest.offset + 1 < gid:
                return "shorter", None
            conn.cancel(_SIDE, "shmbus-probe-end", self.timeout)
            conn.deliveries = [d for d in conn.deliveries if d.channel != _SIDE]
            conn.consume(_SIDE, self.stream, "shmbus-probe-at", gid - 1, 100, self.timeout)
            entry = self._side_until(lambda d: d.offset is not None and d.offset + 1 >= gid)
            return ("here", entry) if entry.offset == gid - 1 else ("trimmed", None)
        finally:
            conn.deliveries = [d for d in conn.deliveries if d.channel != _SIDE]
            conn.close_channel(_SIDE, self.timeout)

    def _side_until(self, found: object) -> Delivery:
        conn = self.conn
        deadline = time.monotonic() + self.timeout
        while True:
            for d in conn.deliveries:
                if d.channel == _SIDE and found(d):  # type: ignore[operator]
                    return d
            conn.deliveries = [d for d in conn.deliveries if d.channel != _SIDE]
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no entry of {self.stream!r} arrived within {self.timeout} s")
            conn.pump(left)
