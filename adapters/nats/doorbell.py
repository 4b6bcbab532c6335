"""The NATS relay's doorbell: a push consumer of the stream, headers only, delivering from its creation on.

Each delivery's reply subject carries the message's stream sequence (:func:`~.jetstream.ack_sequence`): the
ring's ``top``, a hint only. Anyone who may publish to the delivery subject can ring it with any sequence; it
costs one read of the stream, never a stored message (deliveries bring no lines, so nothing is sealed). The
consumer is the server's: deleting the stream deletes it, so :meth:`NatsDoorbell.keepalive` checks it is there and
raises otherwise (the relay then opens a new doorbell, making the stream again where it must).
"""

from __future__ import annotations

import secrets

from ..bridge.backend import DoorbellRing
from ..bridge.seals import NO_RING
from . import jetstream as js
from .client import NatsConnection
from .protocol import sub_op

__all__ = ["NatsDoorbell"]

_SID = b"2"


class NatsDoorbell:
    """One relay's push consumer (see the module doc), on a connection of its own."""

    def __init__(self, conn: NatsConnection, stream: str) -> None:
        self.conn = conn
        self.stream = stream
        self.deliver = b"_SHMBUS_BELL.%s.%s" % (stream.encode(), secrets.token_hex(8).encode())
        conn.send(sub_op(self.deliver, 2))
        config = {
            "deliver_subject": self.deliver.decode(),
            "deliver_policy": "new",
            "ack_policy": "none",
            "headers_only": True,
            "mem_storage": True,
            "flow_control": False,
        }
        out = js.api(conn, f"CONSUMER.CREATE.{stream}", {"stream_name": stream, "config": config})
        self.consumer = str(out["name"])

    def ring(self, timeout: float) -> DoorbellRing:
        top = 0
        seen = False
        for msg in self.conn.read_messages(timeout):
            if msg.sid != _SID:
                continue
            seen = True
            seq = js.ack_sequence(msg.reply)
            if seq is not None and seq > top:
                top = seq
        if not seen:
            return NO_RING
        return DoorbellRing(top, [], {}) if top else NO_RING

    def keepalive(self) -> None:
        """The connection answers, and the consumer is still there (a deleted stream took it along)."""
        js.api(self.conn, f"CONSUMER.INFO.{self.stream}.{self.consumer}")

    def close(self) -> None:
        self.conn.close()
