"""The gem's wire format, once for every bridge: the line ``gid|cid|chan|envelope`` and the envelope
``{"data","user_ids","group_ids","client_ids"}``.

message_bus writes these bytes into Redis (its backlogs and PUBLISH) and into PostgreSQL (the ``message_bus``
table's ``value`` and ``pg_notify``); the bridges write and read them the same way so a Ruby app and a Python app
share a bus, and the relay's seals cover these very lines (:mod:`.seals`). Where each backend keeps them (Redis key
names, SQL) is the backend's own (``redis/layout.py``, ``postgres/sql.py``).
"""

from __future__ import annotations

from shmbus import jsonlib
from shmbus.codecs import Codec
from shmbus.message import decode_meta, encode_meta

from .rows import Row

__all__ = [
    "MAX_ID",
    "PIPE_ESCAPE",
    "decode_envelope",
    "encode_envelope",
    "format_line",
    "line_tail",
    "parse_id",
    "parse_line",
    "required_line",
    "unescape_channel",
]

PIPE_ESCAPE = "$$123$$"  #: the gem's escape of a ``|`` in a channel name (in lines only)
_PIPE_ESCAPE = PIPE_ESCAPE.encode()
MAX_ID = (1 << 63) - 1  #: the largest id a backend gives (a signed 64-bit column, Redis's INCR)
_ID_DIGITS = len(str(MAX_ID))  # 19

_NULL_TARGETS = b',"user_ids":null,"group_ids":null,"client_ids":null}'
_DATA_HEAD = b'{"data":'


def parse_id(text: bytes) -> int | None:
    """An id as the backends write it in a line or a notice: 1 to 19 ASCII digits, 1 to :data:`MAX_ID`; None for
    anything else. Notices come from anyone who may notify, and ``int`` takes far more than ids: signs, spaces,
    underscores, and thousands of digits (quadratic to convert; past 4,300 digits a ``ValueError`` that would
    end the relay's connection)."""
    if 0 < len(text) <= _ID_DIGITS and text.isdigit():  # bytes.isdigit: ASCII digits only
        value = int(text)
        return value if 0 < value <= MAX_ID else None
    return None


def unescape_channel(raw: bytes) -> str:
    """A line's channel field as the backend's channel name (``|`` travels as ``$$123$$``); UnicodeDecodeError for
    one that is not UTF-8."""
    return raw.replace(_PIPE_ESCAPE, b"|").decode()


def parse_line(line: bytes) -> Row | None:
    """The gem's line ``gid|cid|chan|envelope`` as a row (``channel``: the backend's name, the site suffix
    included; ``value``: the envelope, everything after the third ``|``); None if it is no such line or carries no
    envelope (a PostgreSQL notice too long to carry it). One ``split`` (the relay parses every sealed line on its
    wake-up path: 40% less than three ``index`` calls and four slices)."""
    try:
        gid, cid, chan, envelope = line.split(b"|", 3)
        global_id, message_id = parse_id(gid), parse_id(cid)
        if global_id is None or message_id is None or not envelope:
            return None
        return Row(global_id, message_id, unescape_channel(chan), envelope)
    except ValueError:  # too few fields; UnicodeDecodeError is one
        return None


def required_line(line: bytes) -> Row:
    """:func:`parse_line` for a line read from the backend's own history, where a malformed one is a fault to
    report (``ValueError``), never a message to pass over."""
    row = parse_line(line)
    if row is None:
        raise ValueError(f"not a message_bus line: {bytes(line[:80])!r}")
    return row


def line_tail(chan: str, envelope: bytes) -> bytes:
    """``chan|envelope`` (the publish code prepends ``gid|cid|``); a ``|`` in the channel travels as ``$$123$$``."""
    return chan.replace("|", PIPE_ESCAPE).encode() + b"|" + envelope


def format_line(global_id: int, message_id: int, chan: str, envelope: bytes) -> bytes:
    """The whole line, as the backends' publish code writes it."""
    return b"%d|%d|" % (global_id, message_id) + line_tail(chan, envelope)


def encode_envelope(codec: Codec, payload: bytes, meta: bytes) -> bytes:
    """``{"data","user_ids","group_ids","client_ids"}`` in the bus's codec; JSON splices ``payload`` as is."""
    if codec.is_json:
        if not meta:
            return _DATA_HEAD + payload + _NULL_TARGETS
        c, u, g = decode_meta(meta)
        return b"".join(
            (
                _DATA_HEAD,
                payload,
                b',"user_ids":',
                jsonlib.dumps(u),
                b',"group_ids":',
                jsonlib.dumps(g),
                b',"client_ids":',
                jsonlib.dumps(c),
                b"}",
            )
        )
    c, u, g = decode_meta(meta)
    return codec.encode({"data": codec.decode(payload), "user_ids": u, "group_ids": g, "client_ids": c})


def decode_envelope(codec: Codec, env: bytes) -> tuple[bytes, bytes]:
    """Envelope bytes -> ``(payload, meta)`` as the segment stores them (inverse of :func:`encode_envelope`).

    A JSON envelope with no targeting is sliced, not parsed: the common case costs no decode.
    """
    if codec.is_json:
        if env.startswith(_DATA_HEAD) and env.endswith(_NULL_TARGETS):
            return env[len(_DATA_HEAD) : -len(_NULL_TARGETS)], b""
        obj = jsonlib.loads(env)
    else:
        obj = codec.decode(env)
    if not isinstance(obj, dict) or "data" not in obj:
        raise ValueError("not a message_bus envelope (no 'data' key)")
    meta = encode_meta(obj.get("client_ids"), obj.get("user_ids"), obj.get("group_ids"))
    return codec.encode(obj["data"]), meta
