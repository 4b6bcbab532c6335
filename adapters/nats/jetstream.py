"""The JetStream calls the bridge makes, over one :class:`~.client.NatsConnection`: its API is JSON requests on
``$JS.API.*`` subjects.

* :func:`stream_info` / :func:`ensure_stream`: the stream (created with the bridge's retention where missing); its
  ``created`` time names the history (:func:`history_of`): deleting and recreating the stream changes it, a purge or
  a restart does not.
* :func:`get_message`: one message by sequence (the relay's history check).
* :class:`PullReader`: the relay's reads after a position: a pull consumer of its own (no acks, in memory, removed by
  the server when idle) fetched with ``no_wait``; each delivered message's reply subject carries its stream
  sequence. A read that starts elsewhere than where the consumer stands makes a new consumer. While the consumer
  exists its stream is the one it was made on: the stream's identity needs no request per read.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from typing import Any

from .client import NatsConnection
from .errors import NatsBridgeError, NatsUnavailable
from .protocol import pub_op

__all__ = [
    "ConsumerGone",
    "JsError",
    "ack_time",
    "PullReader",
    "api",
    "ensure_stream",
    "get_message",
    "history_of",
    "stream_info",
]

NOT_FOUND_STREAM = 10059
NOT_FOUND_MESSAGE = 10037


class ConsumerGone(Exception):
    """The relay's read consumer no longer exists (deleted with its stream, or by an operator)."""


class JsError(NatsBridgeError):
    """JetStream answered a request with an error (``code``: HTTP-like, ``err_code``: JetStream's own)."""

    def __init__(self, description: str, code: int, err_code: int) -> None:
        super().__init__(f"JetStream: {description} (code {code}, err_code {err_code})")
        self.code, self.err_code = code, err_code


