"""A refused channel with the real npm ``message-bus-client`` in headless Chromium, through gunicorn with 2 workers
(each server shell of test_browser.py, streaming and ``enableChunkedEncoding = false``).

The server's ``subscribe_allowed`` refuses ``/private...`` (e2e_app.py). The page (``refused_page.html``)
subscribes to a refused channel alone, then to an allowed one too, both from id 0, and messages are published on
both: the allowed channel gets every message once and in order, the refused one nothing (no message, and its
position never moves: no ``/__status`` reached it); every answer names it in ``shmbus-refused-channels``; and a
poll of the refused channel alone waits like any poll (one request in 1.5 s, no tight re-poll loop).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shmbus import Bus
from tests.harness.browser import run_page

from .test_browser import SHELLS, bus, require_client, start_server

__all__ = ["bus"]  # the fixture, shared with test_browser.py

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

K = 10


@pytest.mark.parametrize("shell", list(SHELLS))
@pytest.mark.parametrize("mode", ["stream", "nochunk"])
def test_npm_client_hears_nothing_of_a_refused_channel(
    mode: str, shell: str, bus: Bus, procs: Any, tmp_path: Path
) -> None:
    require_client()
    log_path = tmp_path / "requests.jsonl"
    log_path.touch()
    server = start_server(procs, bus.name, shell, log_path)
    channel = f"/e2e/refused-{mode}"
    run = run_page(f"{server.url}/refused-page?mode={mode}&ch={channel}&k={K}", timeout=60)
    server_log = f"\n--- driver stderr ---\n{run.stderr[-3000:]}\n--- server log ---\n{server.log()[-3000:]}"
    assert run.done, f"page did not finish (rc={run.returncode}){server_log}"
    assert len(run.messages) == 1 and "error" not in run.messages[0], f"{run.messages}{server_log}"
    res = run.messages[0]
    assert [r["i"] for r in res["received"]] == list(range(K)), res["received"]
    assert [r["id"] for r in res["received"]] == list(range(1, K + 1))
    assert res["receivedPrivate"] == [], "a message of the refused channel reached the page"
    assert res["privateLastId"] == 0, "the refused channel's position moved (a /__status reached the client)"
    assert bus.last_id("/private" + channel) == K, "the refused channel's messages were published"
    # 0: aborted by the client (a new subscription re-polls, stop() ends the last poll); never an error status
    assert all(x["status"] in (200, 0) for x in res["xhrs"]), res["xhrs"]
    # every answer names the refused channel (a long poll aborted while parked had no head yet)
    named = [x["refused"] for x in res["xhrs"] if x["status"] == 200 or mode == "stream"]
    assert named and named == ["/private" + channel] * len(named), res["xhrs"]
    assert res["aloneXhrs"] == 1, f"the refused channel alone cost {res['aloneXhrs']} polls in 1.5 s: {res['xhrs']}"
