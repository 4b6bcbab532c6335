"""Where the NATS bridge keeps a bus in its stream: one subject per channel, the gem's line without its ids.

A channel's messages go to ``<prefix>.<hex of the backend channel name>`` (the channel with its site suffix, UTF-8,
in hex: a NATS subject token may not hold ``.``, ``*``, ``>`` or white space, and a channel name may), so the stream
keeps each channel's newest ``max_msgs_per_subject`` (the gem's ``max_backlog_size``), and a channel's messages are
found without reading the others' (the Spark reader: ``last_by_subj``, a consumer filtered on the subject). The
data is ``chan|envelope`` (:func:`~shmbus.adapters.bridge.wire.line_tail`): the channel is read from the data, so
a subject that does not match its data changes nothing but where the stream counts it.
"""

from __future__ import annotations

import functools

from ..bridge.wire import PIPE_ESCAPE

__all__ = ["channel_subject", "split_data", "wildcard"]

_PIPE = PIPE_ESCAPE.encode()


@functools.lru_cache(maxsize=4096)
def channel_subject(prefix: str, chan: str) -> bytes:
    """The subject of backend channel ``chan`` under ``prefix``."""
    return f"{prefix}.{chan.encode().hex()}".encode()


def wildcard(prefix: str) -> str:
    """The stream's subject filter: every channel under ``prefix``."""
    return f"{prefix}.>"


def split_data(data: bytes) -> tuple[str, bytes] | None:
    """A stream message's data ``chan|envelope`` as its parts; None for one that is not the bridge's."""
    chan, sep, envelope = data.partition(b"|")
    if not sep or not envelope:
        return None
    try:
        return chan.replace(_PIPE, b"|").decode(), envelope
    except UnicodeDecodeError:
        return None
