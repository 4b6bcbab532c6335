"""What a segment records about the bridge that assigns its ids: the engine kind and backend (``FLAG_BRIDGED`` and
the bridge record), the backend history it holds, and the chain barrier that makes a bridge's loss a visible gap.

A process that attaches a bridged segment learns from it which engine its publishes must go through (the bus
refuses a local id otherwise), and the relay knows which backend history the segment holds without trusting its
own memory, so every relay of the host, past and future, compares against the same thing.
"""

from __future__ import annotations

import json
from typing import NamedTuple

from .layout import _BRIDGE_MAX, _OFF_BRIDGE, _Q_CHAIN_BARRIER, _Q_FLAGS, _Q_GID, _Q_HISTORY, _U32, FLAG_BRIDGED
from .locking import Locking

__all__ = ["BridgeRecord", "Bridging"]


class BridgeRecord(NamedTuple):
    """The engine a bridged segment's publishes must go through: ``kind`` (``"redis"``, ``"postgres"``), ``url``
    (the backend without its password), ``secret``: the real URL carries a password (so ``url`` alone cannot
    connect), ``options``: the engine's options that decide where messages go (e.g. the notify channel)."""

    kind: str
    url: str
    secret: bool
    options: dict[str, str]


class Bridging(Locking):
    """Part of :class:`~shmbus.segment.Segment`: the bridge record, the history identity, the chain barrier."""

    def mark_bridged(self, record: BridgeRecord, *, sparse_ids: bool = False) -> None:
        """Record the bridge (under the lock; the newest bridge's record wins) and set ``FLAG_BRIDGED`` (and
        ``FLAG_SPARSE_IDS``): from now on an append without imposed ids raises :class:`BusBridged`."""
        from .layout import FLAG_SPARSE_IDS

        text = json.dumps(
            {"kind": record.kind, "url": record.url, "secret": record.secret, "options": record.options},
            separators=(",", ":"),
        ).encode()
        if len(text) > _BRIDGE_MAX:
            raise ValueError(f"bridge record is {len(text)} bytes; at most {_BRIDGE_MAX} fit in the header")
        try:
            self._lock()
            if self.bridge() != record:
                _U32.pack_into(self.mm, _OFF_BRIDGE, 0)
                self.mm[_OFF_BRIDGE + 4 : _OFF_BRIDGE + 4 + len(text)] = text
                _U32.pack_into(self.mm, _OFF_BRIDGE, len(text))
            self._u64[_Q_FLAGS] |= FLAG_BRIDGED | (FLAG_SPARSE_IDS if sparse_ids else 0)
        finally:
            self._unlock()

    @property
    def bridged(self) -> bool:
        return bool(self._u64[_Q_FLAGS] & FLAG_BRIDGED)

    def bridge(self) -> BridgeRecord | None:
        """The bridge record, or None when no bridge ever attached this segment (or the record is unreadable)."""
        (length,) = _U32.unpack_from(self.mm, _OFF_BRIDGE)
        if not length or length > _BRIDGE_MAX:
            return None
        try:
            d = json.loads(bytes(self.mm[_OFF_BRIDGE + 4 : _OFF_BRIDGE + 4 + length]))
            return BridgeRecord(str(d["kind"]), str(d["url"]), bool(d["secret"]), dict(d.get("options") or {}))
        except (ValueError, KeyError, TypeError):
            return None

    def bridge_refusal(self) -> str:
        """Why an append without imposed ids was refused, and what to configure (the :class:`BusBridged` text)."""
        rec = self.bridge()
        what = f"{rec.kind} at {rec.url}" if rec else "a bridge engine"
        how = (
            "set SHMBUS_ENGINE_URL to the backend's full URL (it needs a password)"
            if rec is None or rec.secret
            else "set SHMBUS_ENGINE_URL, or let the bus configure the recorded engine (the default)"
        )
        return (
            f"bus {self.name!r} is bridged through {what}: its ids come from that backend, so this process must "
            f"publish through the same engine (pass engine=..., or {how}); a local id would split the bus"
        )

    # ------------------------------------------------------------------ the history the segment holds
    def history_id(self) -> int:
        """The identity of the backend history whose messages the segment holds (0: none recorded)."""
        return int(self._u64[_Q_HISTORY])

    def set_history_id(self, history: int) -> None:
        self._u64[_Q_HISTORY] = history & 0xFFFFFFFFFFFFFFFF

    # ------------------------------------------------------------------ loss as a visible gap
    def break_chains(self) -> None:
        """A bridge lost messages after the segment's newest (trimmed before it read them, channels unknown): every
        channel's next message starts a new chain, so a backlog read across the loss reports a gap (which the
        engine may then fill from its backend) instead of silently continuing a sparse chain."""
        try:
            self._lock()
            self._u64[_Q_CHAIN_BARRIER] = self._u64[_Q_GID]
        finally:
            self._unlock()
