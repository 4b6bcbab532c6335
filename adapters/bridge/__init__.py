"""The bridge kit: what every bridge engine (Redis, PostgreSQL) needs, written once, as objects a bridge holds.

* :class:`~.engine.BridgeEngine`: the engine the bus calls (publish with size check and landing, batch, hooks,
  health, fork), composed of the objects below and a backend.
* :class:`~.backend.Backend` (a ``typing.Protocol``): the backend-specific half (publish, read the history after an
  id, name the history, the doorbell, trims, gap fills); :class:`~.rows.Row`, :class:`~.rows.DoorbellRing`,
  :class:`~.backend.Doorbell`; :class:`~.engine.RelayOptions`.
* :class:`~.machine.RelayMachine`: the relay's rules and state, sans-IO (catch-up with loss accounting, history
  check and reset, storing lines the backend sealed: :mod:`.seals`), and :class:`~.relay.Relay`, the thread that
  performs its actions (the election loop and the relay).
* :mod:`.wire`: the gem's line and envelope format, every backend's.
* :class:`~.election.RelayElection`, :class:`~.landing.Landing`, :class:`~.queue.PublishQueue`,
  :class:`~.status.BridgeStatus` (what a bridge reports; ``Engine.relay_figures`` for the metrics).

Nothing here imports a backend client library, so it is importable without the extras. :mod:`.memory`
(``MemoryBackend``, ``MemoryBridge``) is a backend in this process's memory, a test double.
"""

from __future__ import annotations

from .backend import Backend, Doorbell, Row
from .election import RelayElection
from .engine import Batch, BridgeEngine, RelayOptions
from .landing import Landing
from .machine import RelayMachine
from .queue import PublishQueue
from .relay import Relay
from .rows import DoorbellRing
from .status import BridgeStatus

#: The name the doorbell's answer had before (``Ring``, which is also the segment's ring), kept for bridges that
#: import it.
Ring = DoorbellRing

__all__ = [
    "Backend",
    "Batch",
    "BridgeEngine",
    "BridgeStatus",
    "Doorbell",
    "DoorbellRing",
    "Landing",
    "PublishQueue",
    "Relay",
    "RelayElection",
    "RelayMachine",
    "RelayOptions",
    "Ring",
    "Row",
]
