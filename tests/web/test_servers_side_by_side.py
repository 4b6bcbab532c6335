"""Issue 34, item 7: two gunicorns run with the config module do not share one control socket (gunicorn's
default is ``~/.gunicorn/gunicorn.ctl`` for all of them), and no example page makes the browser ask for a
``/favicon.ico`` the app does not serve (a 404 in every log)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests import harness
from tests.harness import REPO_ROOT

PROBE = "import shmbus.adapters.integrations.gunicorn as g; print(g.control_socket)"


def test_each_server_has_a_control_socket_of_its_own() -> None:
    harness.require_module("gunicorn", "pip install -e '.[web]', or run scripts/test")
    from gunicorn.config import Config

    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    paths = [
        subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True).stdout
        for _ in range(2)
    ]
    default = Config().settings["control_socket"].default if "control_socket" in Config().settings else None
    assert paths[0] != paths[1] and default not in paths, (paths, default)
    assert all(re.search(r"gunicorn-\d+\.ctl$", p.strip()) for p in paths), paths


def test_no_example_page_asks_for_a_favicon_nobody_serves() -> None:
    pages = [*(REPO_ROOT / "examples").rglob("*.html"), *(REPO_ROOT / "adapters" / "admin").rglob("*.html")]
    assert len(pages) >= 7
    missing = [str(p.relative_to(REPO_ROOT)) for p in pages if not re.search(r"<link rel=\"icon\"", p.read_text())]
    assert not missing, f"pages without an icon link (the browser asks for /favicon.ico: a 404): {missing}"
