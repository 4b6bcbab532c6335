"""Resumable replay for the transports: what a client missed since a global id, on its channels and patterns, and
whether some of it is gone (a *gap*: the backlogs no longer reach back that far)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from shmbus.bus import Bus
from shmbus.channels import GLOBAL_PREFIX, RESERVED_PREFIX
from shmbus.message import Message
from shmbus.patterns import compile_pattern


def site_matches(msg: Message, site: str | None) -> bool:
    if msg.channel.startswith(GLOBAL_PREFIX):
        return True
    return msg.site_id == site


@dataclass
class Replayed:
    """Messages to replay (oldest first, by global id) and whether some the caller asked for are gone."""

    messages: list[Message]
    gap: bool
    gap_channels: list[str]


def replay_since(
    bus: Bus,
    channels: Iterable[str],
    patterns: Iterable[tuple[str, str]],
    site: str | None,
    after_gid: int,
    upto_gid: int,
) -> Replayed:
    """Messages with ``after_gid < global_id <= upto_gid`` on ``channels`` or matching ``patterns``.

    Exact channels are read from their own backlogs (they hold ``max_backlog_size`` messages each). A gap is
    reported for a channel when it dropped messages (``first_available > 1``) and its oldest retained message is
    newer than ``after_gid`` (conservative: the dropped ones may have been older than the client's position).
    Patterns are read from the global backlog; a gap is reported when its window (``max_global_backlog_size``,
    the ring) no longer reaches ``after_gid``.
    """
    out: dict[int, Message] = {}
    gaps: list[str] = []
    site_key = site or ""
    for ch in channels:
        backlog = bus.backlog(ch, 0, site_key)
        for m in backlog:
            if after_gid < m.global_id <= upto_gid:
                out[m.global_id] = m
        if backlog.first_available > 1 and (not backlog or backlog[0].global_id > after_gid + 1):
            gaps.append(ch)
    pats = [(p, compile_pattern(p, kind)) for p, kind in patterns]
    if pats and upto_gid > after_gid:
        floor = bus.segment.global_id() - bus.max_global_backlog_size
        first = bus.segment.global_backlog(after_gid, limit=1)
        if floor > after_gid or (first and first[0].global_id > after_gid + 1):
            gaps.extend(p for p, _ in pats)
        for m in bus.global_backlog(after_gid):
            if m.global_id > upto_gid or m.global_id in out or m.channel.startswith(RESERVED_PREFIX):
                continue
            if site_matches(m, site) and any(match(m.channel) for _, match in pats):
                out[m.global_id] = m
    return Replayed([out[g] for g in sorted(out)], bool(gaps), gaps)