def api(conn: NatsConnection, op: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """One JetStream API request; a JSON error raises :class:`JsError`, no responder :class:`NatsUnavailable`."""
    msg = conn.request(b"$JS.API." + op.encode(), json.dumps(body).encode() if body is not None else b"")
    if msg.status == b"503":
        raise NatsUnavailable("JetStream is not enabled on this NATS server (no responder for its API)")
    out: dict[str, Any] = json.loads(msg.payload)
    err = out.get("error")
    if err:
        raise JsError(f"{op}: {err.get('description')}", int(err.get("code", 0)), int(err.get("err_code", 0)))
    return out


def history_of(info: dict[str, Any]) -> int:
    """The stream's history identity: its creation time (and name) hashed to 63 bits, never 0."""
    raw = f"{info.get('config', {}).get('name')}|{info.get('created')}".encode()
    return (int.from_bytes(hashlib.sha256(raw).digest()[:8], "big") & ((1 << 63) - 1)) or 1


def stream_info(conn: NatsConnection, stream: str) -> dict[str, Any] | None:
    """The stream's info (config, created, state), or None where it does not exist."""
    try:
        return api(conn, f"STREAM.INFO.{stream}")
    except JsError as exc:
        if exc.err_code == NOT_FOUND_STREAM or exc.code == 404:
            return None
        raise


def ensure_stream(conn: NatsConnection, config: dict[str, Any]) -> dict[str, Any]:
    """The stream's info, creating it with ``config`` where missing (two hosts creating it at once: one wins, the
    other finds it)."""
    info = stream_info(conn, config["name"])
    if info is not None:
        return info
    refused: JsError | None = None
    try:
        api(conn, f"STREAM.CREATE.{config['name']}", config)
    except JsError as exc:
        refused = exc  # another host made it first, or the server refused the config (then there is none)
    info = stream_info(conn, config["name"])  # as stored: its ``created`` is the history every host names
    if info is None:
        raise refused or JsError(f"stream {config['name']!r} is gone again", 404, NOT_FOUND_STREAM)
    return info


def get_message(conn: NatsConnection, stream: str, seq: int) -> tuple[str, bytes] | None:
    """Message ``seq`` of the stream: ``(subject, data)``, or None where the stream no longer holds it."""
    try:
        out = api(conn, f"STREAM.MSG.GET.{stream}", {"seq": seq})
    except JsError as exc:
        if exc.err_code == NOT_FOUND_MESSAGE or exc.code == 404:
            return None
        raise
    message = out["message"]
    return str(message["subject"]), base64.b64decode(message.get("data") or b"")


def ack_sequence(reply: bytes) -> int | None:
    """The stream sequence in a delivered message's reply subject ``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.
    <dseq>.<ts>.<pending>`` (or the longer form with domain and account); None for anything else (a forged
    delivery)."""
    parts = reply.split(b".")
    n = len(parts)
    if n < 9 or parts[0] != b"$JS" or parts[1] != b"ACK":
        return None
    field = parts[5] if n == 9 else parts[-4] if n >= 12 else None
    if field is None or not field.isdigit() or len(field) > 19:
        return None
    return int(field)


def ack_time(reply: bytes) -> float | None:
    """The stream's timestamp (epoch seconds) in a delivered message's reply subject (see :func:`ack_sequence`)."""
    parts = reply.split(b".")
    field = parts[7] if len(parts) == 9 else parts[-2] if len(parts) >= 12 else b""
    return int(field) / 1e9 if field.isdigit() and len(field) <= 20 else None


class PullReader:
    """The relay's reads after a position (see the module doc); one per relay connection."""

    def __init__(self, conn: NatsConnection, stream: str, filter_subject: str = "") -> None:
        self.conn = conn
        self.stream = stream
        self.filter_subject = filter_subject  #: one channel's subject (the Spark reader); "": the whole stream
        self.consumer: str | None = None
        self.next_seq = 0  # the first sequence the consumer will deliver

    def _create(self, start: int) -> None:
        self._delete()
        config: dict[str, Any] = {
            "deliver_policy": "by_start_sequence",
            "opt_start_seq": max(1, start),
            "ack_policy": "none",
            "mem_storage": True,
            "inactive_threshold": 30_000_000_000,  # ns: a relay gone for 30 s leaves nothing behind
            "max_batch": 0,
        }
        if self.filter_subject:
            config["filter_subject"] = self.filter_subject
        out = api(self.conn, f"CONSUMER.CREATE.{self.stream}", {"stream_name": self.stream, "config": config})
        self.consumer = str(out["name"])
        self.next_seq = max(1, start)

    def _delete(self) -> None:
        name, self.consumer = self.consumer, None
        if name is not None:
            try:
                api(self.conn, f"CONSUMER.DELETE.{self.stream}.{name}")
            except (JsError, NatsUnavailable):
                pass

    def ready_for(self, after: int) -> bool:
        """Make the consumer a read after ``after`` needs, where the current one cannot serve it; True if it made
        one (its stream's identity is then read again: :meth:`read` proves the stream is the one it was made on)."""
        if self.consumer is not None and after + 1 >= self.next_seq:
            return False
        self._create(after + 1)
        return True

    def read(self, after: int, limit: int) -> tuple[list[tuple[int, bytes, bytes]], bool]:
        """Up to ``limit`` messages with sequences above ``after``, ascending, ``(seq, reply subject, data)`` (the
        reply subject carries the stream's timestamp: :func:`ack_time`), and whether
        the read ended because the stream had no more (not because ``limit`` were read). Raises
        :class:`ConsumerGone` when the consumer no longer exists (its stream was deleted, or it was)."""
        if self.consumer is None:
            raise ConsumerGone("no consumer")
        conn = self.conn
        _first, (reply,) = conn.reply_subjects(1)
        body = b'{"batch":%d,"no_wait":true}' % limit
        subject = f"$JS.API.CONSUMER.MSG.NEXT.{self.stream}.{self.consumer}".encode()
        conn.send(pub_op(subject, reply, body))
        out: list[tuple[int, bytes, bytes]] = []
        got = 0
        deadline = time.monotonic() + conn.timeout
        mine = b"$JS.ACK.%s.%s." % (self.stream.encode(), self.consumer.encode())
        while got < limit:
            for msg in conn.pump(deadline):
                if msg.subject == reply:  # the fetch's own status: no (more) messages, request ended, gone
                    if msg.status in (b"503", b"409"):  # no responder: no such consumer; 409: deleted
                        self.consumer = None
                        raise ConsumerGone(msg.headers.decode(errors="replace").strip())
                    if msg.status != b"100":
                        return out, True
                    continue
                if not msg.reply.startswith(mine):
                    continue  # a reply to an abandoned request, a delivery of an earlier consumer
                seq = ack_sequence(msg.reply)
                if seq is None:
                    continue
                got += 1
                self.next_seq = seq + 1
                if seq > after:
                    out.append((seq, msg.reply, msg.payload))
        return out, False

    def close(self) -> None:
        self._delete()
