"""Fixtures for tests/server: gunicorn with ``shmbus.adapters.server.GunicornWorker`` on a shared bus.

``shared_bus``  a Bus on ``bus_name`` created before the servers attach (destroyed at teardown)
``parser_kind`` the in-process tests' parser, ``httptools`` or ``pure`` (tests/server/rig.py is their rig)
``mw``          the middleware on ``shared_bus`` around the rig's echo app
``start``       factory ``start(app="server_apps:mw_app", workers=2, config_text=None, parser=None, **opts)``
                -> the harness Server (killed at teardown); ``parser="pure"`` forces the built-in parser.
Raw HTTP helpers come from tests/web/rawhttp.py.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from shmbus import Bus
from shmbus.adapters.asgi import MessageBusMiddleware
from shmbus.adapters.server import parser, reader
from tests.harness import skip_or_fail

from .rig import LONG_POLL, EchoApp

SERVER_DIR = Path(__file__).resolve().parent
WEB_DIR = SERVER_DIR.parent / "web"

WORKER = "shmbus.adapters.server.GunicornWorker"


@pytest.fixture
def shared_bus(bus_name: str) -> Iterator[Bus]:
    b = Bus(bus_name, keepalive_interval=0, create=True)
    b.last_id("/x")  # create the segment before the servers attach
    try:
        yield b
    finally:
        b.destroy()


@pytest.fixture
def start(procs: Any, bus_name: str, shared_bus: Bus, tmp_path: Path) -> Callable[..., Any]:
    def go(
        app: str = "server_apps:mw_app",
        workers: int = 2,
        config_text: str | None = None,
        parser: str | None = None,
        extra_args: tuple[str, ...] = (),
        health_path: str = "/pid",
        **opts: Any,
    ) -> Any:
        env = {"SHMBUS_TEST_BUS": bus_name, "SHMBUS_TEST_OPTS": json.dumps(opts), "SHMBUS_SERVER_PARSER": parser}
        config = None
        if config_text is not None:
            config = tmp_path / "gunicorn_conf.py"
            config.write_text(config_text)
        return procs.gunicorn_server(
            app,
            workers=workers,
            worker_class=WORKER,
            config=config,
            env=env,
            app_dir=SERVER_DIR,
            extra_args=extra_args,
            health_path=health_path,
        )

    return go


@pytest.fixture(params=["httptools", "pure"])
def parser_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The connection's parser, as ``SHMBUS_SERVER_PARSER`` would choose it at import."""
    if request.param == "pure":
        monkeypatch.setattr(reader, "Parser", parser.HttpRequestParser)
        monkeypatch.setattr(reader, "ParserError", parser.HttpParserError)
        monkeypatch.setattr(reader, "ParserUpgrade", parser.HttpParserUpgrade)
    elif os.environ.get("SHMBUS_SERVER_PARSER") == "pure":
        pytest.skip("SHMBUS_SERVER_PARSER=pure: the server was imported without httptools")
    elif parser.PARSER != "httptools":
        skip_or_fail("httptools is not installed (the web extra)")
    return cast(str, request.param)


@pytest.fixture
def mw(shared_bus: Bus) -> Iterator[MessageBusMiddleware]:
    """The middleware on this test's own bus (tests/server/conftest.py), its tap closed at the end."""
    m = MessageBusMiddleware(EchoApp(), bus=shared_bus, long_polling_interval=LONG_POLL)
    try:
        yield m
    finally:
        m.close()
