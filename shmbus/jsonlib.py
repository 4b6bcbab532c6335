"""JSON for every part of shmbus: orjson when installed (the ``fast`` extra, ~10-20x faster on small messages),
else the standard library, behind one API so no module carries its own "orjson if installed" switch.

``dumps`` is compact UTF-8 and strict (a value JSON cannot hold raises ``TypeError``); ``dumps_lenient`` turns such
values into text (for msgpack data shown on the JSON wire); ``loads`` takes bytes or str.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

__all__ = ["FAST", "dumps", "dumps_lenient", "loads"]

try:
    import orjson
except ImportError:  # pragma: no cover - exercised when orjson is absent
    orjson = None  # type: ignore[assignment]


def _as_text(obj: Any) -> Any:
    """``default`` for values JSON cannot hold: bytes as (lossy) UTF-8 text, sets and tuples as lists."""
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return bytes(obj).decode("utf-8", "replace")
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    return str(obj)


def _std_dumps(obj: Any) -> bytes:
    try:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    except ValueError as exc:  # NaN/Infinity, circular references: the same error class as orjson's
        raise TypeError(str(exc)) from None


def _std_dumps_lenient(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, default=_as_text).encode()


def _orjson_dumps_lenient(obj: Any) -> bytes:
    assert orjson is not None
    return orjson.dumps(obj, default=_as_text, option=orjson.OPT_NON_STR_KEYS)


#: True when orjson is in use.
FAST = orjson is not None
dumps: Callable[[Any], bytes] = orjson.dumps if orjson is not None else _std_dumps
loads: Callable[[bytes | str], Any] = orjson.loads if orjson is not None else json.loads
dumps_lenient: Callable[[Any], bytes] = _orjson_dumps_lenient if orjson is not None else _std_dumps_lenient
