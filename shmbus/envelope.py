"""What travels between a bus and its engines: a message on its way (:class:`Envelope`) and a backlog read that
came back short (:class:`BacklogGap`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from .bus.results import Backlog

__all__ = ["BacklogGap", "Envelope"]


class Envelope(NamedTuple):
    """A message on its way to an engine: validated, encoded, targeting packed."""

    channel: str
    site_id: str | None
    payload: bytes  # codec output
    meta: bytes  # packed targeting (empty = everyone)
    max_backlog_size: int
    max_backlog_age: float


class BacklogGap(NamedTuple):
    """A channel backlog read that came back with a gap (``partial.gap``), for :meth:`Engine.backlog
    <shmbus.engines.Engine.backlog>` to fill."""

    channel: str
    site_id: str | None
    after_id: int
    upto: int | None
    limit: int | None
    partial: Backlog
