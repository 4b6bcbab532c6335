"""What a transport accepts from a client: channel and pattern names, client ids, the subscription limit.

Every check answers bad input with a :class:`~shmbus.adapters.http.ProtocolError` (a 4xx with a reason, or the
WebSocket's error frame), never a crash; :func:`check_client_channel` is the middleware's own rule.
"""

from __future__ import annotations

from typing import Any

from shmbus.patterns import compile_pattern

from ..http import ProtocolError
from ..http.request import check_client_channel as check_client_channel
from ..http.request import check_subscribe_channel as check_subscribe_channel
from ..http.wire import CLIENT_ID_RE, INVALID_CLIENT_ID

#: Most subscriptions (channels + patterns) one connection may hold.
MAX_SUBSCRIPTIONS = 200
PATTERN_KINDS = ("prefix", "glob")


def check_pattern(pattern: Any, kind: str) -> str:
    """Validate a pattern from a client (:func:`check_client_channel`'s rules, then
    :func:`shmbus.patterns.compile_pattern` must accept it: no empty set ``[]``, no reversed range ``[z-a]``): a
    ProtocolError(400), never a crash."""
    check_client_channel(pattern, "pattern")
    if kind not in PATTERN_KINDS:
        raise ProtocolError(400, f"pattern kind must be one of {list(PATTERN_KINDS)}, got {str(kind)[:20]!r}")
    try:
        compile_pattern(pattern, kind)
    except ValueError as exc:
        raise ProtocolError(400, str(exc)) from None
    return pattern  # type: ignore[no-any-return]


def check_client_id(value: Any) -> str | None:
    """A client id from a query or a lookup: None when absent, else the middleware's pattern or a 400."""
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not CLIENT_ID_RE.match(value):
        raise ProtocolError(400, INVALID_CLIENT_ID)
    return value
