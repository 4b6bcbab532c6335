"""The WebSocket protocol's JSON, sans-IO: a client's command parsed and its fields checked, and the frames the
server answers with. Bad input of any kind is a :class:`BadInput` whose text the client gets in an error frame."""

from __future__ import annotations

import json
from typing import Any

from ..http import MAX_ID
from .validation import PATTERN_KINDS, check_pattern, check_subscribe_channel

__all__ = ["BadInput", "dumps", "frame", "ids_field", "int_field", "parse_command", "target"]

#: Longest ``ref`` a client may send (echoed in the reply).
MAX_REF = 100


class BadInput(Exception):
    """The client's command is wrong; the text says why."""


def dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def frame(ref: Any, **fields: Any) -> str:
    """A server frame (``op`` and its fields), echoing the command's ``ref`` when it had one."""
    if ref is not None:
        fields["ref"] = ref
    return dumps(fields)


def parse_command(text: str) -> dict[str, Any]:
    """A client's frame as a command object with a valid (or no) ``ref``."""
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser's limit
        raise BadInput("invalid JSON (or nested too deeply)")
    if not isinstance(obj, dict):
        raise BadInput("a command must be a JSON object with an 'op'")
    ref = obj.get("ref")
    if ref is not None and not (isinstance(ref, (str, int)) and not isinstance(ref, bool) and len(str(ref)) <= MAX_REF):
        raise BadInput(f"ref must be a string or integer (at most {MAX_REF} characters)")
    return obj


def int_field(
    obj: dict[str, Any], key: str, *, default: int | None = None, lo: int = -MAX_ID, hi: int = MAX_ID
) -> int | None:
    v = obj.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise BadInput(f"{key} must be an integer between {lo} and {hi}")
    return v


def ids_field(obj: dict[str, Any], key: str) -> list[Any] | None:
    v = obj.get(key)
    if v is None:
        return None
    if not isinstance(v, list) or not v or not all(isinstance(x, (int, str)) and not isinstance(x, bool) for x in v):
        raise BadInput(f"{key} must be a non-empty list of integers or strings")
    return v


def target(obj: dict[str, Any]) -> tuple[str | None, tuple[str, str] | None]:
    """The command's ``channel``, or its ``pattern`` and ``kind`` (exactly one of them)."""
    channel, pattern = obj.get("channel"), obj.get("pattern")
    if (channel is None) == (pattern is None):
        raise BadInput("give exactly one of 'channel' or 'pattern'")
    if channel is not None:
        return check_subscribe_channel(channel), None
    kind = obj.get("kind", "prefix")
    if kind not in PATTERN_KINDS:
        raise BadInput(f"kind must be one of {list(PATTERN_KINDS)}")
    return None, (check_pattern(pattern, kind), kind)
