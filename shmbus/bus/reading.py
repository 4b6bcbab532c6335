"""Reads served from the segment, lock-free: last ids, channel backlogs, the global backlog."""

from __future__ import annotations

import logging

from ..channels import SITE_SEPARATOR_BYTES
from ..engines import BacklogGap
from ..errors import InvalidArgument
from ..message import Message
from .results import Backlog
from .state import BusState

__all__ = ["Reading"]

log = logging.getLogger("shmbus")


class Reading(BusState):
    def last_id(self, channel: str, site_id: str | None = None) -> int:
        """Id of the newest message on ``channel`` (0 when empty, unknown or expired)."""
        return self.segment.last_id(self._key(channel, self._resolve_site(channel, site_id)))

    def last_ids(self, *channels: str, site_id: str | None = None) -> dict[str, int]:
        """``{channel: last_id}`` for several channels in one call."""
        seg = self.segment
        return {ch: seg.last_id(self._key(ch, self._resolve_site(ch, site_id))) for ch in channels}

    def backlog(
        self,
        channel: str | None = None,
        last_id: int | None = 0,
        site_id: str | None = None,
        *,
        upto: int | None = None,
        limit: int | None = None,
    ) -> Backlog:
        """Retained messages on ``channel`` with id above ``last_id`` (and at most ``upto``), oldest first.

        ``channel=None`` reads the global backlog. ``limit`` caps the count from the oldest end (guble's replay
        with start id and count). The result is a :class:`Backlog`: a list that also reports any gap.
        """
        for name, value in (("last_id", last_id), ("upto", upto), ("limit", limit)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise InvalidArgument(f"backlog {name} must be an int or None, got {value!r}")
        if limit is not None and limit < 0:
            raise InvalidArgument(f"backlog limit must be >= 0, got {limit}")
        if channel is None:
            msgs = self.global_backlog(last_id)
            return Backlog(
                msgs,
                after_id=last_id or 0,
                last_id=self.segment.global_id(),
                first_available=msgs[0].global_id if msgs else (last_id or 0) + 1,
            )
        after = last_id or 0
        if after < 0:
            raise InvalidArgument("last_id must be >= 0 (use subscribe(..., last_id=-n) to look back)")
        seg = self.segment
        epoch = seg.read_epoch()
        site = self._resolve_site(channel, site_id)
        keep = self.max_backlog_size if seg.sparse_ids else None  # sparse ids: the limit is a count
        recs, last, first = seg.channel_backlog(
            self._key(channel, site), after, upto=upto, limit=limit, keep_newest=keep
        )
        backlog = Backlog([self._message(r, epoch) for r in recs], after_id=after, last_id=last, first_available=first)
        if backlog.gap:  # an engine that keeps older messages elsewhere (the Redis bridge) may fill the gap
            try:
                better = self._default_engine.backlog(
                    self._as_bus(), BacklogGap(channel, site, after, upto, limit, backlog)
                )
            except Exception:
                log.exception("shmbus: engine %r could not fill a backlog gap on %r", self._default_engine, channel)
                better = None
            if better is not None:
                return better
        return backlog

    def look_back(self, channel: str, count: int, site_id: str | None = None) -> int:
        """The id after which ``channel``'s last ``count`` messages lie: ``backlog(channel, look_back(ch, n))``
        reads the last n. Ids are usually contiguous (``last_id - count``); under an engine whose message ids
        are global ids (PostgreSQL) they are not, and the messages are counted instead."""
        if isinstance(count, bool) or not isinstance(count, int):
            raise InvalidArgument(f"look_back count must be an int, got {count!r}")
        last = self.last_id(channel, site_id)
        if count <= 0:
            return last
        seg = self.segment
        if not seg.sparse_ids:
            return max(last - count, 0)
        site = self._resolve_site(channel, site_id)
        recs, _, _ = seg.channel_backlog(self._key(channel, site), 0, keep_newest=count)
        return recs[0].message_id - 1 if len(recs) >= count else 0

    def last_message(self, channel: str, site_id: str | None = None) -> Message | None:
        last = self.last_id(channel, site_id)
        if not last:
            return None
        msgs = self.backlog(channel, last - 1, site_id)
        return msgs[-1] if msgs else None

    def global_backlog(self, last_id: int | None = None) -> list[Message]:
        """Messages of every channel and site with global id above ``last_id`` (at most
        ``max_global_backlog_size``, the newest), oldest first; per-channel trimming and expiry apply."""
        if last_id is not None and (isinstance(last_id, bool) or not isinstance(last_id, int)):
            raise InvalidArgument(f"global_backlog last_id must be an int or None, got {last_id!r}")
        seg = self.segment
        epoch = seg.read_epoch()
        floor = max(last_id or 0, seg.global_id() - self.max_global_backlog_size)
        out = []
        states: dict[bytes, tuple[int, int, int, int]] = {}
        for rec in seg.global_backlog(floor):
            key = rec.channel + SITE_SEPARATOR_BYTES + rec.site if rec.site else rec.channel
            st = states.get(key)
            if st is None:
                st = states[key] = seg.channel_state(key)
            last, _newest, trim_below, since_gid = st
            if rec.message_id <= trim_below or rec.global_id < since_gid or rec.message_id > last:
                continue
            out.append(self._message(rec, epoch))
        return out
