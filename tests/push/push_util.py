"""Helpers of the push tests (a module, not the conftest: conftest modules of other folders share the name)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from shmbus.adapters.push import PushConnector
from shmbus.adapters.push.subscriptions import parse_registration
from tests.harness.wait import wait_for

#: The endpoint policy of the tests: the local push service only (the default refuses IP literals).
LOCAL: Callable[[str], bool] = lambda url: url.startswith("http://127.0.0.1:")  # noqa: E731
#: The sender's address policy in the tests: loopback only (the default refuses it: SSRF).
LOOPBACK: Callable[[Any], bool] = lambda ip: ip.is_loopback  # noqa: E731


def register(
    connector: PushConnector, subscription: dict[str, Any], user_id: Any, topics: list[str], site_id: str | None = None
) -> None:
    reg = parse_registration(
        {"subscription": subscription, "topics": topics}, user_id, site_id, connector.pushes, LOCAL, time.time()
    )
    connector.store.add(reg)


def wait_leading(connector: PushConnector, timeout: float = 10.0) -> None:
    wait_for(lambda: connector.leading, timeout, "the connector to become the sender")
