"""One AMQP connection over a blocking socket: the handshake, synchronous methods, batched publishes with publisher
confirms, and a stream consumer's deliveries (the frames are :mod:`.amqp`'s).

Every wait has a deadline: a frozen broker raises :class:`socket.timeout` (an ``OSError``), never blocks a
publisher or the relay for the length of the freeze. Whatever the broker closes (the connection, a channel) is
raised as :class:`Closed` with its reply code and text.
"""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from . import amqp

__all__ = ["AmqpConnection", "Closed", "Delivery"]

_READ = 1 << 17  # bytes one read takes at most, into a buffer made once per connection (see ``pump``)


def _keepalive(sock: socket.socket) -> None:
    """TCP keepalives instead of AMQP heartbeats (which a blocking client would have to send from a thread): a
    connection a firewall or NAT dropped while idle is found dead within about a minute, not on the next publish
    (which would then end in ``PublishOutcomeUnknown``)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)):
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


class Closed(Exception):
    """The broker closed the connection (``channel`` 0) or a channel: its reply code and text."""

    def __init__(self, channel: int, code: int, text: str) -> None:
        super().__init__(f"{code} {text}" if code else text)
        self.channel, self.code, self.text = channel, code, text


class Delivery(NamedTuple):
    """A message a consumer received: its channel, delivery tag, stream offset (None: not a stream's) and body."""

    channel: int
    tag: int
    offset: int | None
    body: bytes


class AmqpConnection:
    """A connected, opened AMQP connection (``vhost``), ``timeout`` s for any one wait of the handshake."""

    def __init__(self, host: str, port: int, user: str, password: str, vhost: str, timeout: float) -> None:
        self.reader = amqp.FrameReader()
        self._inbox = memoryview(bytearray(_READ))
        self.frame_max = 131072
        self.closed = False
        self.blocked = False  #: the broker blocked publishers (a resource alarm)
        self.deliveries: list[Delivery] = []  #: received and not yet taken
        self.cancelled: set[int] = set()  #: channels whose consumer the broker cancelled (the queue was deleted)
        self.on_confirm: Callable[[int, int, bool], None] | None = None  #: (tag, multiple, nack)
        self.on_return: Callable[[int, int, str], None] | None = None  #: (channel, code, text)
        self._replies: dict[int, list[amqp.Method]] = {}
        self._content: tuple[Any, ...] | None = None  # the delivery or return whose content is arriving
        self._parts: list[bytes] = []
        self._need = 0
        self.sock = socket.create_connection((host, port), timeout=timeout)
        try:
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            _keepalive(self.sock)
            self._handshake(user, password, vhost, timeout)
        except BaseException:
            self.sock.close()
            raise

    # ------------------------------------------------------------------ set-up
    def _handshake(self, user: str, password: str, vhost: str, timeout: float) -> None:
        self.sock.sendall(amqp.PROTOCOL_HEADER)
        start = self.expect(0, (amqp.CONNECTION_START,), timeout)
        if b"PLAIN" not in start.args[0]:
            raise Closed(0, 0, "the broker offers no PLAIN login")
        caps = {"consumer_cancel_notify": True, "publisher_confirms": True, "basic.nack": True}
        props = {"product": "shmbus", "capabilities": caps}
        response = b"\x00" + user.encode() + b"\x00" + password.encode()
        args = amqp.encode_table(props) + amqp.shortstr("PLAIN") + amqp.longstr(response) + amqp.shortstr("en_US")
        self.sock.sendall(amqp.method_frame(0, amqp.CONNECTION_START_OK, args))
        tune = self.expect(0, (amqp.CONNECTION_TUNE,), timeout)
        channel_max, frame_max, _ = tune.args
        self.frame_max = min(frame_max or 131072, 131072)
        tune_ok = (channel_max or 2047).to_bytes(2, "big") + self.frame_max.to_bytes(4, "big") + b"\x00\x00"
        self.sock.sendall(amqp.method_frame(0, amqp.CONNECTION_TUNE_OK, tune_ok))  # no heartbeats: TCP keepalives
        self.call(0, amqp.CONNECTION_OPEN, amqp.shortstr(vhost) + b"\x00\x00", amqp.CONNECTION_OPEN_OK, timeout)

    def open_channel(self, channel: int, timeout: float, confirms: bool = False) -> None:
        self.call(channel, amqp.CHANNEL_OPEN, b"\x00", amqp.CHANNEL_OPEN_OK, timeout)
        if confirms:
            self.call(channel, amqp.CONFIRM_SELECT, b"\x00", amqp.CONFIRM_SELECT_OK, timeout)

    def close_channel(self, channel: int, timeout: float) -> None:
        """Close ``channel``, dropping what its consumers delivered (the broker sends deliveries until it reads the
        close: they arrive before its close-ok). Left buffered, they were taken for the next consumer's on the
        channel opened again, their tags acknowledged there (an unknown tag: the broker closes that channel)."""
        args = b"\x00\xc8" + amqp.shortstr("bye") + b"\x00\x00\x00\x00"
        self.call(channel, amqp.CHANNEL_CLOSE, args, amqp.CHANNEL_CLOSE_OK, timeout)
        self.deliveries = [d for d in self.deliveries if d.channel != channel]

    # ------------------------------------------------------------------ synchronous methods
    def call(self, channel: int, kind: tuple[int, int], args: bytes, reply: tuple[int, int], timeout: float) -> Any:
        """Send a method and wait for its reply (a :class:`Closed` if the broker refused it instead)."""
        self.sock.sendall(amqp.method_frame(channel, kind, args))
        return self.expect(channel, (reply,), timeout)

    def expect(self, channel: int, kinds: tuple[tuple[int, int], ...], timeout: float) -> amqp.Method:
        deadline = time.monotonic() + timeout
        while True:
            replies = self._replies.get(channel)
            if replies:
                method = replies.pop(0)
                if method.kind in kinds:
                    return method
                continue  # a late reply of an abandoned call
            self.pump(deadline - time.monotonic(), wait=True)

    def declare(self, channel: int, queue: str, arguments: dict[str, object], passive: bool, timeout: float) -> int:
        """``queue.declare`` (durable); the message count it reports."""
        bits = b"\x03" if passive else b"\x02"
        args = b"\x00\x00" + amqp.shortstr(queue) + bits + amqp.encode_table(arguments)
        return int(self.call(channel, amqp.QUEUE_DECLARE, args, amqp.QUEUE_DECLARE_OK, timeout).args[1])

    def delete(self, channel: int, queue: str, timeout: float) -> None:
        self.call(
            channel, amqp.QUEUE_DELETE, b"\x00\x00" + amqp.shortstr(queue) + b"\x00", amqp.QUEUE_DELETE_OK, timeout
        )

    def consume(self, channel: int, queue: str, tag: str, offset: object, prefetch: int, timeout: float) -> None:
        """Consume ``queue`` (a stream) from ``offset`` (an int, ``"first"``, ``"last"``, ``"next"``)."""
        self.call(channel, amqp.BASIC_QOS, b"\x00\x00\x00\x00" + prefetch.to_bytes(2, "big") + b"\x00",
                  amqp.BASIC_QOS_OK, timeout)  # fmt: skip
        args = (
            b"\x00\x00" + amqp.shortstr(queue) + amqp.shortstr(tag) + b"\x00"
            + amqp.encode_table({"x-stream-offset": offset})
        )  # fmt: skip
        self.call(channel, amqp.BASIC_CONSUME, args, amqp.BASIC_CONSUME_OK, timeout)

    def cancel(self, channel: int, tag: str, timeout: float) -> None:
        self.call(channel, amqp.BASIC_CANCEL, amqp.shortstr(tag) + b"\x00", amqp.BASIC_CANCEL_OK, timeout)

    def ack(self, channel: int, tag: int) -> None:
        """Acknowledge every delivery up to ``tag`` (a stream consumer's credit)."""
        self.sock.sendall(amqp.method_frame(channel, amqp.BASIC_ACK, tag.to_bytes(8, "big") + b"\x01"))

    # ------------------------------------------------------------------ reading
    def readable(self) -> bool:
        """Whether the broker sent something (a close while idle, say) that was not read yet."""
        return bool(select.select([self.sock], [], [], 0)[0])

    def pump(self, timeout: float, wait: bool = False) -> bool:
        """Read what arrived within ``timeout`` s and dispatch it; False when nothing did. ``wait``: a timeout
        raises :class:`socket.timeout` (a reply is due)."""
        if timeout <= 0:
            if wait:
                raise TimeoutError("the broker did not answer in time")
            timeout = 0
        if not select.select([self.sock], [], [], timeout)[0]:
            if wait:
                raise TimeoutError("the broker did not answer in time")
            return False
        # into the connection's buffer (128 KiB, kept): ``recv(n)`` allocates n bytes per read, which the kernel
        # maps, then shrinks and unmaps: three system calls more than the read itself on every confirm and delivery
        n = self.sock.recv_into(self._inbox)
        if not n:
            self.closed = True
            raise ConnectionResetError("the broker closed the connection")
        self.reader.feed(self._inbox[:n])
        for kind, channel, payload in self.reader.frames():
            self._dispatch(kind, channel, payload)
        return True

    def _dispatch(self, kind: int, channel: int, payload: bytes) -> None:
        if kind == amqp.BODY:
            self._parts.append(payload)
            self._need -= len(payload)
            if self._need <= 0:
                self._content_done()
            return
        if kind == amqp.HEADER:
            if self._content is None:
                return
            self._need = amqp.body_size(payload)
            if self._content[0] == "deliver":
                self._content = (*self._content, amqp.stream_offset(payload))
            if self._need == 0:
                self._content_done()
            return
        if kind != amqp.METHOD:
            return  # a heartbeat
        method = amqp.parse_method(channel, payload)
        k = method.kind
        if k == amqp.BASIC_DELIVER:
            self._content, self._parts = ("deliver", channel, method.args[1]), []
        elif k == amqp.BASIC_ACK or k == amqp.BASIC_NACK:
            if self.on_confirm is not None:
                self.on_confirm(method.args[0], method.args[1] & 1, k == amqp.BASIC_NACK)
        elif k == amqp.BASIC_RETURN:
            self._content, self._parts = ("return", channel, method.args[0], method.args[1]), []
        elif k == amqp.BASIC_CANCEL:
            self.cancelled.add(channel)
        elif k == amqp.CONNECTION_CLOSE:
            self.closed = True
            self.sock.sendall(amqp.method_frame(0, amqp.CONNECTION_CLOSE_OK))
            raise Closed(0, method.args[0], method.args[1])
        elif k == amqp.CHANNEL_CLOSE:
            self.sock.sendall(amqp.method_frame(channel, amqp.CHANNEL_CLOSE_OK))
            raise Closed(channel, method.args[0], method.args[1])
        elif k == amqp.CONNECTION_BLOCKED or k == amqp.CONNECTION_UNBLOCKED:
            self.blocked = k == amqp.CONNECTION_BLOCKED
        else:
            self._replies.setdefault(channel, []).append(method)

    def _content_done(self) -> None:
        content, self._content = self._content, None
        body = b"".join(self._parts) if len(self._parts) != 1 else self._parts[0]
        self._parts = []
        if content is None:
            return
        if content[0] == "deliver":
            self.deliveries.append(Delivery(content[1], content[2], content[3], body))
        elif self.on_return is not None:
            self.on_return(content[1], content[2], content[3])

    # ------------------------------------------------------------------ end
    def close(self, timeout: float = 1.0) -> None:
        """Close politely when the broker answers quickly, else just drop the socket."""
        if not self.closed:
            self.closed = True
            try:
                self.sock.settimeout(timeout)
                args = b"\x00\xc8" + amqp.shortstr("bye") + b"\x00\x00\x00\x00"
                self.sock.sendall(amqp.method_frame(0, amqp.CONNECTION_CLOSE, args))
            except OSError:
                pass
        try:
            self.sock.close()
        except OSError:
            pass

    def abandon(self) -> None:
        """In a forked child: forget the parent's socket without closing it (it is the parent's)."""
        self.closed = True
