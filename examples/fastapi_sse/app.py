"""Headlines over Server-Sent Events in FastAPI: ``POST /news/{topic}`` (JSON ``{"text": ...}``) publishes on
``/news/<topic>``; the page at ``/`` reads every topic through one ``EventSource`` on
``/sse?prefix=/news&events=message``.

One command (from the repository root)::

    gunicorn -k shmbus.adapters.server.uvicorn_worker.UvicornWorker --workers 2 --chdir examples/fastapi_sse app:app

Why ``events=message``: by default each SSE event is named after its channel, and a browser's ``EventSource``
only delivers named events to listeners added for that exact name. A ``prefix=`` or ``glob=`` stream names
channels nobody knows in advance, so the page asks for unnamed events (``onmessage``), with the channel in each
event's data. A stream resumes by itself after a reconnect (``Last-Event-ID``): nothing missed, nothing twice.
``SHMBUS_NAME`` names the bus (default ``fastapi-sse``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from fastapi import FastAPI, HTTPException
from fastapi.responses import FileResponse
from pydantic import BaseModel, Field

from shmbus import Bus
from shmbus.adapters.transports.sse import SSEApp

PAGE = Path(__file__).resolve().parent / "index.html"
TOPIC = re.compile(r"[a-z0-9-]{1,30}\Z")

bus = Bus(os.environ.get("SHMBUS_NAME", "fastapi-sse"), create=True)
api = FastAPI()


class Headline(BaseModel):
    text: str = Field(min_length=1, max_length=300)


@api.get("/")
def page() -> FileResponse:
    return FileResponse(PAGE)


@api.post("/news/{topic}")
def headline(topic: str, body: Headline) -> dict[str, int]:
    if not TOPIC.match(topic):
        raise HTTPException(400, "a topic is 1-30 characters of a-z, 0-9 and -")
    return {"id": bus.publish(f"/news/{topic}", {"text": body.text, "pid": os.getpid()})}


# GET /sse?... is the event stream; everything else goes to FastAPI.
app = SSEApp(api, bus=bus, path="/sse")
