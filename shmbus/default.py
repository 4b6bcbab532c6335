"""The module-level bus (``shmbus.publish``, ``shmbus.subscribe``, ... and :class:`~shmbus.cache.DistributedCache`
use it): configured once with :func:`configure`, created on first use."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from .bus import Bus

__all__ = ["configure", "default_bus"]

_default: Bus | None = None
_default_options: dict[str, Any] = {}
_default_lock = threading.Lock()


def configure(**options: Any) -> Bus:
    """Configure the default bus (``name=`` and any :class:`Bus` option). Replaces a bus configured earlier.

    The default bus is the app's own, so it is created when missing (``create=True`` unless given): ``configure``
    is where an app declares its bus, unlike a plain ``Bus(name)``, which only attaches."""
    global _default
    with _default_lock:
        old = _default
        _default_options.clear()
        _default_options.update(options)
        _default = None
    if old is not None:
        old.close()
    return default_bus()


def default_bus() -> Bus:
    """The module-level bus, created on first use: ``configure(name=...)``, else ``$SHMBUS_NAME``, else "default".

    The last case is logged once as a warning: two apps that both forget ``configure()`` would share one bus.
    """
    global _default
    bus = _default
    if bus is None:
        with _default_lock:
            if _default is None:
                opts = dict(_default_options)
                name = opts.pop("name", None) or os.environ.get("SHMBUS_NAME")
                if not name:
                    name = "default"
                    logging.getLogger("shmbus").warning(
                        "shmbus: no bus name configured; using the bus named 'default' (call "
                        "shmbus.configure(name=...) or set SHMBUS_NAME)"
                    )
                _default = Bus(name, **{"create": True, **opts})
            bus = _default
    return bus
