"""What a backend hands the relay: a message of its history (:class:`Row`) and what a doorbell brought
(:class:`DoorbellRing`). Plain tuples with no imports, so :mod:`.seals` can use them without the backend protocol's."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["DoorbellRing", "Row"]


class Row(NamedTuple):
    """One message of the backend's history, as read from it (never from a notice)."""

    global_id: int
    message_id: int  #: the channel's id (Redis); the global id again on PostgreSQL (sparse ids)
    channel: str  #: the backend's channel name (the channel, with the site suffix)
    value: bytes | None  #: the gem's envelope; None: the id existed, but the backend no longer holds the message


class DoorbellRing(NamedTuple):
    """What one wait on the doorbell brought: the highest id the notices name (0: none; a hint), the gem's lines
    (bytes), and the seals that came with them (a run's first id -> its last id and mac) (:mod:`.seals`)."""

    top: int
    lines: list[bytes]
    seals: dict[int, tuple[int, bytes]]
