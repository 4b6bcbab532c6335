"""Forking, handled for the user: every :class:`~shmbus.bus.Bus` of a process is re-armed in a forked child.

Threads do not survive ``fork()``, and a child must not share its parent's process-table slot or engine sockets.
Each bus registers itself here when built; ``os.register_at_fork`` calls :func:`after_fork_in_child` in every
child, so pre-forking servers (gunicorn, uwsgi) need no hook. Server integrations that want to act explicitly
(``shmbus.adapters.integrations.gunicorn``) use :func:`live_buses`.
"""

from __future__ import annotations

import logging
import os
import weakref
from typing import Protocol

from . import perprocess  # noqa: F401  # first: its fork generation is bumped before buses re-arm

__all__ = ["ForkAware", "after_fork_in_child", "live_buses", "register"]

log = logging.getLogger("shmbus")


class ForkAware(Protocol):
    """What this module re-arms (a :class:`~shmbus.bus.Bus`); server integrations close them at exit."""

    def after_fork(self) -> None: ...

    def close(self) -> None: ...


_buses: weakref.WeakSet[ForkAware] = weakref.WeakSet()


def register(bus: ForkAware) -> None:
    """Re-arm ``bus`` in forked children (held weakly: a bus nobody uses is not kept alive)."""
    _buses.add(bus)


def live_buses() -> list[ForkAware]:
    """Every bus of this process that is still referenced."""
    return list(_buses)


def after_fork_in_child() -> None:
    """Re-arm every bus after a fork (idempotent: a bus that already did is skipped by its fork generation)."""
    for bus in live_buses():
        try:
            bus.after_fork()
        except Exception:
            log.exception("shmbus: after_fork failed for %r", bus)


os.register_at_fork(after_in_child=after_fork_in_child)
