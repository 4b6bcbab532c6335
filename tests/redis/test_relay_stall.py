"""The bridge kit's stall check on its own (no server): a relay that holds the election and makes no step reads
"stalled" in health and the metrics (issue 31, 1)."""

from __future__ import annotations

import logging
import os

import pytest

from shmbus.adapters.bridge.status import BridgeStatus
from shmbus.figures import RELAY_STATES


def test_a_relay_without_a_step_for_stall_after_reads_stalled_and_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The stall is judged by whoever reads the status (a stuck relay thread cannot say so), against the relay's
    last step, on the clock passed in: no sleeping."""
    status = BridgeStatus("redis", "redis://x", logging.getLogger("test.stall"))
    relay = status.relay
    relay.stall_after = 30.0
    relay.holding, relay.state = True, "relaying"
    relay.step(1000.0)
    at = relay.stepped_at
    assert relay.current(at + 29.0) == "relaying"
    with caplog.at_level(logging.INFO, "test.stall"):
        assert relay.current(at + 31.0) == "stalled"
        assert relay.current(at + 32.0) == "stalled"
        relay.step(at + 33.0)
    assert [r.getMessage().split(": ", 1)[1] for r in caplog.records] == [
        f"relay (pid {os.getpid()}) made no progress for 31 s (state relaying -> stalled)",
        f"relay (pid {os.getpid()}) progresses again",
    ]
    assert relay.current(relay.stepped_at + 1.0) == "relaying"
    relay.holding = False  # a process that does not hold the election is never stalled: it is standby
    assert relay.current(relay.stepped_at + 100.0) == "relaying"
    assert "stalled" in RELAY_STATES and RELAY_STATES.index("off") == 5  # the slots' old indexes keep their meaning
