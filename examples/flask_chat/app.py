"""A chat in Flask: the page at ``/`` posts to ``/say``, which publishes on ``/chat``; every browser receives it.
A line sent "to the moderators" goes to ``/moderators`` instead, a channel only moderators may read: everyone may
write to it, and ``subscribe_allowed`` keeps everybody else from reading it (its messages, backlog and ids).
``/moderate`` makes this browser's session a moderator's (a stand-in for a real login).

One command (from the repository root; every worker attaches to the same bus)::

    gunicorn -c python:shmbus.adapters.integrations.gunicorn --workers 2 --chdir examples/flask_chat app:app

The gunicorn config module gives each worker 32 threads (a parked long poll holds one) and re-arms the bus after
the fork. The page loads the npm ``message-bus-client`` and its ajax adapter from the middleware itself
(``/message-bus/assets/``). ``SHMBUS_NAME`` names the bus (default ``flask-chat``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from flask import Flask, Response, redirect, request, send_file, session

from shmbus import Bus
from shmbus.adapters.integrations.flask import init_app

PAGE = Path(__file__).resolve().parent / "index.html"

bus = Bus(os.environ.get("SHMBUS_NAME", "flask-chat"), create=True)
app = Flask(__name__)
app.secret_key = os.environ.get("FLASK_SECRET_KEY", "example only: set FLASK_SECRET_KEY")
PRIVATE = "/moderators"


@app.get("/")
def page() -> Response:
    return send_file(PAGE)


@app.get("/moderate")
def moderate() -> Any:
    session["moderator"] = True
    return redirect("/")


@app.post("/say")
def say() -> tuple[dict[str, Any], int]:
    text = (request.form.get("text") or "").strip()[:500]
    if not text:
        return {"error": "say something"}, 400
    message = {"text": text, "pid": os.getpid(), "at": time.time()}
    if request.form.get("to") == "moderators":  # no id in the answer: it would count the moderators' messages
        bus.publish(PRIVATE, message, max_backlog_size=100)
        return {"sent": True}, 200
    return {"id": bus.publish("/chat", message, max_backlog_size=100)}, 200


def may_read(info: Any, channel: str) -> bool:
    """Called once per channel per poll, inside a Flask request context built from the poll: the session works."""
    return channel != PRIVATE or bool(session.get("moderator"))


# Serves /message-bus/... (polls and the browser client) before Flask sees the request.
init_app(app, bus=bus, subscribe_allowed=may_read)
