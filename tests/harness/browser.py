"""Drive a page in Debian's headless Chromium through tests/e2e/driver.mjs.

The page reports with ``console.log("SHMBUS:" + JSON.stringify(x))`` and ends with
``console.log("SHMBUS:DONE")``; ``run_page(url)`` returns the reported values in order.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any

from . import TESTS_DIR, skip_or_fail
from .procs import kill_tree, spawn

__all__ = ["CHROMIUM", "DRIVER", "E2E_DIR", "START_TIMEOUT", "PageRun", "require_browser", "run_page"]

E2E_DIR = TESTS_DIR / "e2e"
DRIVER = E2E_DIR / "driver.mjs"
CHROMIUM = os.environ.get("SHMBUS_CHROMIUM", "/usr/bin/chromium")


@dataclass
class PageRun:
    """What the driver saw: ``messages`` (decoded JSON values), ``returncode`` (0 = the page
    logged SHMBUS:DONE, 3 = timeout, 1 = browser/page failure) and ``stderr`` for diagnostics."""

    messages: list[Any]
    returncode: int
    stderr: str

    @property
    def done(self) -> bool:
        return self.returncode == 0


def require_browser() -> str:
    """Return the node binary, or skip_or_fail naming exactly what is missing and how to get it."""
    __tracebackhide__ = True
    if not os.access(CHROMIUM, os.X_OK):
        skip_or_fail(f"Chromium not found at {CHROMIUM} (apt-get install chromium, or run scripts/test)")
    node = shutil.which("node")
    if node is None:
        skip_or_fail("node not found on PATH (apt-get install nodejs npm, or run scripts/test)")
    if not (E2E_DIR / "node_modules" / "playwright-core" / "package.json").exists():
        skip_or_fail(f"playwright-core not installed in {E2E_DIR} (run scripts/test, or npm ci there)")
    return node


#: Seconds Chromium may take to start, and then the page to reach DOMContentLoaded (each): not the page's budget,
#: so a loaded machine's slow browser start does not eat a test's ``timeout``.
START_TIMEOUT = 60.0


def run_page(
    url: str, timeout: float = 30.0, env: dict[str, str | None] | None = None, screenshot: str | None = None
) -> PageRun:
    """Open ``url`` (query string passed through unchanged) and collect what the page reports until it logs
    SHMBUS:DONE or ``timeout`` seconds pass, counted from the page's DOMContentLoaded (what its scripts logged
    while loading is kept); ``screenshot``: a PNG path saved at DONE."""
    node = require_browser()
    argv = [node, str(DRIVER), url, f"--timeout={int(timeout * 1000)}", f"--start-timeout={int(START_TIMEOUT * 1000)}"]
    if screenshot:
        argv.append(f"--screenshot={screenshot}")
    proc = spawn(
        argv,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout + 2 * START_TIMEOUT + 30)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        raise AssertionError(f"driver.mjs did not exit within {timeout + 2 * START_TIMEOUT + 30}s for {url}") from None
    finally:
        kill_tree(proc)
    messages = []
    for line in out.splitlines():
        if line.strip():
            try:
                messages.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise AssertionError(f"driver printed non-JSON {line!r}: {exc}\nstderr:\n{err}") from None
    return PageRun(messages=messages, returncode=proc.returncode, stderr=err)
