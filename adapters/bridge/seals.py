"""Sealed notices: the backend itself vouches for a notice, so the relay may store it without reading it back.

Every notice stays a doorbell (:mod:`.relay`) unless it is *sealed*: the backend's own publish code (the Redis
script, the PostgreSQL procedure) sends, next to the gem's line ``gid|cid|chan|envelope``, a seal ``gid|mac`` on a
channel of its own, where ``mac = H(key + H(key + history + "|" + line))`` in hex: ``key`` is a per-bus secret the
backend keeps where only the bus's writers can read it (a Redis key, a PostgreSQL table without grants), ``history``
the identity of the backend's history the line was written in, ``H`` a hash the backend has (``sha1`` in Redis's
Lua, ``sha256`` in PostgreSQL). Whoever can only notify (a pub/sub-only Redis user, a PostgreSQL role with CONNECT)
cannot seal; a seal names one line of one history, so a replayed one can repeat only the truth of that id.

The relay stores a sealed line only when it is the very next id after its position and the segment records the
history it was sealed in; anything else (an unsealed line, a gap, another history) falls back to the history read.
"""

from __future__ import annotations

import hashlib
import hmac

from .rows import Ring, Row

__all__ = ["NO_RING", "mac", "parse_line", "seal_of", "sealed_rows"]

NO_RING = Ring(0, [], {})  #: a wait that brought nothing
PIPE_ESCAPE = b"$$123$$"  # the gem's escape of a ``|`` in a channel name


_HASHES = {"sha1": hashlib.sha1, "sha256": hashlib.sha256}  # the backends' hashes (hashlib.new looks names up)


def mac(hash_name: str, key: bytes, history: int, line: bytes) -> bytes:
    """The seal of ``line`` written in ``history`` (hex, as the backend's own code computes it)."""
    h = _HASHES[hash_name]
    inner = h(b"%s%d|%s" % (key, history, line)).hexdigest().encode()
    return h(key + inner).hexdigest().encode()


def parse_line(line: bytes) -> Row | None:
    """The gem's line ``gid|cid|chan|envelope`` as a row; None if it is no such line or carries no envelope (a
    PostgreSQL notice too long to carry it)."""
    try:
        i1 = line.index(b"|")
        i2 = line.index(b"|", i1 + 1)
        i3 = line.index(b"|", i2 + 1)
        gid, cid = int(line[:i1]), int(line[i1 + 1 : i2])
        chan = line[i2 + 1 : i3].replace(PIPE_ESCAPE, b"|").decode()
    except ValueError:  # UnicodeDecodeError is one
        return None
    envelope = line[i3 + 1 :]
    return Row(gid, cid, chan, envelope) if envelope else None


def seal_of(payload: bytes) -> tuple[int, bytes] | None:
    """A seal notice ``gid|mac`` -> ``(gid, mac)``; None if malformed."""
    gid, bar, tag = payload.partition(b"|")
    try:
        return (int(gid), tag) if bar and tag else None
    except ValueError:
        return None


def sealed_rows(ring: Ring, hash_name: str, key: bytes, history: int, after: int) -> list[Row]:
    """The lines of ``ring`` with ids above ``after`` whose seal verifies for ``history``, as rows in id order (each
    id once; lines at or below ``after`` are not even verified)."""
    rows: dict[int, Row] = {}
    for line in ring.lines:
        row = parse_line(line)
        if row is None or row.global_id <= after or row.global_id in rows:
            continue
        tag = ring.seals.get(row.global_id)
        if tag is not None and hmac.compare_digest(tag, mac(hash_name, key, history, line)):
            rows[row.global_id] = row
    return [rows[g] for g in sorted(rows)]
