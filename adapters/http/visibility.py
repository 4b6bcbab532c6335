"""Visibility classes: clients that may see the same messages of a batch get the same bytes.

Targeting (``client_ids``, ``user_ids``, ``group_ids``; :meth:`Waiter.allowed`) decides per client and message
what a batch shows. Asking it for every client and every message, then joining and framing each client's part,
is per-client work that depends only on the messages. Instead, one channel's messages of a batch (a
:class:`Visibility`) map each client to a *class key* that captures everything ``allowed`` reads of the client,
reduced to what these messages can tell apart:

* its client id, only if some message names client ids;
* its user id, only if it appears among the messages' user ids (any other user id is seen as no user);
* its group ids intersected with the union of the messages' group ids.

Two clients with the same key get the same answer from ``allowed`` for every message of the batch (the proof is
the three bullets: ``allowed`` reads nothing else of the client), so the visible part is computed, joined and
framed once per class and shared by identity; the site is the registry's index key, so a class never spans
sites. Client message filters depend only on the message and are applied to every class alike.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

from shmbus.message import Message

from .wire import frame_chunk

#: Class key of a client that needs its own computation (an unhashable user id, say): never shared.
PRIVATE = None


class Piece:
    """What one class sees of a batch's channel: the joined array items, the framed chunk (made on first use),
    how many messages it holds and whether any was withheld (the client then owes a ``/__status``)."""

    __slots__ = ("_frame", "count", "inner", "withheld")

    def __init__(self, inner: bytes, count: int, withheld: bool) -> None:
        self.inner = inner
        self.count = count
        self.withheld = withheld
        self._frame: bytes | None = None

    def frame(self) -> bytes:
        if self._frame is None:
            self._frame = frame_chunk(b"[" + self.inner + b"]")
        return self._frame


class Visibility:
    """The targeting of one channel's messages in one batch, and the pieces computed for each class so far."""

    __slots__ = ("by_client", "gids", "pieces", "reduced", "uids")

    def __init__(self, msgs: Sequence[Message]) -> None:
        by_client = False
        uids: set[Any] = set()
        gids: set[Any] = set()
        for m in msgs:
            if not m.targeted:
                continue
            by_client = by_client or bool(m.client_ids)
            uids.update(m.user_ids or ())
            gids.update(m.group_ids or ())
        self.by_client = by_client
        self.uids = frozenset(uids)
        self.gids = frozenset(gids)
        self.reduced: dict[frozenset[Any], frozenset[Any]] = {}  # a client's groups -> the part that matters
        self.pieces: dict[Hashable, Piece] = {}

    def key(self, client_id: str, user_id: Any, group_ids: frozenset[Any]) -> Hashable:
        """The class of a client with these lookups (:data:`PRIVATE` when it cannot be shared)."""
        try:
            user = user_id if user_id is not None and user_id in self.uids else None
        except TypeError:  # an unhashable user id: compared by == alone, computed for this client only
            return PRIVATE
        groups = self.reduced.get(group_ids)
        if groups is None:
            groups = self.reduced[group_ids] = group_ids & self.gids
        return (client_id if self.by_client else None, user, groups)
