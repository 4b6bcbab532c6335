"""Bytes of the message_bus wire: limits, headers, errors, responses and the framing of replies."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shmbus import jsonlib
from shmbus.message import Message

#: Largest accepted request body (bytes); larger bodies get ``413``.
MAX_BODY_SIZE = 64 * 1024
#: Most channels one poll may name; more get ``400``.
MAX_CHANNELS_PER_POLL = 200
#: Largest absolute id accepted (JavaScript's ``Number.MAX_SAFE_INTEGER``); larger ids get ``400``.
MAX_ID = 2**53 - 1
MAX_CLIENT_ID_LENGTH = 128
#: Bytes queued for one streaming client that is not reading before it is dropped.
MAX_STREAM_BUFFER = 1 << 20

SEPARATOR = b"\r\n|\r\n"
_ESCAPED = b"\r\n||\r\n"
JSON_CONTENT_TYPE = "application/json; charset=utf-8"
STREAM_CONTENT_TYPE = "text/plain; charset=utf-8"
#: Headers of every poll/OPTIONS response, in the gem's order (extra headers follow).
BASE_HEADERS: list[tuple[str, str]] = [
    ("cache-control", "must-revalidate, private, max-age=0"),
    ("content-type", JSON_CONTENT_TYPE),
    ("pragma", "no-cache"),
    ("expires", "0"),
]
#: Headers of a streamed response (transfer-encoding is left to the server, which frames the chunks).
STREAM_HEADERS: list[tuple[str, str]] = [
    ("cache-control", "must-revalidate, private, max-age=0"),
    ("pragma", "no-cache"),
    ("expires", "0"),
    ("content-type", STREAM_CONTENT_TYPE),
    ("x-content-type-options", "nosniff"),
]
_TEXT = [("content-type", "text/plain; charset=utf-8")]

#: A valid client id (route segment, ``?client_id=``); :data:`INVALID_CLIENT_ID` is the 400 reason otherwise.
CLIENT_ID_RE = re.compile(rf"[A-Za-z0-9._~-]{{1,{MAX_CLIENT_ID_LENGTH}}}\Z")
INVALID_CLIENT_ID = f"invalid client id (1-{MAX_CLIENT_ID_LENGTH} characters of A-Z a-z 0-9 . _ ~ -)"
_STATUS_HEAD = b'{"global_id":-1,"message_id":-1,"channel":"/__status","data":'


# ---------------------------------------------------------------------------------------------------- errors
class ProtocolError(Exception):
    """A request the protocol refuses: ``status`` (4xx) and a short ``reason`` sent as the body."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"{status} {reason}")
        self.status = status
        self.reason = reason

    #: Statuses sent before the request body was read: the connection cannot carry another request.
    UNREAD_BODY = frozenset({408, 411, 413})

    def response(self) -> Response:
        headers = list(_TEXT)
        if self.status in self.UNREAD_BODY:
            headers.append(("connection", "close"))
        return Response(self.status, headers, self.reason.encode())


@dataclass
class Response:
    """A complete response: status code, headers (lower-case names) and body."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes


_REASONS = {
    200: "OK",
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    411: "Length Required",
    413: "Content Too Large",
    415: "Unsupported Media Type",
    500: "Internal Server Error",
}

#: The answer to a chunked request body on a message-bus route: its chunk sizes are the client's word (one of
#: ``ffffffffffffffff`` would make the server wait for it), and no message_bus client sends one.
CHUNKED_BODY_REFUSED = "message-bus requests must send Content-Length, not a chunked body"


def status_line(code: int) -> str:
    """``"200 OK"`` for WSGI's ``start_response``."""
    from http import HTTPStatus

    reason = _REASONS.get(code)
    if reason is None:
        try:
            reason = HTTPStatus(code).phrase
        except ValueError:
            reason = "Unknown"
    return f"{code} {reason}"


def triple_response(result: Any) -> Response:
    """``on_middleware_error``'s ``(status, headers, body)`` as a Response."""
    status, headers, body = result
    code = int(str(status).split(" ", 1)[0])
    pairs = list(headers.items()) if hasattr(headers, "items") else list(headers or ())
    if isinstance(body, str):
        data = body.encode()
    elif isinstance(body, (bytes, bytearray)):
        data = bytes(body)
    else:
        data = b"".join(b if isinstance(b, bytes) else str(b).encode() for b in body)
    pairs = [(str(k), str(v)) for k, v in pairs if str(k).lower() != "content-length"]
    return Response(code, pairs, data)


# ---------------------------------------------------------------------------------------------------- framing
_channel_json: dict[str, bytes] = {}


def _chan(channel: str) -> bytes:
    b = _channel_json.get(channel)
    if b is None:
        b = jsonlib.dumps(channel)
        if len(_channel_json) > 20_000:
            _channel_json.clear()
        _channel_json[channel] = b
    return b


def encode_message(msg: Message, is_json: bool = True) -> bytes:
    """The wire object of one message. With the JSON codec ``msg.raw`` is spliced in as is (no decode)."""
    data = msg.raw if is_json else jsonlib.dumps_lenient(msg.data)
    return b'{"global_id":%d,"message_id":%d,"channel":%s,"data":%s}' % (
        msg.global_id,
        msg.message_id,
        _chan(msg.channel),
        data,
    )


def encode_status(status: Mapping[str, int]) -> bytes:
    return _STATUS_HEAD + jsonlib.dumps(dict(status)) + b"}"


def escape_chunk(payload: bytes) -> bytes:
    """Escape the separator inside a payload (cannot happen with JSON; kept for exactness)."""
    if SEPARATOR in payload:
        payload = payload.replace(SEPARATOR, _ESCAPED)
    return payload


def frame_chunk(payload: bytes) -> bytes:
    """One streamed piece: the (escaped) array followed by the separator. The server adds HTTP chunking."""
    return escape_chunk(payload) + SEPARATOR


EMPTY = b"[]"
EMPTY_CHUNK = frame_chunk(EMPTY)
