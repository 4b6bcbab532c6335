"""One channel's messages of a batch, encoded once for every recipient (:class:`Group`), and its delivery to many
clients made a few at a time (:class:`Deferred`), so that a broadcast's per-client work runs in the event loop's
slices instead of one piece (see :meth:`.registry.Registry.dispatch` and :mod:`shmbus.adapters.fanout`)."""

from __future__ import annotations

from shmbus.message import Message

from .visibility import PRIVATE, Piece, Visibility
from .waiter import Waiter
from .wire import encode_message, frame_chunk

__all__ = ["DEFER_OVER", "Deferred", "Group"]

#: A group for more clients than this may be deferred (:meth:`Registry.dispatch`); fewer are delivered at once.
DEFER_OVER = 64


class Group:
    """Messages of one (site, channel) in one batch, encoded lazily and once for every recipient."""

    __slots__ = ("enc", "frame", "inner", "is_json", "msgs", "plain", "vis")

    def __init__(self, msgs: list[Message], is_json: bool) -> None:
        self.msgs = msgs
        self.is_json = is_json
        self.plain = not any(m.targeted for m in msgs)
        self.enc: list[bytes] | None = None
        self.inner: bytes | None = None
        self.frame: bytes | None = None
        self.vis: Visibility | None = None

    def encoded(self) -> list[bytes]:
        if self.enc is None:
            self.enc = [encode_message(m, self.is_json) for m in self.msgs]
        return self.enc

    def shared_inner(self) -> bytes:
        if self.inner is None:
            self.inner = b",".join(self.encoded())
        return self.inner

    def shared_frame(self) -> bytes:
        if self.frame is None:
            self.frame = frame_chunk(b"[" + self.shared_inner() + b"]")
        return self.frame

    def piece_for(self, c: Waiter, ok: list[bool] | None) -> Piece | None:
        """What ``c`` may see of every message here, computed once per visibility class (see
        :mod:`.visibility`) and shared by every client of the class; None when ``c`` needs its own."""
        vis = self.vis
        if vis is None:
            vis = self.vis = Visibility(self.msgs)
        key = vis.key(c.client_id, c.user_id, c.group_ids)
        if key is PRIVATE:
            return None
        piece = vis.pieces.get(key)
        if piece is None:
            enc = self.encoded()
            parts = []
            for i, m in enumerate(self.msgs):
                if (ok is None or ok[i]) and c.allowed(m):
                    parts.append(enc[i])
            piece = vis.pieces[key] = Piece(b",".join(parts), len(parts), len(parts) < len(enc))
        return piece


class Deferred:
    """One large group's delivery, made client by client (:meth:`Registry.serve`) after the dispatch that
    created it: the clients it was for (the index's at that moment), how far it got, and the clients it gave
    their piece ahead of their turn (``taken``, with ``at`` the clients' positions, both made on first need)."""

    __slots__ = ("at", "channel", "clients", "group", "ok", "pos", "taken")

    def __init__(self, clients: tuple[Waiter, ...], channel: str, group: Group, ok: list[bool] | None) -> None:
        self.clients = clients
        self.channel = channel
        self.group = group
        self.ok = ok
        self.pos = 0
        self.at: dict[Waiter, int] | None = None
        self.taken: set[Waiter] | None = None
