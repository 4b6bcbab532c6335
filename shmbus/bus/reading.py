"""Reads served from the segment, lock-free: last ids, channel backlogs, the global backlog, replays."""

from __future__ import annotations

import logging

from ..channels import SITE_SEPARATOR_BYTES
from ..envelope import BacklogGap
from ..errors import InvalidArgument
from ..host import BusHost
from ..message import Message
from ..patterns import compile_pattern
from .attachment import Attachment
from .engine_table import EngineTable
from .limits import RetentionLimits
from .names import Names
from .results import Backlog

__all__ = ["Reader"]

log = logging.getLogger("shmbus")


class Reader:
    """Answers every read of :class:`~shmbus.bus.Bus` from the attached segment; a backlog with a gap is offered
    to the default engine (:meth:`Engine.backlog <shmbus.engines.Engine.backlog>`), which may keep more."""

    def __init__(
        self, host: BusHost, attachment: Attachment, names: Names, limits: RetentionLimits, engines: EngineTable
    ):
        self._host = host
        self._attachment = attachment
        self._names = names
        self._limits = limits
        self._engines = engines

    def last_id(self, channel: str, site_id: str | None = None) -> int:
        names = self._names
        return self._attachment.segment.last_id(names.key(channel, names.resolve_site(channel, site_id)))

    def last_ids(self, channels: tuple[str, ...], site_id: str | None = None) -> dict[str, int]:
        seg, names = self._attachment.segment, self._names
        return {ch: seg.last_id(names.key(ch, names.resolve_site(ch, site_id))) for ch in channels}

    def backlog(
        self,
        channel: str | None,
        last_id: int | None,
        site_id: str | None,
        upto: int | None = None,
        limit: int | None = None,
    ) -> Backlog:
        """See :meth:`Bus.backlog <shmbus.bus.Bus.backlog>`."""
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
                last_id=self._attachment.segment.global_id(),
                first_available=msgs[0].global_id if msgs else (last_id or 0) + 1,
            )
        after = last_id or 0
        if after < 0:
            raise InvalidArgument("last_id must be >= 0 (use subscribe(..., last_id=-n) to look back)")
        seg, names = self._attachment.segment, self._names
        epoch = seg.read_epoch()
        site = names.resolve_site(channel, site_id)
        keep = self._limits.max_backlog_size if seg.sparse_ids else None  # sparse ids: the limit is a count
        recs, last, first = seg.channel_backlog(
            names.key(channel, site), after, upto=upto, limit=limit, keep_newest=keep
        )
        message = names.message
        backlog = Backlog([message(r, epoch) for r in recs], after_id=after, last_id=last, first_available=first)
        if backlog.gap:  # an engine that keeps older messages elsewhere (the Redis bridge) may fill the gap
            engine = self._engines.default
            try:
                better = engine.backlog(self._host, BacklogGap(channel, site, after, upto, limit, backlog))
            except Exception:
                log.exception("shmbus: engine %r could not fill a backlog gap on %r", engine, channel)
                better = None
            if better is not None:
                return better
        return backlog

    def look_back(self, channel: str, count: int, site_id: str | None = None) -> int:
        """See :meth:`Bus.look_back <shmbus.bus.Bus.look_back>`."""
        if isinstance(count, bool) or not isinstance(count, int):
            raise InvalidArgument(f"look_back count must be an int, got {count!r}")
        last = self.last_id(channel, site_id)
        if count <= 0:
            return last
        seg = self._attachment.segment
        if not seg.sparse_ids:
            return max(last - count, 0)
        names = self._names
        site = names.resolve_site(channel, site_id)
        recs, _, _ = seg.channel_backlog(names.key(channel, site), 0, keep_newest=count)
        return recs[0].message_id - 1 if len(recs) >= count else 0

    def last_message(self, channel: str, site_id: str | None = None) -> Message | None:
        last = self.last_id(channel, site_id)
        if not last:
            return None
        msgs = self.backlog(channel, last - 1, site_id)
        return msgs[-1] if msgs else None

    def global_backlog(self, last_id: int | None = None) -> list[Message]:
        """See :meth:`Bus.global_backlog <shmbus.bus.Bus.global_backlog>`."""
        if last_id is not None and (isinstance(last_id, bool) or not isinstance(last_id, int)):
            raise InvalidArgument(f"global_backlog last_id must be an int or None, got {last_id!r}")
        seg = self._attachment.segment
        epoch = seg.read_epoch()
        floor = max(last_id or 0, seg.global_id() - self._limits.max_global_backlog_size)
        message = self._names.message
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
            out.append(message(rec, epoch))
        return out

    def replay(self, channel: str | None, kind: str | None, last_id: int, site: str | None) -> list[Message]:
        """What a new subscription is owed first: ``last_id`` n > 0, messages after n; 0, the retained backlog;
        -k (k >= 2), the last k-1 (of ``channel``, or of every channel matching the pattern ``kind``)."""
        if channel is not None and kind is None:
            site = self._names.resolve_site(channel, site)
            after = last_id
            if last_id < -1:
                after = self.look_back(channel, -last_id - 1, site)
            return list(self.backlog(channel, after, site))
        msgs = self.global_backlog(0 if last_id < 0 else last_id)
        if last_id < -1:
            msgs = msgs[last_id + 1 :]
        if kind is not None and channel is not None:
            match = compile_pattern(channel, kind)
            msgs = [m for m in msgs if match(m.channel)]
        return msgs
