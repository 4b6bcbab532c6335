"""tests/e2e/driver.mjs relays what a page logs, so browser tests can assert on it from Python."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.browser import CHROMIUM, require_browser, run_page
from tests.harness.procs import ProcessTracker, free_port, wait_http

pytestmark = pytest.mark.e2e

HELLO_PAGE = """<!doctype html>
<html><body><script>
console.log('SHMBUS:' + JSON.stringify({hello: 1}));
console.log('SHMBUS:' + JSON.stringify({query: location.search}));
console.log('not for the test');
console.log('SHMBUS:plain text');
setTimeout(() => { console.log('SHMBUS:DONE'); console.log('SHMBUS:"after done"'); }, 50);
</script></body></html>
"""

NEVER_DONE_PAGE = """<!doctype html>
<html><body><script>console.log('SHMBUS:{"started":true}');</script></body></html>
"""


@pytest.fixture
def static_site(procs: ProcessTracker, tmp_path: Path) -> str:
    """Serve tmp_path (with the test pages) over python's http.server on a free port."""
    require_browser()  # skip/fail before starting anything if the browser side is missing
    (tmp_path / "hello.html").write_text(HELLO_PAGE)
    (tmp_path / "never_done.html").write_text(NEVER_DONE_PAGE)
    port = free_port()
    server = procs.spawn(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/hello.html", timeout=15, proc=server)
    return url


def test_driver_relays_page_messages_until_done(static_site: str) -> None:
    query = "?bus=t1_abc&opts=a%20b&x=1"
    run = run_page(f"{static_site}/hello.html{query}", timeout=30)
    assert run.returncode == 0, run.stderr
    assert run.done
    # JSON payloads decoded, plain text kept as a string, nothing after DONE, other logs not relayed.
    assert run.messages == [{"hello": 1}, {"query": query}, "plain text"], run.stderr
    assert "not for the test" in run.stderr


@pytest.mark.parametrize("start_delay", [0, 4])
def test_driver_times_out_but_keeps_what_arrived(static_site: str, tmp_path: Path, start_delay: int) -> None:
    """A page that never logs DONE ends in a timeout (exit 3) that keeps what it logged. The page logs while it
    loads, and the budget counts from its DOMContentLoaded, so the verdict does not depend on how long Chromium
    takes to start: a start slower than the whole budget (``start_delay``, a wrapper that waits before starting
    it, as a loaded machine might) ends the same way."""
    env: dict[str, str | None] = {}
    if start_delay:
        slow = tmp_path / "slow-chromium"
        slow.write_text(f'#!/bin/sh\nsleep {start_delay}\nexec {CHROMIUM} "$@"\n')
        slow.chmod(0o755)
        env["SHMBUS_CHROMIUM"] = str(slow)
    run = run_page(f"{static_site}/never_done.html", timeout=3, env=env)
    assert run.returncode == 3, run.stderr
    assert not run.done
    assert run.messages == [{"started": True}]
    assert "timeout after 3000 ms" in run.stderr


def test_driver_reports_an_unloadable_page() -> None:
    require_browser()
    port = free_port()  # nothing listens there
    run = run_page(f"http://127.0.0.1:{port}/", timeout=10)
    assert run.returncode == 1, run.stderr
    assert run.messages == []
    assert "cannot load" in run.stderr
