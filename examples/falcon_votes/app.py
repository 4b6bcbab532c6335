"""Live votes in Falcon (WSGI): the page at ``/`` posts to ``/vote``, which publishes on ``/votes``; every open
page counts every vote, including the ones cast before it opened (it subscribes from the retained backlog).

One command (from the repository root)::

    gunicorn -c python:shmbus.adapters.integrations.gunicorn --workers 2 --chdir examples/falcon_votes app:app

``mount`` puts the message bus middleware in front of Falcon (bus routes never reach Falcon's routing), and the
page loads the browser client from ``/message-bus/assets/``. ``SHMBUS_NAME`` names the bus (default
``falcon-votes``). The same code serves ``falcon.asgi.App`` under an ASGI worker (make the responders ``async``).
"""

from __future__ import annotations

import os
from pathlib import Path

import falcon

from shmbus import Bus
from shmbus.adapters.integrations.falcon import mount

PAGE = Path(__file__).resolve().parent / "index.html"
OPTIONS = ("tabs", "spaces")

bus = Bus(os.environ.get("SHMBUS_NAME", "falcon-votes"), create=True)


class Page:
    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.content_type = falcon.MEDIA_HTML
        resp.data = PAGE.read_bytes()


class Vote:
    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        choice = req.get_param("choice", required=True)
        if choice not in OPTIONS:
            raise falcon.HTTPBadRequest(title="unknown choice", description=f"choose one of {OPTIONS}")
        # the backlog keeps every vote (up to 10,000), so a page opened later still counts them all
        resp.media = {"id": bus.publish("/votes", {"choice": choice, "pid": os.getpid()}, max_backlog_size=10_000)}


api = falcon.App()
api.add_route("/", Page())
api.add_route("/vote", Vote())
app = mount(api, bus=bus)
