"""What the adapters provide the core at run time, found in the installed packages' metadata (entry points): the
core imports no adapter and names none, not even as a string (``tests/test_architecture.py`` checks it).

Two groups, declared in ``setup.cfg``:

* :data:`ENGINES` (``shmbus.engines``): an engine kind -> the module that registers it when imported
  (:mod:`shmbus.engine_urls`: ``redis``, ``postgres``);
* :data:`TOOLS` (``shmbus.tools``): a part of the command line that lives with an adapter -> its module
  (``guble``: the guble client; ``push-dev``: the development push service; ``redis-view``: what ``shmbus stats``
  shows of a bridged bus's Redis).

A third-party package provides its own the same way, in its own ``entry_points``.
"""

from __future__ import annotations

import functools
from importlib import import_module, metadata
from types import ModuleType

__all__ = ["ENGINES", "TOOLS", "provided", "provider"]

ENGINES = "shmbus.engines"
TOOLS = "shmbus.tools"


@functools.cache
def _provided(group: str) -> tuple[tuple[str, str], ...]:
    return tuple((ep.name, ep.module) for ep in metadata.entry_points(group=group))


def provided(group: str) -> dict[str, str]:
    """Name -> module of every provider of ``group`` the installed packages declare (read once per process)."""
    return dict(_provided(group))


def provider(group: str, name: str) -> ModuleType:
    """The module that provides ``name`` in ``group``, imported (an ``ImportError`` names what is missing, e.g. an
    extra); ``LookupError`` when no installed package provides it."""
    module = provided(group).get(name)
    if module is None:
        raise LookupError(f"no installed package provides {name!r} ({group}); is shmbus installed?")
    return import_module(module)
