"""guble's text protocol, sans I/O: parse client commands, format messages and status lines.

Why separate: the grammar is where hostile input lands, so it is pure functions (tested with hypothesis: they
return a command or raise :class:`BadRequest`, nothing else), shared by the WebSocket app and the CLI client.

Client -> server (one WebSocket frame each)::

    > <path> [<publisherMessageId>]        send: header lines (a JSON object), an empty line, the body
    + <path> [<startId>[,<maxCount>]]      receive (``+ /foo 0 20``, with a space, is accepted too)
    - <path>                               cancel
    replay <lastSequenceId>[,<maxCount>] <path>

Server -> client: messages (:func:`format_message`) and status lines ``#<name> <text>`` / ``!<name> <text>``, each
optionally followed by a line of JSON (:func:`notification`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

__all__ = [
    "BadRequest",
    "Cancel",
    "Command",
    "GubleMessage",
    "Receive",
    "Replay",
    "Send",
    "format_message",
    "iso_time",
    "message_data",
    "notification",
    "parse_command",
    "unpack",
]

#: The key that marks message data published through guble (it carries the publisher fields and headers).
GUBLE_KEY = "guble"
#: Longest publisher message id / path accepted (characters).
MAX_ID_LENGTH = 256
MAX_PATH_LENGTH = 160
_INT = re.compile(r"-?[0-9]{1,18}\Z")
_ID = re.compile(r"[^\s,]{1,256}\Z")


class BadRequest(ValueError):
    """A command the server cannot accept; the text goes after ``!error-bad-request``."""


@dataclass(frozen=True)
class Send:
    path: str
    message_id: str
    headers: str  # the header JSON as the client sent it ("" for none)
    body: str


@dataclass(frozen=True)
class Receive:
    path: str
    start: int | None  # None: future messages only
    count: int | None  # None: then live; n: replay at most n and stop


@dataclass(frozen=True)
class Cancel:
    path: str


@dataclass(frozen=True)
class Replay:
    path: str
    after: int  # sequence ids > after (negative: all)
    count: int | None  # the newest ``count`` of them


Command = Send | Receive | Cancel | Replay


def _path(token: str) -> str:
    if not token.startswith("/"):
        raise BadRequest(f"a path must start with '/': {token[:80]!r}")
    if len(token) > MAX_PATH_LENGTH:
        raise BadRequest(f"path longer than {MAX_PATH_LENGTH} characters")
    if "," in token:
        raise BadRequest(f"a path must not contain commas (a message's header line is comma separated): {token[:80]!r}")
    return token


def _int(token: str, what: str) -> int:
    if not _INT.match(token):
        raise BadRequest(f"{what} must be an integer, got {token[:40]!r}")
    return int(token)


def parse_command(frame: str) -> Command:
    """Parse one client frame; :class:`BadRequest` (with the reason) for anything else."""
    if not frame:
        raise BadRequest("empty command")
    first, _, rest = frame.partition("\n")
    first = first.rstrip("\r")
    name, _, arg = first.partition(" ")
    args = arg.split()
    if name == ">":
        if not 1 <= len(args) <= 2:
            raise BadRequest("send needs '> <path> [<publisherMessageId>]'")
        path = _path(args[0])
        mid = args[1] if len(args) == 2 else ""
        if mid and not _ID.match(mid):
            raise BadRequest("publisherMessageId must not contain commas or spaces (at most 256 characters)")
        headers, body = _split_send(rest)
        return Send(path, mid, headers, body)
    if rest.strip():
        raise BadRequest(f"'{name[:20]}' takes no body")
    if name == "+":
        if not 1 <= len(args) <= 3:
            raise BadRequest("receive needs '+ <path> [<startId>[,<maxCount>]]'")
        path = _path(args[0])
        nums = ",".join(args[1:]).split(",") if len(args) > 1 else []
        if len(nums) > 2 or any(not n for n in nums):
            raise BadRequest("receive needs '+ <path> [<startId>[,<maxCount>]]'")
        start = _int(nums[0], "startId") if nums else None
        count = _int(nums[1], "maxCount") if len(nums) == 2 else None
        if count is not None and count < 1:
            raise BadRequest("maxCount must be at least 1")
        return Receive(path, start, count)
    if name == "-":
        if len(args) != 1:
            raise BadRequest("cancel needs '- <path>'")
        return Cancel(_path(args[0]))
    if name == "replay":
        if len(args) != 2:
            raise BadRequest("replay needs 'replay <lastSequenceId>[,<maxCount>] <path>'")
        nums = args[0].split(",")
        if len(nums) > 2:
            raise BadRequest("replay needs 'replay <lastSequenceId>[,<maxCount>] <path>'")
        after = _int(nums[0], "lastSequenceId")
        count = _int(nums[1], "maxCount") if len(nums) == 2 else None
        if count is not None and count < 1:
            raise BadRequest("maxCount must be at least 1")
        return Replay(_path(args[1]), after, count)
    raise BadRequest(f"unknown command '{name[:40]}'")


def _split_send(rest: str) -> tuple[str, str]:
    """Header lines up to an empty line, then the body. Without an empty line, guble's own client form: one
    header line, then the body."""
    lines = rest.split("\n")
    for i, line in enumerate(lines):
        if line.rstrip("\r") == "":
            header_lines, body = lines[:i], "\n".join(lines[i + 1 :])
            break
    else:
        header_lines, body = lines[:1], "\n".join(lines[1:])
    headers = "\n".join(h.rstrip("\r") for h in header_lines).strip()
    if headers:
        try:
            parsed = json.loads(headers)
        except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser's limit
            raise BadRequest("the header must be a JSON object (not nested too deeply)") from None
        if not isinstance(parsed, dict):
            raise BadRequest("the header must be a JSON object")
        if "\n" in headers:
            headers = json.dumps(parsed)  # one line on the wire
    return headers, body


# ---------------------------------------------------------------------------------------------------- messages
def iso_time(timestamp: float) -> str:
    """guble's publishing time: ISO 8601 with the server's UTC offset, to the second."""
    return datetime.fromtimestamp(timestamp).astimezone().isoformat(timespec="seconds")


def message_data(user_id: str, application_id: str, message_id: str, time: str, headers: str, body: str) -> Any:
    """What a guble send stores on the bus: the body plus the publisher fields and the header JSON, so any
    process (another transport, ``bus.subscribe``) can read them."""
    return {
        GUBLE_KEY: {"user_id": user_id, "application_id": application_id, "message_id": message_id, "time": time},
        "headers": headers,
        "body": body,
    }


@dataclass
class GubleMessage:
    """A bus message in guble's terms."""

    path: str
    sequence_id: int
    user_id: str = ""
    application_id: str = ""
    message_id: str = ""
    time: str = ""
    headers: str = ""
    body: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def unpack(channel: str, message_id: int, data: Any, timestamp: float) -> GubleMessage:
    """A bus message as guble shows it: guble-published data gives its fields back; anything else becomes the
    body (a string as is, other data as JSON) with no publisher fields."""
    if isinstance(data, dict) and isinstance(data.get(GUBLE_KEY), dict) and isinstance(data.get("body"), str):
        meta = data[GUBLE_KEY]
        return GubleMessage(
            channel,
            message_id,
            _field(meta.get("user_id")),
            _field(meta.get("application_id")),
            _field(meta.get("message_id")),
            _field(meta.get("time")) or iso_time(timestamp),
            data["headers"] if isinstance(data.get("headers"), str) else "",
            data["body"],
        )
    body = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return GubleMessage(channel, message_id, time=iso_time(timestamp), body=body)


def _field(value: Any) -> str:
    """A publisher field for the comma-separated header line: never a comma or a line break."""
    text = "" if value is None else str(value)
    return text.replace(",", " ").replace("\n", " ").replace("\r", " ")[:MAX_ID_LENGTH]


def format_message(m: GubleMessage) -> str:
    """``<path>,<sequenceId>,<publisherUserId>,<publisherApplicationId>,<publisherMessageId>,<time>``, the header
    JSON line (empty when none), then the body."""
    head = ",".join(
        (m.path, str(m.sequence_id), _field(m.user_id), _field(m.application_id), _field(m.message_id), m.time)
    )
    return f"{head}\n{m.headers}\n{m.body}"


def notification(name: str, text: str = "", data: Any = None, *, error: bool | None = None) -> str:
    """``#name text`` (``!name text`` for errors: ``error``, by default a name starting with ``error-``), plus a
    JSON line when ``data`` is given."""
    if error is None:
        error = name.startswith("error-")
    line = ("!" if error else "#") + name + (" " + text.replace("\n", " ") if text else "")
    return line if data is None else line + "\n" + json.dumps(data, ensure_ascii=False)
