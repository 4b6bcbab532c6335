"""One waiting request (a long poll or a stream) and the targeting rules that decide what it may see."""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from shmbus.bus import Bus
from shmbus.channels import GLOBAL_PREFIX
from shmbus.message import Message

from .interning import intern_bounded
from .wire import encode_status

log = logging.getLogger("shmbus.adapters")


# ---------------------------------------------------------------------------------------------------- clients
class Ending(enum.Enum):
    """Why a waiting request ends before its messages or its interval."""

    #: the client went away, or stopped reading a stream (``max_stream_buffer``): nothing more is sent
    DROPPED = "dropped"
    #: the bus was reset: a status of 0 for every channel is the answer (the client re-reads the new epoch)
    RESET = "reset"
    #: a request of the same client id with a higher ``__seq`` is parked: the first chunk was the whole answer
    STALE = "stale"


@dataclass
class Lookups:
    user_id: Any = None
    group_ids: frozenset[Any] = frozenset()
    site_id: str | None = None


class Waiter:
    """One request that waits for live messages (long poll or stream).

    ``last`` holds, per channel, the highest id this request has delivered or skipped; live messages at or
    below it are never sent. ``pending`` holds encoded pieces waiting for the shell to write: for a streaming
    client whole framed chunks, otherwise array items (joined into one array when the request ends).
    """

    __slots__ = (
        "bytes_pending",
        "channels",
        "client_id",
        "done",
        "ending",
        "epoch",
        "group_ids",
        "held",
        "keys",
        "last",
        "parked",
        "pending",
        "registered",
        "seq",
        "signal",
        "site_id",
        "status_due",
        "streaming",
        "user_id",
        "waker",
    )

    def __init__(
        self,
        client_id: str,
        seq: int,
        lookups: Lookups,
        channels: Iterable[str],
        streaming: bool,
        epoch: int,
        waker: Callable[[Waiter], Any] | None = None,
        signal: Any = None,
    ) -> None:
        self.client_id = client_id
        self.seq = seq
        self.user_id = lookups.user_id
        self.group_ids = lookups.group_ids
        self.site_id = lookups.site_id
        self.channels = tuple(channels)
        self.keys = tuple(
            _shared_key(None if ch.startswith(GLOBAL_PREFIX) else lookups.site_id, ch) for ch in self.channels
        )
        self.streaming = streaming
        self.epoch = epoch
        self.last: dict[str, int] = {}
        self.pending: list[bytes] = []
        self.bytes_pending = 0
        self.held: list[Message] | None = []
        self.status_due: set[str] | None = None
        self.registered = False  # in the registry's index: live messages are collected for it
        self.parked = False  # the parked request of its client id: live messages are delivered to it
        self.done = False  # must end now (a long poll got its messages, or an ending below)
        self.ending: Ending | None = None  # why it ends early, if it does
        #: called (on the registry's thread) when the client has something to send or must end
        self.waker = waker
        #: the shell's wake-up object (an Event, a Future, ...), for the waker's use
        self.signal = signal

    @property
    def dropped(self) -> bool:
        """The client went away or stopped reading: nothing more is sent to it."""
        return self.ending is Ending.DROPPED

    def end(self, ending: Ending) -> None:
        """End early for ``ending`` (a dropped client stays dropped)."""
        if self.ending is not Ending.DROPPED:
            self.ending = ending
        self.done = True

    def allowed(self, msg: Message) -> bool:
        """message_bus's ``Client#allowed?`` targeting rules (client message filters are checked separately)."""
        if not msg.targeted:
            return True
        cids = msg.client_ids
        if cids and self.client_id not in cids:
            return False
        uids, gids = msg.user_ids, msg.group_ids
        if not uids and not gids:
            return True
        if uids and self.user_id is not None and self.user_id in uids:
            return True
        return bool(gids and self.group_ids and not self.group_ids.isdisjoint(gids))

    def status_entry(self) -> bytes | None:
        if self.ending is Ending.RESET:
            return encode_status(dict.fromkeys(self.channels, 0))
        if not self.status_due:
            return None
        return encode_status({ch: self.last.get(ch, 0) for ch in self.channels if ch in self.status_due})

    def __repr__(self) -> str:
        return f"Waiter({self.client_id!r}, seq={self.seq}, streaming={self.streaming})"


_KEYS: dict[tuple[str | None, str], tuple[str | None, str]] = {}


def _shared_key(site: str | None, channel: str) -> tuple[str | None, str]:
    """One ``(site, channel)`` tuple object per index key (bounded): memory per parked client."""
    return _KEYS.get((site, channel)) or intern_bounded(_KEYS, (site, channel), 20_000)  # a hit costs no call


def filter_allows(bus: Bus, msg: Message) -> bool:
    """The bus's client message filters on ``msg``; a filter that raises withholds the message (logged)."""
    try:
        return bool(bus.allowed_by_filters(msg))
    except Exception:
        log.exception("shmbus: client message filter failed on %r; message withheld", msg.channel)
        return False
