"""Starting tests/web/webapps.py under a real server: one helper for every test that needs one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests import harness

WEB_DIR = Path(__file__).resolve().parent
GUNICORN_CONFIG = "python:shmbus.adapters.integrations.gunicorn"


def env_for(bus_name: str, **opts: Any) -> dict[str, str]:
    """The environment webapps.py reads: the bus name and the middleware's options (JSON)."""
    return {"SHMBUS_TEST_BUS": bus_name, "SHMBUS_TEST_OPTS": json.dumps(opts)}


def app_spec(worker_class: str) -> str:
    """The app of webapps.py for a gunicorn worker class: ASGI for uvicorn's and shmbus's lean worker, else WSGI."""
    return "webapps:asgi_app" if worker_class.startswith(("uvicorn", "shmbus.")) else "webapps:wsgi_app"


def start(
    kind: str,
    procs: Any,
    bus_name: str,
    worker_class: str = "gthread",
    workers: int = 2,
    extra_args: tuple[str, ...] = (),
    **opts: Any,
) -> Any:
    """``kind`` "uvicorn" (one process, the ASGI app) or "gunicorn" (``worker_class``: the WSGI app, or the ASGI
    app under a uvicorn worker class); ``opts`` are the middleware's options."""
    env = env_for(bus_name, **opts)
    if kind == "uvicorn":
        return procs.uvicorn_server("webapps:asgi_app", workers=1, env=env, app_dir=WEB_DIR)
    spec = app_spec(worker_class)
    if worker_class == "gevent":
        harness.require_module("gevent")
    return procs.gunicorn_server(
        spec,
        workers=workers,
        worker_class=worker_class,
        config=GUNICORN_CONFIG,
        env=env,
        app_dir=WEB_DIR,
        extra_args=extra_args,
    )
