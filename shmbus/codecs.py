"""Codecs turn published data into bytes stored in the segment and back.

The default is JSON (orjson when installed, else the standard library), which the HTTP protocol can splice into
responses without decoding. ``MsgpackCodec`` is smaller for binary-heavy data. A codec is any object with
``name``, ``encode(obj) -> bytes`` and ``decode(bytes) -> obj``; every process attached to one bus must use the
same codec, so the codec name is recorded in the segment header and checked on attach.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import msgpack

from . import jsonlib

__all__ = ["Codec", "JsonCodec", "MsgpackCodec", "get_codec"]


@runtime_checkable
class Codec(Protocol):
    name: str
    #: True when ``encode`` output is JSON text, so HTTP responses can embed it verbatim.
    is_json: bool

    def encode(self, obj: Any) -> bytes: ...

    def decode(self, data: bytes) -> Any: ...


class JsonCodec:
    """JSON (orjson when installed, see :mod:`shmbus.jsonlib`). Values JSON cannot hold raise ``TypeError``."""

    name = "json"
    is_json = True

    def __init__(self) -> None:
        # instance attributes: one call, not two, on the publish path
        self.encode: Callable[[Any], bytes] = jsonlib.dumps
        self.decode: Callable[[bytes], Any] = jsonlib.loads


class MsgpackCodec:
    """msgpack: compact, binary-safe (``bytes`` round-trip)."""

    name = "msgpack"
    is_json = False

    def encode(self, obj: Any) -> bytes:
        packed: bytes = msgpack.packb(obj, use_bin_type=True)
        return packed

    def decode(self, data: bytes) -> Any:
        return msgpack.unpackb(data, raw=False, strict_map_key=False)


_CODECS = {"json": JsonCodec, "msgpack": MsgpackCodec}


def get_codec(codec: str | Codec | None) -> Codec:
    """Resolve a codec name (``"json"``, ``"msgpack"``) or instance; ``None`` means JSON."""
    if codec is None:
        return JsonCodec()
    if isinstance(codec, str):
        try:
            return _CODECS[codec]()  # type: ignore[return-value]
        except KeyError:
            raise ValueError(f"unknown codec {codec!r}; known: {sorted(_CODECS)}") from None
    if not isinstance(codec, Codec):
        raise TypeError(f"codec must have name, is_json, encode and decode; got {codec!r}")
    return codec
