"""The demo's "notify me": Web Push for new chat messages, when the ``[push]`` extra is installed.

Every worker runs a :class:`~shmbus.adapters.push.PushConnector` (one is elected to send) and serves the push
REST app under ``/push/``. The demo has no login: the page sends its chat name as ``X-Demo-User`` and that is
the user; a real app takes the user from its session. Subscriptions and the VAPID key live in
``$SHMBUS_DEMO_PUSH_DIR`` (``scripts/demo`` sets it and removes it with the bus). Without the extra, :func:`wrap`
returns the app unchanged and the page hides the button (``GET /push/key`` is a 404).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import tempfile
from typing import Any

from shmbus import Bus

log = logging.getLogger("shmbus.demo")


def _user(scope: Any) -> str | None:
    for key, value in scope.get("headers") or ():
        if key == b"x-demo-user":
            name = value.decode("utf-8", "replace").strip()[:40]
            return name or None
    return None


def _vapid(directory: str) -> Any:
    """The demo's VAPID key: made by the first worker, read by the others (a changed key would void every
    browser's subscription, so it is kept with them)."""
    from shmbus.adapters.push import VapidKeys
    from shmbus.adapters.push.stores import write_atomically

    pem = os.path.join(directory, "vapid_private.pem")
    fd = os.open(os.path.join(directory, "vapid.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if not os.path.exists(pem):
            write_atomically(pem, VapidKeys.generate("mailto:demo@example.com").private_pem())
    finally:
        os.close(fd)
    return VapidKeys.load(pem, "mailto:demo@example.com")


def wrap(app: Any, bus: Bus, channel: str) -> tuple[Any, Any]:
    """``(app with /push/ routes, connector)``, or ``(app, None)`` without the push extra."""
    try:
        from shmbus.adapters.push import FileStore, PushApp, PushConnector
    except ImportError as exc:
        log.info("demo: no Web Push (%s); pip install -e '.[push]' to offer 'notify me'", exc)
        return app, None
    directory = os.environ.get("SHMBUS_DEMO_PUSH_DIR") or os.path.join(
        tempfile.gettempdir(), f"shmbus-demo-push-{bus.name}"
    )
    with contextlib.suppress(FileExistsError):
        os.makedirs(directory, mode=0o700)
    connector = PushConnector(bus, vapid=_vapid(directory), channels=channel,
                              store=FileStore(os.path.join(directory, "push"))).start()  # fmt: skip
    return PushApp(app, connector=connector, user_id_lookup=_user), connector
