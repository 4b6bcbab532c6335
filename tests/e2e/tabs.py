"""Many tabs in several browser contexts of one headless Chromium, for the shared-client tests.

:class:`Tabs` drives ``tabs.mjs`` over its stdin/stdout, one JSON command and one JSON answer per line: contexts
(each its own cookies, storage and shared workers: a separate browser profile as far as the page can tell), tabs
in them, JavaScript evaluated in a tab, tabs closed. :meth:`Tabs.wait_for` polls an expression until it is true.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from typing import Any

from tests.harness.browser import E2E_DIR, START_TIMEOUT, require_browser
from tests.harness.procs import kill_tree, spawn

__all__ = ["Tabs"]


class Tabs:
    """One Chromium; commands answered in order (one at a time: the tests drive it from one thread)."""

    def __init__(self) -> None:
        node = require_browser()
        argv = [node, str(E2E_DIR / "tabs.mjs"), f"--start-timeout={int(START_TIMEOUT * 1000)}"]
        self.proc = spawn(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.stderr: list[str] = []
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)

    def log(self, n: int = 4000) -> str:
        return "".join(self.stderr)[-n:]

    def command(self, **cmd: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"tabs.mjs exited (rc={self.proc.poll()}) on {cmd['op']}\n{self.log()}")
        out: dict[str, Any] = json.loads(line)
        if "error" in out:
            raise AssertionError(f"tabs.mjs: {cmd} failed: {out['error']}\n{self.log()}")
        return out

    def context(self) -> int:
        return int(self.command(op="context")["ctx"])

    def open(self, ctx: int, url: str) -> int:
        return int(self.command(op="open", ctx=ctx, url=url)["tab"])

    def eval(self, tab: int, js: str) -> Any:
        return self.command(op="eval", tab=tab, js=js)["value"]

    def close(self, tab: int) -> float:
        """Close ``tab``; the page-clock time (ms since the epoch) at which it was closed."""
        return float(self.command(op="close", tab=tab)["t"])

    def wait_for(self, tab: int, js: str, timeout: float = 60.0, what: str = "") -> Any:
        """Evaluate ``js`` in ``tab`` until it is truthy (its value), or fail after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.eval(tab, js)
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"tab {tab}: {what or js} not true within {timeout} s\n{self.log()}")
            time.sleep(0.1)

    def quit(self) -> None:
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            pass
        finally:
            kill_tree(self.proc)
