"""What a bus and its engines report about themselves: one vocabulary, written once.

The host metrics (:mod:`shmbus.metrics`), ``Bus.health()``, the admin page and ``shmbus top`` read these tuples;
nobody reads a bus's or an engine's private attributes for them.
"""

from __future__ import annotations

from typing import Literal, NamedTuple, get_args

__all__ = ["RELAY_STATES", "BusFigures", "ListenerFigures", "RelayFigures", "RelayState"]

#: A bridge's relay state in one process ("stalled": it holds the host's relay but made no progress for a while;
#: appended last, so the indexes the metrics slots store keep their meaning).
RelayState = Literal["standby", "connecting", "relaying", "reconnecting", "off", "stalled"]
#: The relay states as the metrics slots store them (an index; 0, ``""``: the process relays nothing).
RELAY_STATES: tuple[str, ...] = ("", *get_args(RelayState))


class RelayFigures(NamedTuple):
    """What a bridge engine reports about its relay in this process (:meth:`Engine.relay_figures
    <shmbus.engines.Engine.relay_figures>`)."""

    relaying: bool  #: this process holds the host's relay election
    state: str  #: a :data:`RelayState`, or ``""`` for none
    backend_newest: int  #: the backend's newest global id as the relay knows it (the lag is it minus the segment's)
    lost: int  #: messages this process's relay found gone from the backend before it read them (cumulative)


class ListenerFigures(NamedTuple):
    """What a bus's listener reports in this process (:meth:`Bus.figures <shmbus.bus.Bus.figures>`)."""

    listening: bool  #: the listener thread runs
    position: int  #: the last global id it handled (0: none yet)
    lost: int  #: messages overwritten in the ring before it read them (since this process began)
    seconds_since_last_message: float


class BusFigures(NamedTuple):
    """What a bus reports about this process (:meth:`Bus.figures <shmbus.bus.Bus.figures>`): its listener, and
    the relays of its engines that relay."""

    listener: ListenerFigures
    relays: list[RelayFigures]

    @property
    def relay_lost(self) -> int:
        return sum(r.lost for r in self.relays)
