"""A callback that records what it gets, and waits for it (the client tests' eyes)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from shmbus.client import Message


class Recorder:
    """``Recorder()`` is a callback: ``rec.messages`` in arrival order, ``rec.wait(n)`` until n arrived."""

    def __init__(self, fail: bool = False) -> None:
        self.messages: list[Message] = []
        self.times: list[float] = []
        self.fail = fail
        self._cond = threading.Condition()

    def __call__(self, msg: Message) -> None:
        with self._cond:
            self.messages.append(msg)
            self.times.append(time.monotonic())
            self._cond.notify_all()
        if self.fail:
            raise RuntimeError(f"this callback always fails ({msg.channel} #{msg.message_id})")

    def wait(self, n: int, timeout: float = 15.0) -> list[Message]:
        with self._cond:
            ok = self._cond.wait_for(lambda: len(self.messages) >= n, timeout)
        assert ok, f"{len(self.messages)} of {n} messages after {timeout} s: {self.messages}"
        return list(self.messages)

    @property
    def ids(self) -> list[int]:
        return [m.message_id for m in self.messages]

    @property
    def data(self) -> list[Any]:
        return [m.data for m in self.messages]


def wait_until(pred: Callable[[], Any], timeout: float = 15.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def resolved(client: Any, channel: str, timeout: float = 15.0, subs: Iterable[Any] = ()) -> int:
    """Wait until ``channel``'s position is known (the server's status reached the client), and each of ``subs``
    (the subscriptions ``subscribe`` returned) has its own; that position. A second subscription at -1 made after
    the first was resolved gets its own resolving request, so the channel's position alone does not say it is in."""
    subs = list(subs)
    wait_until(
        lambda: client.positions.get(channel, -1) >= 0 and all(s.resolved for s in subs),
        timeout,
        f"the position of {channel}",
    )
    return int(client.positions[channel])
