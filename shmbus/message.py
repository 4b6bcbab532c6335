"""The message type handed to subscribers and returned by backlog reads."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import msgpack

from .codecs import Codec

__all__ = ["Message", "decode_meta", "encode_meta", "messages_of_rows"]

_EMPTY: tuple[list[Any] | None, list[Any] | None, list[Any] | None] = (None, None, None)


def encode_meta(client_ids: list[Any] | None, user_ids: list[Any] | None, group_ids: list[Any] | None) -> bytes:
    """Targeting lists as stored next to the payload (empty bytes when the message targets everyone)."""
    if client_ids is None and user_ids is None and group_ids is None:
        return b""
    packed: bytes = msgpack.packb((client_ids, user_ids, group_ids), use_bin_type=True)
    return packed


def decode_meta(meta: bytes) -> tuple[list[Any] | None, list[Any] | None, list[Any] | None]:
    if not meta:
        return _EMPTY
    c, u, g = msgpack.unpackb(meta, raw=False)
    return c, u, g


class Message:
    """One message: ids, channel (without the site suffix), site, targeting, and the decoded ``data``.

    ``data`` is decoded lazily from ``raw`` (the codec's bytes), so code that only forwards messages (the HTTP
    adapter with the JSON codec) never pays for decoding.
    """

    __slots__ = (
        "_codec",
        "_data",
        "_meta",
        "_targets",
        "channel",
        "epoch",
        "global_id",
        "message_id",
        "raw",
        "site_id",
        "timestamp",
    )

    def __init__(
        self,
        global_id: int,
        message_id: int,
        channel: str,
        raw: bytes,
        codec: Codec,
        *,
        site_id: str | None = None,
        meta: bytes = b"",
        timestamp: float = 0.0,
        epoch: int = 0,
    ) -> None:
        self.global_id = global_id
        self.message_id = message_id
        self.channel = channel
        self.raw = raw
        self.site_id = site_id
        self.timestamp = timestamp
        self.epoch = epoch
        self._codec = codec
        self._meta = meta
        self._targets: tuple[Any, Any, Any] | None = None
        self._data: Any = _UNSET

    @property
    def data(self) -> Any:
        if self._data is _UNSET:
            self._data = self._codec.decode(self.raw)
        return self._data

    def _decoded_targets(self) -> tuple[list[Any] | None, list[Any] | None, list[Any] | None]:
        if self._targets is None:
            self._targets = decode_meta(self._meta)
        return self._targets

    @property
    def client_ids(self) -> list[Any] | None:
        return self._decoded_targets()[0]

    @property
    def user_ids(self) -> list[Any] | None:
        return self._decoded_targets()[1]

    @property
    def group_ids(self) -> list[Any] | None:
        return self._decoded_targets()[2]

    @property
    def targeted(self) -> bool:
        """True when the message carries client, user or group targeting."""
        return bool(self._meta)

    @property
    def meta(self) -> bytes:
        return self._meta

    def to_dict(self) -> dict[str, Any]:
        """The four keys message_bus sends to HTTP clients."""
        return {"global_id": self.global_id, "message_id": self.message_id, "channel": self.channel, "data": self.data}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Message):
            return NotImplemented
        return (self.global_id, self.message_id, self.channel, self.site_id, self.raw) == (
            other.global_id,
            other.message_id,
            other.channel,
            other.site_id,
            other.raw,
        )

    def __hash__(self) -> int:
        return hash((self.global_id, self.message_id, self.channel))

    def __repr__(self) -> str:
        site = f", site_id={self.site_id!r}" if self.site_id else ""
        return (
            f"Message(global_id={self.global_id}, message_id={self.message_id}, channel={self.channel!r}, "
            f"data={self.data!r}{site})"
        )


class _Unset:
    __slots__ = ()


_UNSET: Any = _Unset()
_new = object.__new__


def messages_of_rows(
    rows: Iterable[tuple[int, int, int, float, bytes, bytes, bytes, bytes]],
    codec: Codec,
    epoch: int,
    names: dict[bytes, str],
    name_of: Callable[[bytes], str],
) -> list[Message]:
    """Messages of records as the segment reads them (``Segment.read_rows``: position, global id, message id,
    timestamp, channel, site, meta, payload), in one loop: the listener's decode of each batch.

    Each message is made without a call to :meth:`Message.__init__` (in CPython 3.11 a class call with keywords
    costs more than all the stores it makes), so this sets the same slots as ``__init__`` does, and must be kept in
    step with it. Channel names are decoded once per process: ``names`` caches them, ``name_of`` decodes (and
    caches) one not cached yet.
    """
    out: list[Message] = []
    append = out.append
    for _pos, gid, mid, ts, channel, site, meta, payload in rows:
        msg = _new(Message)
        msg.global_id = gid
        msg.message_id = mid
        name = names.get(channel)
        msg.channel = name if name is not None else name_of(channel)
        msg.raw = payload
        msg.site_id = site.decode() if site else None
        msg.timestamp = ts
        msg.epoch = epoch
        msg._codec = codec
        msg._meta = meta
        msg._targets = None
        msg._data = _UNSET
        append(msg)
    return out
