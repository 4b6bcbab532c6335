"""The demo's "notify me": Web Push for new chat messages, when the ``[push]`` extra is installed.

Every worker runs a :class:`~shmbus.adapters.push.PushConnector` (one is elected to send) and serves the push
REST app under ``/push/``. The demo has no login: the page sends its chat name as ``X-Demo-User`` and that is
the user; a real app takes the user from its session. Subscriptions and the VAPID key live in
``$SHMBUS_DEMO_PUSH_DIR`` (``scripts/demo`` sets it and removes it with the bus). Without the extra, :func:`wrap`
returns the app unchanged and the page hides the button (``GET /push/key`` is a 404).

No push service reachable: a browser subscribes only through its vendor's push service (Chrome: FCM), and a
server pushes only to it; offline, neither works. So a push the sender gives up on is published on
:data:`STATUS` (which device, why), where the page that registered that device says so; and with
``$SHMBUS_DEMO_PUSH_DEV`` (``scripts/demo --push-dev URL``) the demo also pushes to the development push service
(``shmbus push-dev``) at that URL: ``GET /push-dev`` names it and ``POST /push-dev`` hands the page one of its
subscriptions, which the page registers as it would its own (docs/push.md, "The development push service").
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import tempfile
import time
import urllib.request
from typing import Any

from shmbus import Bus

log = logging.getLogger("shmbus.demo")

STATUS = "/demo/push-status"  # pushes the sender gave up on: {"device", "outcome", "why", "global_id", "at"}
# The sender's defaults (10 s per attempt, 5 attempts: a minute for a push service that drops packets) are for a
# server that must not give up on a slow push service; the demo tells its page within 3 attempts of 5 s.
SEND_OPTIONS = {"timeout": 5.0, "max_attempts": 3}


def device_id(endpoint: str) -> str:
    """What the status names a device by: an endpoint is its device's secret (docs/push.md), its hash is not.
    The page computes the same (SHA-256, the first 16 hex digits)."""
    return hashlib.sha256(endpoint.encode()).hexdigest()[:16]


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


def _undelivered(bus: Bus) -> Any:
    def report(global_id: int, reg: Any, outcome: str, why: str) -> None:
        status = {"device": device_id(reg.endpoint), "outcome": outcome, "why": why, "global_id": global_id}
        bus.publish(STATUS, {**status, "at": time.time()}, max_backlog_size=50)

    return report


class DevRoutes:
    """ASGI: ``GET /push-dev`` -> ``{"url"}`` of the development push service (404 without one); ``POST
    /push-dev`` -> a new subscription of it for the demo's key (what ``pushManager.subscribe`` answers)."""

    def __init__(self, app: Any, url: str | None, public_key: str) -> None:
        self.app, self.url, self.public_key = app, url, public_key

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("path") != "/push-dev":
            await self.app(scope, receive, send)
            return
        if self.url is None:
            status, body = 404, {"error": "no development push service (scripts/demo --push-dev URL)"}
        elif scope.get("method") == "POST":
            status, body = await asyncio.to_thread(self._subscribe)
        else:
            status, body = 200, {"url": self.url}
        data = json.dumps(body).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": data})

    def _subscribe(self) -> tuple[int, Any]:
        req = urllib.request.Request(f"{self.url}/subscriptions", json.dumps({"applicationServerKey": self.public_key})
                                     .encode(), {"Content-Type": "application/json"}, method="POST")  # fmt: skip
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(req, timeout=5) as resp:
                return 200, json.loads(resp.read())
        except OSError as exc:
            return 502, {"error": f"the development push service at {self.url} did not answer: {exc}"}


def wrap(app: Any, bus: Bus, channel: str) -> tuple[Any, Any]:
    """``(app with /push/ routes, connector)``, or ``(app, None)`` without the push extra."""
    try:
        from shmbus.adapters.push import FileStore, PushApp, PushConnector
        from shmbus.adapters.push.devpolicy import DevAllowance
    except ImportError as exc:
        log.info("demo: no Web Push (%s); pip install -e '.[push]' to offer 'notify me'", exc)
        return app, None
    directory = os.environ.get("SHMBUS_DEMO_PUSH_DIR") or os.path.join(
        tempfile.gettempdir(), f"shmbus-demo-push-{bus.name}"
    )
    with contextlib.suppress(FileExistsError):
        os.makedirs(directory, mode=0o700)
    dev_url = os.environ.get("SHMBUS_DEMO_PUSH_DEV") or None
    dev = DevAllowance(dev_url) if dev_url else None  # the SSRF guard's defaults, plus that one service
    connector = PushConnector(bus, vapid=_vapid(directory), channels=channel,
                              store=FileStore(os.path.join(directory, "push")), on_undelivered=_undelivered(bus),
                              **SEND_OPTIONS, **(dev.connector_options() if dev else {})).start()  # fmt: skip
    extra = {"allow_endpoint": dev.allow_endpoint} if dev else {}
    app = PushApp(app, connector=connector, user_id_lookup=_user, **extra)
    return DevRoutes(app, dev.url if dev else None, connector.vapid.public_key), connector
