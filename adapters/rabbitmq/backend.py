"""The RabbitMQ side of the bridge kit (:class:`~shmbus.adapters.bridge.backend.Backend`): one stream queue.

**Ids are the stream's offsets** (global id = message id = offset + 1; sparse ids, as on PostgreSQL). A publisher
cannot learn them from the broker's confirm (AMQP confirms carry the channel's sequence number, not the offset),
so the relays alone store: each host's relay consumes the stream (:mod:`.reader`) and stores every message under
the ``x-stream-offset`` the broker gives it, the same on every host. A publisher sends its batch in one write,
waits for the broker's confirms (one round trip per batch), then finds its messages' ids where its host's relay
stored them: the segment's records after the newest id it held before publishing (an offset the stream gives
later is larger), matched in order by channel and data. With no relay on the host (a script with
``relay=False``) it reads them from the stream itself. Two identical messages (same channel, same data) published
at the same moment by two publishers (hosts, or threads of one host) may get each other's id, or the same one: they
cannot be told apart.

**History**: the stream, as long as it is not deleted. Its identity is named per relay session (a deleted
stream cancels the relay's consumer: the relay reconnects), so each session starts with the kit's history
check: the stream's entry at the segment's newest confirmed id is compared with the segment's message (a
recreated stream restarts its offsets at 0: it is shorter, or holds another message there), and only another
one resets the bus. RabbitMQ streams cannot be purged (``queue.purge`` is refused); retention deletes whole
segments from the start: ids a relay never read count as lost (``relay_lost``, a gap).
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from shmbus.channels import backend_name
from shmbus.perprocess import Birth
from shmbus.segment import BridgeRecord

from ..bridge.backend import Acknowledged, Page
from ..bridge.outcome import ReplyLost, cause_text, note_unknown, outcome_unknown
from ..bridge.wire import encode_envelope, line_tail
from . import amqp
from .connection import AmqpConnection, Closed
from .doorbell import RabbitDoorbell
from .errors import RabbitBridgeError, RabbitUnavailable, parse_url, redact_url, stream_down
from .publisher import StreamPublisher
from .reader import PROBE

if TYPE_CHECKING:
    from shmbus.bus import Backlog
    from shmbus.engines import BacklogGap, Envelope
    from shmbus.host import BusHost
    from shmbus.segment import Segment

__all__ = ["RabbitBackend"]


class RabbitBackend:
    """One stream queue (see the module doc); ``status`` is the bridge's, for the publish state."""

    kind = "rabbitmq"
    sparse_ids = True
    seal_hash = "sha256"  # no seals: every delivery is the broker's own record
    errors: tuple[type[BaseException], ...] = (OSError, Closed, ValueError, RabbitBridgeError)
    unreachable: tuple[type[BaseException], ...] = (OSError,)

    def __init__(
        self,
        url: str,
        stream: str,
        status: Any,
        *,
        arguments: dict[str, object],
        connect_timeout: float,
        command_timeout: float,
        local_wait: float,
    ) -> None:
        self.url = url
        self.where = redact_url(url)
        self.address = parse_url(url)
        self.stream = stream
        self.status = status
        self.arguments = {"x-queue-type": "stream", **arguments}
        self.connect_timeout = connect_timeout
        self.command_timeout = command_timeout
        self.local_wait = local_wait
        self.relay_running: Callable[[], bool] = lambda: False  #: set by the bridge: a relay runs on this host
        self.after_fork()

    def after_fork(self) -> None:
        """What must not cross a fork: connections (the parent's are abandoned, never closed: its sockets)."""
        self._birth = Birth()
        self._tls = threading.local()
        self._publishers: list[tuple[threading.Thread, StreamPublisher]] = []  #: each thread's, with the thread
        self._lock = threading.Lock()
        self._bell: RabbitDoorbell | None = None
        self._session = 0
        self._codec: Any = None

    # ------------------------------------------------------------------ connections
    def connect(self) -> AmqpConnection:
        a = self.address
        conn = AmqpConnection(a.host, a.port, a.user, a.password, a.vhost, self.connect_timeout)
        conn.sock.settimeout(self.command_timeout)
        return conn

    def connect_ready(self) -> AmqpConnection:
        """A connection on which the stream exists and is ready (:meth:`ensure_stream`): a broker that crashed the
        connection on a stream created a moment ago (541), or has it without running it yet (created by another
        process a moment ago: no replica here yet; restarting it), is asked again on a new one, a few times."""
        for attempt in range(6):
            conn = self.connect()
            try:
                self.ensure_stream(conn, 3)
                return conn
            except Closed as exc:
                conn.close(0.1)
                if (exc.code != 541 and stream_down(self.stream, exc.text) is None) or attempt == 5:
                    raise
            except BaseException:
                conn.close(0.1)
                raise
            time.sleep(0.05 * (attempt + 1))
        raise AssertionError("unreachable")

    def ensure_stream(self, conn: AmqpConnection, channel: int) -> None:
        """Declare the stream where missing, on ``channel`` (opened and closed here). A passive declare first: an
        existing stream keeps the retention it was created with, whatever this process's arguments say. A stream
        the broker has and does not run (yet) is refused saying so (:func:`.errors.stream_down`)."""
        try:
            self._declare_ready(conn, channel)
        except Closed as exc:
            down = stream_down(self.stream, exc.text)
            if down is None:
                raise
            raise Closed(exc.channel, exc.code, down) from exc

    def _declare_ready(self, conn: AmqpConnection, channel: int) -> None:
        conn.open_channel(channel, self.command_timeout)
        try:
            conn.declare(channel, self.stream, {}, True, self.command_timeout)
        except Closed as exc:
            if exc.channel != channel or exc.code != 404 or stream_down(self.stream, exc.text) is not None:
                raise  # declaring a stream that exists and does not run again cannot help
            conn.open_channel(channel, self.command_timeout)
            conn.declare(channel, self.stream, self.arguments, False, self.command_timeout)
        # RabbitMQ 3.10 crashes a channel publishing to a stream whose leader is not known yet (just created, by
        # anyone): a consumer's attach waits for it, so one attached and cancelled proves the stream ready
        conn.consume(channel, self.stream, "shmbus-ready", "next", 1, self.command_timeout)
        conn.cancel(channel, "shmbus-ready", self.command_timeout)
        conn.close_channel(channel, self.command_timeout)

    def _publisher(self) -> StreamPublisher:
        if not self._birth.here:
            self.after_fork()
        pub: StreamPublisher | None = getattr(self._tls, "pub", None)
        if pub is None or pub.conn.closed:
            conn = self.connect_ready()
            try:
                pub = StreamPublisher(conn, self.stream, self.command_timeout)
                if not self.relay_running():  # its ids will be read from the stream: from its end, not its start
                    pub.seen = pub.tail(min(1.0, self.command_timeout))
            except BaseException:
                conn.close()
                raise
            self._tls.pub = pub
            me = threading.current_thread()
            with self._lock:  # a thread that ended leaves its connection here: close it (a thread per request)
                gone = [p for t, p in self._publishers if not t.is_alive() or p.conn.closed]
                self._publishers = [(t, p) for t, p in self._publishers if t.is_alive() and not p.conn.closed]
                self._publishers.append((me, pub))
            for p in gone:
                p.conn.close(0.1)
        return pub

    def _drop_publisher(self) -> None:
        pub, self._tls.pub = getattr(self._tls, "pub", None), None
        if pub is not None:
            pub.conn.close(0.1)

    def close(self) -> None:
        if self._birth.here:
            with self._lock:
                pubs, self._publishers = self._publishers, []
            for _, pub in pubs:
                pub.conn.close(0.2)
        self._tls = threading.local()

    def record(self) -> BridgeRecord:
        secret = bool(self.address.password) and "@" in self.url
        return BridgeRecord(self.kind, self.where if secret else self.url, secret, {"stream": self.stream})

    def check(self, bus: BusHost) -> None:
        self._codec = bus.codec

    def describe(self) -> dict[str, Any]:
        return {"url": self.where, "stream": self.stream}

    # ------------------------------------------------------------------ publish
    def publish(self, bus: BusHost, envelopes: list[Envelope]) -> Acknowledged:
        codec = bus.codec
        bodies = [
            line_tail(backend_name(e.channel, e.site_id), encode_envelope(codec, e.payload, e.meta)) for e in envelopes
        ]
        seg = bus.segment
        epoch, after = seg.read_epoch(), seg.global_id()  # the stream gives our messages larger offsets
        try:
            if self._send(bodies):
                after = 0  # sent again into a stream declared anew: its offsets start at 0
        except ReplyLost as lost:
            self._drop_publisher()
            self.status.set_state("unreachable" if isinstance(lost.cause, OSError) else "error", lost.cause)
            raise outcome_unknown(self.kind, self.where, envelopes, lost) from lost.cause
        except (OSError, Closed, ValueError) as exc:  # nothing sent
            self._drop_publisher()
            self.status.set_state("unreachable" if isinstance(exc, OSError) else "error", exc)
            what = "is unreachable" if isinstance(exc, OSError) else "refused the connection or the stream"
            raise RabbitUnavailable(f"RabbitMQ at {self.where} {what}; not published: {cause_text(exc)}") from exc
        except BaseException as exc:
            if not isinstance(exc, Exception):
                note_unknown(exc, self.kind)
                self._drop_publisher()
            raise
        try:
            ids = self._ids(bus, envelopes, bodies, after, epoch)
        except Exception as exc:  # confirmed, so stored: only its id is unknown (the segment's lock timed out, say)
            raise outcome_unknown(self.kind, self.where, envelopes, ReplyLost(exc, sent=True)) from exc
        if ids is None:
            unseen = ReplyLost(TimeoutError("confirmed, but its offset was not seen in time"), sent=True)
            raise outcome_unknown(self.kind, self.where, envelopes, unseen)
        return Acknowledged([(g, g) for g in ids], None)

    def _send(self, bodies: list[bytes]) -> bool:
        """Publish and wait for the confirms; a batch the broker returned whole (no stream: deleted) is sent once
        more after declaring the stream again (it was not stored): then True."""
        pub = self._publisher()
        if pub.closed_while_idle():
            self._drop_publisher()
            pub = self._publisher()
        returned = pub.send(bodies)
        if returned == len(bodies):
            pub.seen = 0  # the stream was deleted: the new one's offsets start at 0
            self.ensure_stream(pub.conn, 3)
            returned = pub.send(bodies)
            if not returned:
                return True
        if returned:
            cause = RabbitBridgeError(f"{returned} of {len(bodies)} messages returned unroutable: stream deleted?")
            raise ReplyLost(cause, sent=True)
        return False

    def _ids(
        self, bus: BusHost, envelopes: list[Envelope], bodies: list[bytes], after: int, epoch: int
    ) -> list[int] | None:
        """The ids of our confirmed messages: from the segment where this host's relay stores them, else read
        from the stream."""
        seg, first_after, first_epoch = bus.segment, after, epoch
        wants = [(e.channel.encode(), (e.site_id or "").encode(), e.payload, e.meta) for e in envelopes]
        found: list[int] = []
        if self.relay_running() and self.local_wait > 0:
            deadline = time.monotonic() + self.local_wait
            while True:
                word = seg.futex_word()
                if seg.read_epoch() != epoch:
                    epoch, after, found = seg.read_epoch(), 0, []  # reset: the new history is read from 0
                after = _match(seg.global_backlog(after), wants, found, after)
                if len(found) == len(wants):
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                seg.wait(word, min(left, 0.05))
        try:
            pub = self._publisher()
            if seg.read_epoch() != first_epoch:
                pub.seen, first_after = 0, 0  # another history: its offsets start again
            if not self.relay_running():
                first_after = 0  # no relay keeps the segment in the stream's history: only what this one saw counts
            found_ids = pub.find(bodies, first_after, self.command_timeout)
            if found_ids is None:
                pub.seen = 0  # the stream may have been replaced: the next search starts from its beginning
            return found_ids
        except (OSError, Closed, ValueError):
            self._drop_publisher()
            return None

    # ------------------------------------------------------------------ the relay's reads
    def open_doorbell(self) -> RabbitDoorbell:
        bell = RabbitDoorbell(self)
        self._bell = bell
        self._session = secrets.randbits(62) | 1  # each session checks the history once (see the module doc)
        return bell

    def seal_key(self) -> bytes | None:
        return None

    def history_id(self) -> int:
        return self._session if self._bell is not None else 0

    def history_continues(self, seg: Segment, changed: bool, mark: int) -> bool:
        """The stream's entry at ``mark`` against the segment's message there: the same channel and data is the
        same history; a stream that never reached ``mark`` (recreated) is another; one whose retention deleted it
        cannot be told: the same (what this host missed is counted lost)."""
        bell = self._bell
        if mark <= 0 or bell is None:
            return True
        probe = amqp.publish_frames(amqp.publish_prefix(2, self.stream, mandatory=False), 2, [PROBE], 131072)
        where, entry = bell.reader.message_at(mark, probe)
        if where != "here" or entry is None:
            return where == "trimmed"
        recs = seg.global_backlog(mark - 1, limit=1)
        if not recs or recs[0].global_id != mark or self._codec is None:
            return True
        rec = recs[0]
        chan = backend_name(rec.channel.decode(), rec.site.decode() or None)
        return entry.body == line_tail(chan, encode_envelope(self._codec, rec.payload, rec.meta))

    def read_after(self, after: int, limit: int) -> Page:
        bell = self._bell
        if bell is None:
            raise RabbitUnavailable("the relay's consumer is not open")
        return Page(self._session, bell.reader.read_after(after, limit))

    def gone_upto(self) -> int:
        return self._bell.reader.gone if self._bell is not None else 0

    def settle(self, stop: threading.Event) -> bool:
        return True  # offsets appear in order: a missing id is deleted or no message, never in flight

    def newest_id(self) -> int:
        return self._bell.reader.newest if self._bell is not None else 0

    def maintain(self, bus: BusHost, position: int, active: dict[str, int]) -> None:
        return None  # retention is the broker's (the stream's max-length-bytes / max-age)

    def fill_backlog(self, bus: BusHost, gap: BacklogGap) -> Backlog | None:
        return None  # what the segment no longer holds is reported as a gap

    def closed_bell(self, bell: RabbitDoorbell) -> None:
        if self._bell is bell:
            self._bell = None


def _match(records: list[Any], wants: list[tuple[bytes, bytes, bytes, bytes]], found: list[int], after: int) -> int:
    """Append to ``found`` the ids of the records that are the next of ``wants``, in order; the newest id seen."""
    i = len(found)
    for r in records:
        after = r.global_id
        if i < len(wants):
            w = wants[i]
            if r.payload == w[2] and r.channel == w[0] and r.site == w[1] and r.meta == w[3]:
                found.append(r.global_id)
                i += 1
    return after
