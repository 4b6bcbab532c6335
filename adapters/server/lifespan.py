"""Running the wrapped app's ASGI lifespan (startup and shutdown) in the lean server."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

log = logging.getLogger("shmbus.adapters.server")


class Lifespan:
    """ASGI lifespan for the wrapped app: optional (an app that raises on it is taken not to support it)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None
        self.supported = True
        self.state: dict[str, Any] = {}

    async def _run(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": self.state}
        try:
            await self.app(scope, self.queue.get, self._send)
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError):
                raise
            self.supported = False
            log.debug("shmbus server: lifespan not supported by the app (%r)", exc)
        finally:
            self.events.put_nowait({"type": "_ended"})

    async def _send(self, message: dict[str, Any]) -> None:
        self.events.put_nowait(message)

    async def startup(self) -> dict[str, Any] | None:
        self.task = asyncio.get_running_loop().create_task(self._run())
        await self.queue.put({"type": "lifespan.startup"})
        ev = await self.events.get()
        if ev["type"] == "lifespan.startup.failed":
            raise RuntimeError(f"ASGI lifespan startup failed: {ev.get('message', '')}")
        if ev["type"] != "lifespan.startup.complete":
            self.supported = False
            return None
        return self.state

    async def shutdown(self) -> None:
        if not self.supported or self.task is None or self.task.done():
            return
        await self.queue.put({"type": "lifespan.shutdown"})
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.events.get(), 5.0)
