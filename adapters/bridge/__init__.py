"""The bridge kit: what every bridge engine (Redis, PostgreSQL) needs, written once, as objects a bridge holds.

* :class:`~.engine.BridgeEngine`: the engine the bus calls (publish with size check and landing, batch, hooks,
  health, fork), composed of the objects below and a backend.
* :class:`~.backend.Backend` (a ``typing.Protocol``): the backend-specific half (publish, read the history after an
  id, name the history, the doorbell, trims, gap fills); :class:`~.rows.Row`, :class:`~.rows.Ring`,
  :class:`~.backend.Doorbell`; :class:`~.engine.RelayOptions`.
* :class:`~.relay.Relay`: the election loop and the relay (catch-up with loss accounting, history check and reset,
  storing lines the backend sealed: :mod:`.seals`).
* :class:`~.election.RelayElection`, :class:`~.landing.Landing`, :class:`~.queue.PublishQueue`,
  :class:`~.status.BridgeStatus` (what a bridge reports; ``Engine.relay_figures`` for the metrics).

Nothing here imports a backend client library, so it is importable without the extras.
"""

from __future__ import annotations

from .backend import Backend, Doorbell, Row
from .election import RelayElection
from .engine import Batch, BridgeEngine, RelayOptions
from .landing import Landing
from .queue import PublishQueue
from .relay import Relay
from .rows import Ring
from .status import BridgeStatus

__all__ = [
    "Backend",
    "Batch",
    "BridgeEngine",
    "BridgeStatus",
    "Doorbell",
    "Landing",
    "PublishQueue",
    "Relay",
    "RelayElection",
    "RelayOptions",
    "Ring",
    "Row",
]
