"""A publisher's own messages in its host's segment: read-your-writes without waiting for the relay's hop.

A publish learns its ids from its own deliveries (:mod:`.publisher`), before its host's relay stored them. It
returns once the segment holds them, as on every bridge: it stores one itself when it directly follows the
segment's newest (``expect_global_id``, checked under the segment's lock) *and* the stream's entry just before it,
delivered to the same consumer, is the segment's message there: the segment is in the stream's history, not an
older one (a stream deleted and recreated restarts its offsets; the relay resets the bus when it sees that). Any
other case (offsets are sparse: the broker's own entries take some; messages of others in between; no proof)
waits for the relay to store it, at most ``local_wait``. The relay skips ids the segment holds.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from shmbus.channels import backend_name

from ..bridge.landing import LANDING_SLICE
from ..bridge.wire import encode_envelope, line_tail

if TYPE_CHECKING:
    from shmbus.engines import Envelope
    from shmbus.host import BusHost

__all__ = ["land_own"]

log = logging.getLogger("shmbus.rabbitmq")


def _body(codec: Any, rec: Any) -> bytes:
    chan = backend_name(rec.channel.decode(), rec.site.decode() or None)
    return line_tail(chan, encode_envelope(codec, rec.payload, rec.meta))


def land_own(bus: BusHost, envelopes: list[Envelope], ids: list[int], before: dict[int, bytes], wait: float) -> None:
    """Return once the segment holds every id of ``ids`` (or was reset, or ``wait`` s passed); ``before``: our
    id -> the stream's entry just before it (see the module doc)."""
    seg = bus.segment
    deadline = time.monotonic() + wait
    epoch = seg.read_epoch()
    i = 0
    while i < len(ids):
        gid = ids[i]
        word = seg.futex_word()  # read first: a store after the check below ends the wait at once
        newest = seg.global_id()
        if seg.read_epoch() != epoch:
            return  # reset: the relay stores the new history
        if newest >= gid:
            i += 1
            continue
        prev = before.get(gid)
        if newest == gid - 1 and prev is not None:
            recs = seg.global_backlog(gid - 2, limit=1)
            if recs and recs[0].global_id == gid - 1 and _body(bus.codec, recs[0]) == prev:
                try:
                    if bus.store(envelopes[i], global_id=gid, message_id=gid, expect_global_id=gid - 1):
                        i += 1
                    continue  # else another store came in between: look again
                except Exception:
                    log.exception("shmbus rabbitmq bridge: storing published message %d locally failed", gid)
            before.pop(gid, None)  # not the same history, or failed: the relay stores it
        left = deadline - time.monotonic()
        if left <= 0:
            return
        seg.wait(word, min(left, LANDING_SLICE))
