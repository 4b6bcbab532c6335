"""Channel backlogs older than the segment holds, completed from the table (``Engine.backlog``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shmbus.bus import Backlog
from shmbus.channels import backend_name
from shmbus.message import Message

from ..bridge.wire import decode_envelope
from . import sql

if TYPE_CHECKING:
    import psycopg

    from shmbus.engines import BacklogGap
    from shmbus.host import BusHost

__all__ = ["fill_backlog"]


def fill_backlog(conn: psycopg.Connection[Any], bus: BusHost, gap: BacklogGap) -> Backlog | None:
    """The union of the table's rows and the segment's records after ``after_id``, limited to the newest
    ``max_backlog_size``. It has no gap when no recorded trim deleted a row of the channel after the client's
    position (``shmbus_trimmed_channels``; from 0: none ever did, since with global ids a channel's first id
    says nothing of what came before it), or the table still holds a row of the channel at or before that
    position (trims remove a channel's oldest rows first); otherwise the loss is reported from the oldest row
    held, as the segment and the Redis bridge report it. Raises psycopg's errors (the caller keeps the segment's
    answer)."""
    channel, site_id, after_id, upto, limit, partial = gap
    chan = backend_name(channel, site_id)
    hi = partial.last_id if upto is None else min(upto, partial.last_id)
    keep = bus.max_backlog_size
    rows = conn.execute(sql.SELECT_CHANNEL_NEWEST, (chan, after_id, hi, keep + 1), prepare=True).fetchall()
    found = conn.execute(sql.SELECT_HELD, (chan, after_id, chan, after_id), prepare=True).fetchone()
    held = bool(found and found[0])
    epoch = bus.segment.read_epoch()
    by_id = {m.message_id: m for m in partial}
    for gid, value in rows:
        gid = int(gid)
        if gid not in by_id:
            payload, meta = decode_envelope(bus.codec, value.encode())
            by_id[gid] = Message(gid, gid, channel, payload, bus.codec, site_id=site_id, meta=meta, epoch=epoch)
    merged = [by_id[k] for k in sorted(by_id)]
    if len(merged) > keep:  # beyond the backlog limit: the oldest count as trimmed
        first = merged[-keep - 1].message_id + 1
        merged = merged[-keep:]
    elif held:
        first = after_id + 1
    else:
        first = merged[0].message_id if merged else partial.first_available
    if limit is not None:
        del merged[limit:]
    return Backlog(merged, after_id=after_id, last_id=partial.last_id, first_available=first)
