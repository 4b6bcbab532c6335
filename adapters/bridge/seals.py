"""Sealed notices: the backend itself vouches for its notices, so the relay may store them without reading back.

Every notice stays a doorbell (:mod:`.relay`) unless it is *sealed*: the backend's own publish code (the Redis
scripts, the PostgreSQL procedures) sends, after the gem's lines ``gid|cid|chan|envelope`` of one run of consecutive
ids, ONE seal ``first|last|mac`` on a channel of its own, where ``mac = H(key + H(key + history + "|" + body))`` in
hex and ``body`` is every line of the run, in id order, each as ``len|line`` (its length in bytes first, so no two
ways of cutting the same bytes into lines seal alike): ``key`` is a per-bus secret the backend keeps where only the
bus's writers can read it (a Redis key, a PostgreSQL table without grants), ``history`` the identity of the
backend's history the lines were written in, ``H`` a hash the backend has (``sha1`` in Redis's Lua, ``sha256`` in
PostgreSQL). Whoever can only notify (a pub/sub-only Redis user, a PostgreSQL role with CONNECT) cannot seal; a seal
names one run of one history, so a replayed one can repeat only the truth of those ids.

The relay stores a sealed run only when it has every line of it, the seal verifies for the history the segment
records, and the run continues its position; anything else (an unsealed line, a missing line, a gap, another
history) falls back to the history read.
"""

from __future__ import annotations

import hashlib
import hmac
import importlib
from collections.abc import Callable
from typing import Protocol

from .rows import DoorbellRing, Row
from .wire import parse_id, parse_line

__all__ = ["NO_RING", "Sealer", "mac", "seal_of", "sealed_rows"]

NO_RING = DoorbellRing(0, [], {})  #: a wait that brought nothing
_MAC_MAX = 128  # bytes of a seal's mac (sha1: 40 hex digits, sha256: 64); anything longer is no seal


_HASHES = {"sha1": hashlib.sha1, "sha256": hashlib.sha256}  # the backends' hashes (hashlib.new looks names up)


class _Hash(Protocol):
    def copy(self) -> _Hash: ...
    def update(self, data: bytes, /) -> None: ...
    def hexdigest(self) -> str: ...


def _own_hashes() -> dict[str, Callable[[bytes], _Hash]]:
    """CPython's own SHA code where it has it, else hashlib's: the relay hashes one small run per wake-up with cold
    caches, where OpenSSL's per-object set-up (a context copied, a provider's code) costs about twice as much
    (median 38 against 24 µs per seal after a 2 ms sleep, 1 against 1.8 µs in a warm loop)."""
    own: dict[str, Callable[[bytes], _Hash]] = dict(_HASHES)
    for name, modules in (("sha1", ("_sha1",)), ("sha256", ("_sha2", "_sha256"))):
        for module in modules:
            try:
                own[name] = getattr(importlib.import_module(module), name)
                break
            except (ImportError, AttributeError):
                continue
    return own


_OWN_HASHES = _own_hashes()


def body_of(lines: list[bytes]) -> bytes:
    """What a seal covers: each line as ``len|line``, in id order."""
    return b"".join([b"%d|%s" % (len(line), line) for line in lines])


def mac(hash_name: str, key: bytes, history: int, lines: list[bytes]) -> bytes:
    """The seal of the run ``lines`` (consecutive ids, in order) written in ``history`` (hex, as the backend's own
    code computes it)."""
    h = _HASHES[hash_name]
    inner = h(b"%s%d|%s" % (key, history, body_of(lines))).hexdigest().encode()
    return h(key + inner).hexdigest().encode()


class Sealer:
    """:func:`mac` for one key and history, with both prefixes hashed once (the relay verifies every burst)."""

    def __init__(self, hash_name: str, key: bytes, history: int) -> None:
        h = _OWN_HASHES[hash_name]
        self.key, self.history = key, history
        self._inner = h(b"%s%d|" % (key, history))
        self._outer = h(key)

    def mac(self, lines: list[bytes]) -> bytes:
        inner = self._inner.copy()
        inner.update(body_of(lines))
        outer = self._outer.copy()
        outer.update(inner.hexdigest().encode())
        return outer.hexdigest().encode()


def seal_of(payload: bytes) -> tuple[int, int, bytes] | None:
    """A seal notice ``first|last|mac`` -> ``(first, last, mac)``; None if malformed (ids as :func:`.wire.parse_id`
    reads them, ``first <= last``, a mac of at most 128 bytes). How many ids the run may name is the ring's to
    say (:func:`sealed_rows`): a seal is anyone's words until it verifies."""
    parts = payload.split(b"|", 2)
    if len(parts) != 3 or not 0 < len(parts[2]) <= _MAC_MAX:
        return None
    first, last = parse_id(parts[0]), parse_id(parts[1])
    return (first, last, parts[2]) if first is not None and last is not None and first <= last else None


def _by_id(lines: list[bytes]) -> dict[int, bytes]:
    """The ring's lines by their id (a later line with the same id replaces an earlier one: a forged twin then
    fails the seal, and the read decides)."""
    out: dict[int, bytes] = {}
    for line in lines:
        gid = parse_id(line.partition(b"|")[0])
        if gid is not None:
            out[gid] = line
    return out


def sealed_rows(ring: DoorbellRing, sealer: Sealer, after: int) -> list[Row]:
    """The rows after ``after`` that the sealed runs of ``ring`` vouch for, in id order, continuing ``after`` one id
    after another; it stops before a gap, a run with a line missing, or a seal that does not verify (the read
    decides the rest). Lines at or below ``after`` are not verified.

    The ids a seal names are anyone's words until its mac verifies, so nothing here is proportional to them: a run
    of more ids than the ring brought lines cannot be whole and is passed over before it is looked at, which bounds
    the work by the ring's own size (at most one mac computed over at most every line, plus a sort of the seals)."""
    rows: list[Row] = []
    seals = ring.seals
    if not seals:
        return rows
    by_id: dict[int, bytes] | None = None
    pos = after
    for first in sorted(seals) if len(seals) > 1 else seals:
        last, tag = seals[first]
        if last <= pos:
            continue  # stored already (or landed by its publisher): nothing to verify
        if first > pos + 1:
            break  # a gap before this run
        if last - first >= len(ring.lines):
            continue  # more ids than the ring has lines: never whole (a forged ``1|99999999999|..``): no seal at all
        if len(seals) == 1 and len(ring.lines) == last - first + 1:
            run = ring.lines  # the common wake-up: one run, its lines as the publish code sent them (in id order)
        else:
            by_id = by_id or _by_id(ring.lines)
            run = [line for line in (by_id.get(g) for g in range(first, last + 1)) if line is not None]
        if len(run) != last - first + 1 or not hmac.compare_digest(tag, sealer.mac(run)):
            break
        for line in run[pos + 1 - first :]:
            row = parse_line(line)
            if row is None or row.global_id != pos + 1:  # the ids are part of what is sealed: never for a true seal
                return rows
            rows.append(row)
            pos += 1
    return rows
