"""The NATS JetStream side of the bridge kit (:class:`~shmbus.adapters.bridge.backend.Backend`): one stream.

Every message of the bus is one message of the stream, on its channel's subject (:mod:`.layout`), its data the
gem's line without its ids (``chan|envelope``): the **stream sequence is the id** (global and message id alike:
sparse ids, as on PostgreSQL), given by the server in the publish's acknowledgement, so every host agrees.
JetStream draws a sequence only when it stores the message, so ids appear in order: a missing id below one read is
gone (deleted, purged, expired by the stream's limits), never in flight (``settle`` has nothing to wait for). The
stream's ``created`` time names the history: a purge keeps it (the purged ids count as lost for a host that had not
read them), a stream deleted and recreated changes it (the relay resets the bus). A stream that is missing is
created with the bridge's retention.

Publishes run on a connection per thread (:mod:`.client`): a batch is ONE write of every ``PUB`` (each with a reply
subject of its own), then the acknowledgements are read as they come. The relay reads with a pull consumer of its
own (:class:`~.jetstream.PullReader`) and wakes on a push consumer's deliveries (:mod:`.doorbell`).
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from shmbus.channels import backend_name
from shmbus.perprocess import Birth
from shmbus.segment import BridgeRecord

from ..bridge.backend import Acknowledged, Page, Row
from ..bridge.outcome import ReplyLost, cause_text, note_unknown, outcome_unknown
from ..bridge.status import BridgeStatus
from ..bridge.wire import decode_envelope, encode_envelope, line_tail
from . import jetstream as js
from .client import NatsConnection
from .doorbell import NatsDoorbell
from .errors import NatsBridgeError, NatsUnavailable, redact_url
from .layout import channel_subject, split_data, wildcard
from .protocol import NatsProtocolError, pub_op

if TYPE_CHECKING:
    from shmbus.bus import Backlog
    from shmbus.engines import BacklogGap, Envelope
    from shmbus.host import BusHost
    from shmbus.segment import Segment

__all__ = ["RECREATE_AFTER", "NatsBackend"]

RECREATE_AFTER = 2.0  #: seconds a deleted stream stays missing before the bridge makes it again (see stream_on)

_SEQ = b'"seq":'


def _ack_seq(payload: bytes) -> int | None:
    """The sequence in a PubAck ``{"stream":"S","seq":N,...}`` without a JSON parse (one per message)."""
    i = payload.find(_SEQ)
    if i < 0 or b'"error"' in payload:
        return None
    j = i + len(_SEQ)
    k = j
    n = len(payload)
    while k < n and 48 <= payload[k] <= 57:
        k += 1
    return int(payload[j:k]) if k > j else None


class NatsBackend:
    """One JetStream stream (see the module doc); ``status`` is the bridge's, for the publish state."""

    kind = "nats"
    sparse_ids = True
    seal_hash = "sha256"  # no seals: every delivery is a doorbell
    errors: tuple[type[BaseException], ...] = (OSError, NatsProtocolError, NatsBridgeError, ValueError)
    unreachable: tuple[type[BaseException], ...] = (OSError, NatsUnavailable)

    def __init__(
        self,
        url: str,
        stream: str,
        subject: str,
        status: BridgeStatus,
        *,
        storage: str,
        max_msgs: int | None,
        max_msgs_per_channel: int | None,
        max_age: float,
        replicas: int,
        connect_timeout: float,
        command_timeout: float,
    ) -> None:
        self.url = url
        self.stream = stream
        self.subject = subject  #: the prefix of the channels' subjects
        self.status = status
        self.storage = storage
        self.max_msgs = max_msgs
        self.max_msgs_per_channel = max_msgs_per_channel
        self._per_channel = max_msgs_per_channel if max_msgs_per_channel is not None else -1
        self.max_age = max_age
        self.replicas = replicas
        self.connect_timeout = connect_timeout
        self.command_timeout = command_timeout
        self._limit = max_msgs if max_msgs is not None else -1
        self._codec: Any = None
        self.after_fork()

    def after_fork(self) -> None:
        """Connections are this process's (the parent's are abandoned, never closed)."""
        self._birth = Birth()
        self._tls = threading.local()
        self._conns: list[NatsConnection] = []
        self._lock = threading.Lock()
        self._ready = False  # the stream exists (checked once per process, again after a publish found none)
        self._reader: js.PullReader | None = None
        self._newest = 0
        self._gone = 0
        self._known = 0  # the newest sequence read from the stream's state before the current consumer's fetches
        self._history = 0  # the identity of the stream the read consumer was made on (0: none yet)
        self._stale = True  # the previous read found nothing: read the stream's state before the next one
        self._seen = False  # this process saw the stream exist (a missing one was then deleted)
        self._missing_since = 0.0  # when this process first found the stream it saw missing

    # ------------------------------------------------------------------ connections
    def connect(self) -> NatsConnection:
        return NatsConnection(
            self.url, timeout=self.command_timeout, connect_timeout=self.connect_timeout, name=f"shmbus {self.stream}"
        )

    def conn(self) -> NatsConnection:
        """This thread's connection (publishes, the relay's reads), made on first use."""
        if not self._birth.here:
            self.after_fork()
        conn: NatsConnection | None = getattr(self._tls, "conn", None)
        if conn is None or conn.closed:
            conn = self.connect()
            self._tls.conn = conn
            with self._lock:
                self._conns.append(conn)
            if not self._ready:
                self.ensure_stream(conn)
        return conn

    def drop_conn(self) -> None:
        conn: NatsConnection | None = getattr(self._tls, "conn", None)
        self._tls.conn = None
        if conn is not None:
            conn.close()
            if self._reader is not None and self._reader.conn is conn:
                self._reader = None

    def stream_config(self) -> dict[str, Any]:
        return {
            "name": self.stream,
            "subjects": [wildcard(self.subject)],
            "retention": "limits",
            "storage": self.storage,
            "max_msgs": self._limit,
            "max_msgs_per_subject": self._per_channel,
            "max_age": int(self.max_age * 1e9),
            "discard": "old",
            "num_replicas": self.replicas,
            "allow_direct": True,
        }

    def ensure_stream(self, conn: NatsConnection) -> dict[str, Any]:
        """The stream's info, made where missing (:meth:`stream_on`), on this thread's connection."""
        try:
            info = self.stream_on(conn)
        except BaseException:
            self.drop_conn()
            raise
        self._ready = True
        return info

    def stream_on(self, conn: NatsConnection) -> dict[str, Any]:
        """The stream's info. One this process never saw is created at once (a new deployment). One it saw that is
        gone (deleted) is created again only once it has been missing for ``RECREATE_AFTER`` s (the caller waits):
        nats-server 2.9 can leave a stream recreated while the deleted one's files are still being removed
        unreadable (its first block missing), and every read of it then goes unanswered."""
        info = js.stream_info(conn, self.stream)
        if info is None and self._seen:
            now = time.monotonic()
            if not self._missing_since:
                self._missing_since = now
            wait = self._missing_since + RECREATE_AFTER - now
            if wait > 0:
                time.sleep(wait)
                info = js.stream_info(conn, self.stream)  # another host may have made it meanwhile
        if info is None:
            info = js.ensure_stream(conn, self.stream_config())
        self._seen, self._missing_since = True, 0.0
        return info

    def close(self) -> None:
        if self._birth.here:
            with self._lock:
                conns, self._conns = self._conns, []
            for c in conns:
                c.close()
        self._tls = threading.local()
        self._reader = None
        self._ready = False

    def record(self) -> BridgeRecord:
        public = redact_url(self.url)
        options = {"stream": self.stream}
        if self.subject != f"shmbus.{self.stream}":
            options["subject"] = self.subject  # a process attaching the bus publishes where the hosts read
        return BridgeRecord(self.kind, public, public != self.url, options)

    def check(self, bus: BusHost) -> None:
        self._codec = bus.codec
        if self.max_msgs is None:
            self._limit = max(bus.max_global_backlog_size, 1)
        if self.max_msgs_per_channel is None:
            self._per_channel = max(bus.max_backlog_size, 1)

    def describe(self) -> dict[str, Any]:
        return {"nats_url": redact_url(self.url), "stream": self.stream, "subject": self.subject}

    # ------------------------------------------------------------------ publish
    def publish(self, bus: BusHost, envelopes: list[Envelope]) -> Acknowledged:
        """Every ``PUB`` in one write, then the acknowledgements (see the module doc). No responder (the stream is
        gone) means nothing was stored: the stream is made again and the batch sent once more."""
        codec, prefix = bus.codec, self.subject
        chans = [backend_name(e.channel, e.site_id) for e in envelopes]
        subjects = [channel_subject(prefix, chan) for chan in chans]
        datas = [
            line_tail(chan, encode_envelope(codec, e.payload, e.meta)) for chan, e in zip(chans, envelopes, strict=True)
        ]
        try:
            for attempt in range(2):
                conn = self.conn()
                biggest = max(len(d) for d in datas)
                if biggest > conn.max_payload:
                    raise NatsBridgeError(
                        f"a message of {biggest} bytes is larger than the NATS server's max_payload "
                        f"({conn.max_payload}); nothing was published"
                    )
                first, replies = conn.reply_subjects(len(datas))
                out = b"".join([pub_op(s, r, d) for s, r, d in zip(subjects, replies, datas, strict=True)])
                try:
                    conn.send(out)
                except BaseException as exc:
                    self.drop_conn()
                    if isinstance(exc, Exception):
                        raise ReplyLost(exc, sent=None) from exc
                    raise
                try:
                    acks = conn.replies(first, len(datas))
                except BaseException as exc:
                    self.drop_conn()
                    if isinstance(exc, Exception):
                        raise ReplyLost(exc) from exc
                    raise
                ids = self._ids(acks)
                if ids is not None:
                    return Acknowledged(ids, None)
                if attempt == 0:
                    self._ready = False  # every reply said "no responders": no stream took them
                    self.ensure_stream(conn)
            raise NatsUnavailable(
                f"no JetStream stream takes subjects {wildcard(self.subject)!r}; nothing was published"
            )
        except ReplyLost as lost:
            self.status.set_state("unreachable" if isinstance(lost.cause, self.unreachable) else "error", lost.cause)
            raise outcome_unknown(self.kind, redact_url(self.url), envelopes, lost) from lost.cause
        except NatsBridgeError as exc:
            self.status.set_state("unreachable" if isinstance(exc, NatsUnavailable) else "error", exc)
            raise
        except (OSError, NatsProtocolError) as exc:  # before anything was written
            self.status.set_state("unreachable", exc)
            raise NatsUnavailable(
                f"NATS at {redact_url(self.url)} is unreachable; message not published: {cause_text(exc)}"
            ) from exc
        except BaseException as exc:
            if not isinstance(exc, Exception):
                note_unknown(exc, self.kind)
            raise

    def _ids(self, acks: list[Any]) -> list[tuple[int, int]] | None:
        """The sequences of ``acks``; None when every one said "no responders" (nothing stored). Any other error
        reply raises: all refused, :class:`NatsBridgeError`; some stored, :class:`ReplyLost` (outcome unknown)."""
        ids: list[tuple[int, int]] = []
        refused: list[bytes] = []
        for ack in acks:
            seq = _ack_seq(ack.payload) if not ack.status else None
            if seq is None:
                refused.append(ack.status or ack.payload)
            else:
                ids.append((seq, seq))
        if not refused:
            return ids
        if not ids and all(r == b"503" for r in refused):
            return None
        reason = refused[0].decode(errors="replace")[:200]
        if not ids:
            raise NatsBridgeError(f"JetStream refused the publish: {reason}")
        raise ReplyLost(NatsBridgeError(f"JetStream refused {len(refused)} of {len(acks)} messages: {reason}"))

    # ------------------------------------------------------------------ the relay
    def open_doorbell(self) -> NatsDoorbell:
        conn = self.connect()
        try:
            self.stream_on(conn)
            return NatsDoorbell(conn, self.stream)
        except BaseException:
            conn.close()
            raise

    def seal_key(self) -> bytes | None:
        return None

    def _info(self) -> dict[str, Any]:
        try:
            conn = self.conn()
            info = js.stream_info(conn, self.stream)
            if info is None:
                info = self.ensure_stream(conn)
        except (OSError, NatsProtocolError):
            self.drop_conn()
            raise
        state = info.get("state", {})
        self._newest = int(state.get("last_seq", 0))
        return info

    def history_id(self) -> int:
        return js.history_of(self._info())

    def history_continues(self, seg: Segment, changed: bool, mark: int) -> bool:
        """The segment's message at ``mark`` against the stream's message of that sequence (as on PostgreSQL)."""
        try:
            found = js.get_message(self.conn(), self.stream, mark) if mark > 0 else None
        except (OSError, NatsProtocolError):
            self.drop_conn()
            raise
        if found is None:
            return not changed and self._newest >= mark
        recs = seg.global_backlog(mark - 1, limit=1)
        if not recs or recs[0].global_id != mark:
            return True
        rec = recs[0]
        parts = split_data(found[1])
        if parts is None or parts[0] != backend_name(rec.channel.decode(), rec.site.decode() or None):
            return False
        try:
            return bool(decode_envelope(self._codec, parts[1])[0] == rec.payload)
        except (ValueError, TypeError):
            return True

    def read_after(self, after: int, limit: int) -> Page:
        """Up to ``limit`` messages after ``after`` with the relay's read consumer: ONE request while it stands
        where the read starts (the steady state: a doorbell, a read). The stream's state is read *before* the
        fetch when the consumer is new (its history: the consumer lives and dies with that stream) or the previous
        read found nothing (a purged tail is noticed there): every sequence up to the newest it names that a
        complete fetch does not return is gone."""
        for attempt in range(2):
            reader = self._reader_for(self.conn())
            try:
                if reader.ready_for(after) or self._stale or not self._history:
                    self._history = js.history_of(self._info())
                    self._known = self._newest
                got, complete = reader.read(after, limit)
            except js.ConsumerGone:
                if attempt:
                    raise
                continue  # the stream was deleted (or the consumer): a new consumer, the stream read again
            except (OSError, NatsProtocolError):
                self.drop_conn()
                raise
            break
        rows = []
        for seq, _subject, data in got:
            parts = split_data(data)
            rows.append(Row(seq, seq, parts[0], parts[1]) if parts is not None else Row(seq, seq, "", b"\x00"))
        self._stale = not rows
        # a sequence is drawn when its message is stored: one missing below a row read is gone, and so is one
        # up to the newest read before the fetch when the fetch returned everything after ``after``
        self._gone = max(rows[-1].global_id if rows else 0, self._known if complete else 0)
        if rows:
            self._newest = max(self._newest, rows[-1].global_id)
        return Page(self._history, rows)

    def _reader_for(self, conn: NatsConnection) -> js.PullReader:
        reader = self._reader
        if reader is None or reader.conn is not conn:
            reader = self._reader = js.PullReader(conn, self.stream)
        return reader

    def gone_upto(self) -> int:
        return self._gone

    def settle(self, stop: threading.Event) -> bool:
        return True  # a sequence is drawn when the message is stored: nothing is ever in flight

    def newest_id(self) -> int:
        return self._newest

    def maintain(self, bus: BusHost, position: int, active: dict[str, int]) -> None:
        return None  # the stream's own limits (max_msgs, max_age) trim it

    def fill_backlog(self, bus: BusHost, gap: BacklogGap) -> Backlog | None:
        return None
