"""Sans-IO core of the message_bus HTTP protocol (no sockets, no framework; shared by the WSGI and ASGI shells).

In the style of h11: this module only turns request data into decisions and bytes; the shells
(:mod:`shmbus.adapters.wsgi`, :mod:`shmbus.adapters.asgi`) read bodies, wait and write.

Wire behaviour (written out in docs/protocol.md): ``POST <base_route>message-bus/<client_id>/poll`` with a JSON or
form body mapping channel -> last seen id plus ``__seq``; ``?dlp=t`` disables long polling; a ``Dont-Chunk``
header disables streaming. Replies are JSON arrays of ``{"global_id","message_id","channel","data"}`` objects,
optionally ending with a ``/__status`` pseudo-message; streamed replies are ``text/plain`` chunks, each an array
followed by ``\\r\\n|\\r\\n`` (any such sequence inside the array would be escaped as ``\\r\\n||\\r\\n``).

Deliberate differences from the gem (its bugs, fixed):

* every bad request gets a precise 4xx with a short text reason instead of a 500 (malformed JSON/form, invalid
  UTF-8, ids that are not integers — including ``"abc"``, which the gem read as 0 —, ids beyond
  ``±(2**53-1)``, more than :data:`MAX_CHANNELS_PER_POLL` channels, bodies over :data:`MAX_BODY_SIZE`, a missing
  or malformed client id, unknown routes under the base route, unsupported body content types);
* a message published while a request is between its backlog read and parking is delivered at once (the
  request registers to receive live messages *before* it reads the backlog), and live pushes never repeat an
  id the client already got (per client, per channel, the last delivered id is tracked);
* a stale request (lower ``__seq``) never unregisters a newer one (removal is by identity, not by id);
* ``/global/`` channels are delivered live to clients that have a site id;
* a channel whose backlog was trimmed past the client's id gets a ``/__status`` entry (the loss is reported),
  live messages a client may not see (targeting, client message filters) produce a ``/__status`` entry in the
  reply that ends the request (as withheld backlog messages do), and a bus ``reset()`` while a request is
  parked answers it with a status of 0 for every channel so the client re-reads the new epoch from its start;
* ``dlp`` must be a real query parameter (``dlp=t``), and HTTP/1.0 requests are never streamed (the real
  request version is used);
* routes: only ``<P><client_id>``, ``<P><client_id>/`` and ``<P><client_id>/poll`` are polls (the gem accepted
  any path below the client id); client ids are 1-128 characters of ``[A-Za-z0-9._~-]``.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, fields
from typing import Any
from urllib.parse import parse_qsl

from shmbus.bus import MAX_CHANNEL_BYTES, Bus
from shmbus.message import Message

try:  # optional, faster
    import orjson as _orjson
except ImportError:  # pragma: no cover
    _orjson = None  # type: ignore[assignment]

__all__ = [
    "BASE_HEADERS",
    "JSON_CONTENT_TYPE",
    "MAX_BODY_SIZE",
    "MAX_CHANNELS_PER_POLL",
    "MAX_CLIENT_ID_LENGTH",
    "MAX_ID",
    "MAX_STREAM_BUFFER",
    "SEPARATOR",
    "STREAM_CONTENT_TYPE",
    "STREAM_HEADERS",
    "Client",
    "Lookups",
    "MessageBusProtocol",
    "Options",
    "Poll",
    "PollRequest",
    "ProtocolError",
    "Response",
    "Route",
    "encode_message",
    "escape_chunk",
    "frame_chunk",
    "normalize_base_route",
]

log = logging.getLogger("shmbus.adapters")

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
_INT_RE = re.compile(r"[ \t]*-?[0-9]{1,20}[ \t]*\Z")
_STATUS_HEAD = b'{"global_id":-1,"message_id":-1,"channel":"/__status","data":'
_OPTION_NAMES: frozenset[str]


def _dumps(obj: Any) -> bytes:
    if _orjson is not None:
        return _orjson.dumps(obj)
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def _loads(data: bytes) -> Any:
    if _orjson is not None:
        return _orjson.loads(data)
    return json.loads(data)


def _json_fallback(obj: Any) -> Any:
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return bytes(obj).decode("utf-8", "replace")
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    return str(obj)


def _dumps_data(obj: Any) -> bytes:
    """JSON for the ``data`` of a non-JSON codec (msgpack bytes become text)."""
    if _orjson is not None:
        return _orjson.dumps(obj, default=_json_fallback, option=_orjson.OPT_NON_STR_KEYS)
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, default=_json_fallback).encode()


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


_REASONS = {200: "OK", 400: "Bad Request", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
            408: "Request Timeout", 411: "Length Required", 413: "Content Too Large", 415: "Unsupported Media Type",
            500: "Internal Server Error"}

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


# ---------------------------------------------------------------------------------------------------- options
def bus_or_default(bus: Bus | None) -> Bus:
    """``bus``, or :func:`shmbus.default_bus` when None (the adapters' ``bus=None`` default)."""
    if bus is None:
        import shmbus

        bus = shmbus.default_bus()
    return bus


def normalize_base_route(route: str) -> str:
    """The gem's normalisation: leading and trailing ``/``, runs of ``/`` collapsed (``"a//b"`` -> ``/a/b/``)."""
    if not isinstance(route, str):
        raise TypeError(f"base_route must be a str, got {route!r}")
    return re.sub(r"/+", "/", f"/{route}/")


@dataclass
class Options:
    """Middleware options: the gem's names in snake_case, times in seconds.

    Lookups are plain callables receiving the WSGI environ or the ASGI scope (ASGI lookups may also be
    coroutine functions): ``user_id_lookup`` -> user id or None; ``group_ids_lookup`` -> iterable of group ids
    or None; ``site_id_lookup`` -> site id or None; ``is_admin_lookup`` (accepted, unused, as in the gem 4.x);
    ``extra_response_headers_lookup`` -> mapping or ``(name, value)`` pairs added to every poll/OPTIONS response
    (the way to emit CORS headers; ``set-cookie`` is dropped so polls never re-send session cookies);
    ``on_middleware_error(environ_or_scope, exc)`` -> a response ``(status, headers, body)`` or None (then a
    bad request gets its 4xx and any other exception propagates to the server).
    """

    base_route: str = "/"
    long_polling_enabled: bool = True
    long_polling_interval: float = 25.0
    chunked_encoding_enabled: bool = True
    max_active_clients: int = 1000
    allow_broadcast: bool = False
    user_id_lookup: Callable[[Any], Any] | None = None
    group_ids_lookup: Callable[[Any], Any] | None = None
    site_id_lookup: Callable[[Any], Any] | None = None
    is_admin_lookup: Callable[[Any], Any] | None = None
    extra_response_headers_lookup: Callable[[Any], Any] | None = None
    on_middleware_error: Callable[[Any, BaseException], Any] | None = None
    max_body_size: int = MAX_BODY_SIZE
    max_channels_per_poll: int = MAX_CHANNELS_PER_POLL
    max_stream_buffer: int = MAX_STREAM_BUFFER
    #: ASGI only: seconds to wait for the rest of a request body once its head arrived (``408`` after). WSGI
    #: servers read bodies themselves; their own timeouts apply.
    body_timeout: float = 30.0
    #: WSGI only: allow parking on a worker that serves one request at a time (gunicorn ``sync``, uwsgi without
    #: threads). Off by default: such workers answer long polls at once (as ``dlp=t``); see ``wsgi.py``.
    long_polling_on_sync_workers: bool = False
    prefix: str = field(init=False, default="/message-bus/")

    def __post_init__(self) -> None:
        self.base_route = normalize_base_route(self.base_route)
        self.prefix = self.base_route + "message-bus/"
        if not self.long_polling_interval > 0:
            raise ValueError("long_polling_interval must be > 0 seconds")
        if isinstance(self.body_timeout, bool) or not isinstance(self.body_timeout, (int, float)) \
                or not self.body_timeout > 0:
            raise ValueError(f"body_timeout must be > 0 seconds, got {self.body_timeout!r}")
        for name in ("max_active_clients", "max_body_size", "max_channels_per_poll", "max_stream_buffer"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be an int >= 0, got {v!r}")
        for name in ("user_id_lookup", "group_ids_lookup", "site_id_lookup", "is_admin_lookup",
                     "extra_response_headers_lookup", "on_middleware_error"):
            v = getattr(self, name)
            if v is not None and not callable(v):
                raise TypeError(f"{name} must be callable, got {v!r}")

    @classmethod
    def from_kwargs(cls, options: Mapping[str, Any]) -> Options:
        unknown = sorted(set(options) - _OPTION_NAMES)
        if unknown:
            raise TypeError(f"unknown message bus option(s) {unknown}; known: {sorted(_OPTION_NAMES)}")
        return cls(**options)


_OPTION_NAMES = frozenset(f.name for f in fields(Options) if f.init)


# ---------------------------------------------------------------------------------------------------- routing
@dataclass
class Route:
    """What a request path means: ``kind`` is ``"app"`` (not ours), ``"options"``, ``"broadcast"``, ``"poll"``
    (with ``client_id``) or ``"error"`` (with ``error``)."""

    kind: str
    client_id: str = ""
    error: ProtocolError | None = None


_APP = Route("app")


def match_route(method: str, path: str, options: Options) -> Route:
    prefix = options.prefix
    if not path.startswith(prefix):
        return _APP
    rest = path[len(prefix):]
    if method == "OPTIONS":
        return Route("options")
    if rest == "broadcast":
        if options.allow_broadcast:
            return Route("broadcast")
        return Route("error", error=ProtocolError(404, "broadcast is disabled (allow_broadcast=False)"))
    cid, _, tail = rest.partition("/")
    if not cid:
        if not rest:
            return Route("error", error=ProtocolError(404, "not found"))
        return Route("error", error=ProtocolError(404, "missing client id"))
    if tail not in ("", "poll"):
        return Route("error", error=ProtocolError(404, "unknown message-bus route"))
    if not CLIENT_ID_RE.match(cid):
        return Route("error", error=ProtocolError(400, INVALID_CLIENT_ID))
    return Route("poll", client_id=cid)


# ---------------------------------------------------------------------------------------------------- parsing
@dataclass
class PollRequest:
    """A parsed poll: ``channels`` maps channel -> requested id (None = "from now", as ``""``/``null``)."""

    client_id: str
    channels: dict[str, int | None]
    seq: int = 0
    dlp: bool = False
    dont_chunk: bool = False
    http11: bool = True


def _parse_id(channel: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise ProtocolError(400, f"invalid id for channel {channel[:80]!r}: {value!r}")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str):
        if value == "":
            return None
        if not _INT_RE.match(value):
            raise ProtocolError(400, f"invalid id for channel {channel[:80]!r}: {value[:40]!r} is not an integer")
        n = int(value)
    elif isinstance(value, float) and value.is_integer():
        n = int(value)
    else:
        raise ProtocolError(400, f"invalid id for channel {channel[:80]!r}: {str(value)[:40]!r}")
    if not -MAX_ID <= n <= MAX_ID:
        raise ProtocolError(400, f"id out of range for channel {channel[:80]!r} (|id| must be <= {MAX_ID})")
    return n


def _parse_seq(value: Any) -> int:
    if value is None or value == "":
        return 0
    n = _parse_id("__seq", value)
    return 0 if n is None else n


def parse_query_dlp(query: str) -> bool:
    """True when the query string has a ``dlp`` parameter whose value starts with ``t`` (``dlp=t``)."""
    if "dlp" not in query:
        return False
    for part in query.split("&"):
        name, _, value = part.partition("=")
        if name == "dlp" and value[:1] in ("t", "T", "1"):
            return True
    return False


def _check_channel(ch: Any) -> str:
    if not isinstance(ch, str) or not ch:
        raise ProtocolError(400, "channel names must be non-empty strings")
    if "\x00" in ch or "$|$" in ch:
        raise ProtocolError(400, f"invalid channel name {ch[:80]!r}")
    if len(ch) > MAX_CHANNEL_BYTES or len(ch.encode("utf-8", "surrogatepass")) > MAX_CHANNEL_BYTES:
        raise ProtocolError(400, f"channel name longer than {MAX_CHANNEL_BYTES} bytes")
    try:
        ch.encode()
    except UnicodeEncodeError:
        raise ProtocolError(400, "channel name is not valid unicode")
    return ch


def parse_body(content_type: str | None, body: bytes, options: Options) -> tuple[dict[str, int | None], int]:
    """Parse a poll body into ``(channels, seq)``; raise :class:`ProtocolError` on bad input."""
    if len(body) > options.max_body_size:
        raise ProtocolError(413, f"request body too large (limit {options.max_body_size} bytes)")
    ctype = (content_type or "").lower()
    items: Iterable[tuple[Any, Any]]
    if "application/json" in ctype:
        if not body.strip():
            items = ()
        else:
            try:
                text = body.decode("utf-8")
            except UnicodeDecodeError:
                raise ProtocolError(400, "request body is not valid UTF-8")
            try:
                obj = _loads(body)
            except ValueError:
                raise ProtocolError(400, "malformed JSON body")
            if obj is None:
                obj = {}
            if not isinstance(obj, dict):
                raise ProtocolError(400, "JSON body must be an object mapping channel to last id")
            items = obj.items()
    elif not ctype or ctype.startswith("application/x-www-form-urlencoded"):
        try:
            text = body.decode("ascii") if body.isascii() else body.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError(400, "request body is not valid UTF-8")
        try:
            items = _parse_form(text, options.max_channels_per_poll + 1)
        except UnicodeDecodeError:
            raise ProtocolError(400, "form body is not valid UTF-8 (after percent-decoding)")
        except ValueError:
            raise ProtocolError(400, f"too many channels in one poll (limit {options.max_channels_per_poll})")
    else:
        raise ProtocolError(415, "unsupported content type (use application/x-www-form-urlencoded or "
                                 "application/json)")
    return _channels_from_items(items, options)


def _parse_form(text: str, max_fields: int) -> list[tuple[str, str]]:
    """``parse_qsl(text, keep_blank_values=True, errors="strict", max_num_fields=max_fields)``, with a fast path
    for bodies that need no decoding (the JS client's ``/channel=id&__seq=n``: no ``%`` and no ``+``)."""
    if "%" in text or "+" in text:
        return parse_qsl(text, keep_blank_values=True, encoding="utf-8", errors="strict", max_num_fields=max_fields)
    if 1 + text.count("&") > max_fields:
        raise ValueError("Max number of fields exceeded")
    out = []
    for part in text.split("&"):
        if part:
            name, _, value = part.partition("=")
            out.append((name, value))
    return out


def _channels_from_items(items: Iterable[tuple[Any, Any]], options: Options) -> tuple[dict[str, int | None], int]:
    channels: dict[str, int | None] = {}
    seq = 0
    for key, value in items:
        if key == "__seq":
            seq = _parse_seq(value)
            continue
        ch = _check_channel(key)
        channels[ch] = _parse_id(ch, value)
        if len(channels) > options.max_channels_per_poll:
            raise ProtocolError(400, f"too many channels in one poll (limit {options.max_channels_per_poll})")
    return channels, seq


def channels_override(value: Any, seq: Any, options: Options) -> tuple[dict[str, int | None], int]:
    """The gem's ``env['message_bus.channels']``/``env['message_bus.seq']`` set by an upstream middleware."""
    if not isinstance(value, Mapping):
        raise TypeError("message_bus.channels must be a mapping of channel -> last id")
    channels, _ = _channels_from_items(value.items(), options)
    return channels, _parse_seq(seq)


def poll_request(client_id: str, content_type: str | None, body: bytes, query: str, options: Options, *,
                 override: Any = None, override_seq: Any = None, dont_chunk: bool = False, http11: bool = True
                 ) -> PollRequest:
    """A poll's :class:`PollRequest`: channels from ``override`` (the gem's ``message_bus.channels``, with
    ``message_bus.seq``) when set, else from the body; ``dlp`` from the query string."""
    if override is not None:
        channels, seq = channels_override(override, override_seq, options)
    else:
        channels, seq = parse_body(content_type, body, options)
    return PollRequest(client_id, channels, seq, dlp=parse_query_dlp(query), dont_chunk=dont_chunk, http11=http11)


def form_params(query: str, body: bytes, content_type: str | None) -> dict[str, str]:
    """Query plus form parameters (the broadcast route)."""
    params: dict[str, str] = {}
    try:
        for k, v in parse_qsl(query, keep_blank_values=True, errors="strict"):
            params[k] = v
        if body and (not content_type or content_type.lower().startswith("application/x-www-form-urlencoded")):
            for k, v in parse_qsl(body.decode("utf-8"), keep_blank_values=True, errors="strict"):
                params[k] = v
    except (UnicodeDecodeError, ValueError):
        raise ProtocolError(400, "malformed form parameters")
    return params


# ---------------------------------------------------------------------------------------------------- framing
_channel_json: dict[str, bytes] = {}


def _chan(channel: str) -> bytes:
    b = _channel_json.get(channel)
    if b is None:
        b = _dumps(channel)
        if len(_channel_json) > 20_000:
            _channel_json.clear()
        _channel_json[channel] = b
    return b


def encode_message(msg: Message, is_json: bool = True) -> bytes:
    """The wire object of one message. With the JSON codec ``msg.raw`` is spliced in as is (no decode)."""
    data = msg.raw if is_json else _dumps_data(msg.data)
    return b'{"global_id":%d,"message_id":%d,"channel":%s,"data":%s}' % (
        msg.global_id, msg.message_id, _chan(msg.channel), data)


def encode_status(status: Mapping[str, int]) -> bytes:
    return _STATUS_HEAD + _dumps(dict(status)) + b"}"


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


# ---------------------------------------------------------------------------------------------------- clients
@dataclass
class Lookups:
    user_id: Any = None
    group_ids: frozenset[Any] = frozenset()
    site_id: str | None = None


class Client:
    """One request that waits for live messages (long poll or stream).

    ``last`` holds, per channel, the highest id this request has delivered or skipped; live messages at or
    below it are never sent. ``pending`` holds encoded pieces waiting for the shell to write: for a streaming
    client whole framed chunks, otherwise array items (joined into one array when the request ends).
    """

    __slots__ = ("bytes_pending", "channels", "client_id", "done", "dropped", "epoch", "group_ids", "held", "keys",
                 "last", "pending", "ready", "registered", "reset", "seq", "signal", "site_id", "stale",
                 "status_due", "streaming", "superseded", "user_id", "waker")

    def __init__(self, client_id: str, seq: int, lk: Lookups, channels: Iterable[str], streaming: bool,
                 epoch: int, waker: Callable[[Client], Any] | None = None, signal: Any = None) -> None:
        self.client_id = client_id
        self.seq = seq
        self.user_id = lk.user_id
        self.group_ids = lk.group_ids
        self.site_id = lk.site_id
        self.channels = tuple(channels)
        self.keys = tuple((None if ch.startswith("/global/") else lk.site_id, ch) for ch in self.channels)
        self.streaming = streaming
        self.epoch = epoch
        self.last: dict[str, int] = {}
        self.pending: list[bytes] = []
        self.bytes_pending = 0
        self.held: list[Message] | None = []
        self.status_due: set[str] | None = None
        self.ready = False
        self.registered = False
        self.done = False
        self.dropped = False
        self.superseded = False
        self.reset = False
        self.stale = False  # rejected at once (a newer __seq is parked): its first chunk is the whole answer
        #: called (on the registry's thread) when the client has something to send or must end
        self.waker = waker
        #: the shell's wake-up object (an Event, a Future, ...), for the waker's use
        self.signal = signal

    def allowed(self, msg: Message) -> bool:
        """message_bus's ``Client#allowed?`` targeting rules (client message filters are checked separately)."""
        if not msg.targeted:
            return True
        cids = msg.client_ids
        if cids and self.client_id not in cids:
            return False
        uids, gids = msg.user_ids, msg.group_ids
        if not uids and not gids:
            return True
        if uids and self.user_id is not None and self.user_id in uids:
            return True
        return bool(gids and self.group_ids and not self.group_ids.isdisjoint(gids))

    def status_entry(self) -> bytes | None:
        if self.reset:
            return encode_status(dict.fromkeys(self.channels, 0))
        if not self.status_due:
            return None
        return encode_status({ch: self.last.get(ch, 0) for ch in self.channels if ch in self.status_due})

    def __repr__(self) -> str:
        return f"Client({self.client_id!r}, seq={self.seq}, streaming={self.streaming})"


def filter_allows(bus: Bus, msg: Message) -> bool:
    """The bus's client message filters on ``msg``; a filter that raises withholds the message (logged)."""
    try:
        return bool(bus.allowed_by_filters(msg))
    except Exception:
        log.exception("shmbus: client message filter failed on %r; message withheld", msg.channel)
        return False


class _Group:
    """Messages of one (site, channel) in one batch, encoded lazily and once for every recipient."""

    __slots__ = ("enc", "frame", "inner", "is_json", "msgs", "plain")

    def __init__(self, msgs: list[Message], is_json: bool) -> None:
        self.msgs = msgs
        self.is_json = is_json
        self.plain = not any(m.targeted for m in msgs)
        self.enc: list[bytes] | None = None
        self.inner: bytes | None = None
        self.frame: bytes | None = None

    def encoded(self) -> list[bytes]:
        if self.enc is None:
            self.enc = [encode_message(m, self.is_json) for m in self.msgs]
        return self.enc

    def shared_inner(self) -> bytes:
        if self.inner is None:
            self.inner = b",".join(self.encoded())
        return self.inner

    def shared_frame(self) -> bytes:
        if self.frame is None:
            self.frame = frame_chunk(b"[" + self.shared_inner() + b"]")
        return self.frame


# ---------------------------------------------------------------------------------------------------- registry
class Registry:
    """Waiting clients of one middleware in one process (or event loop), indexed by (site, channel) and id.

    ``lock`` guards the index; shells that run everything on one thread (asyncio, gevent) pass a no-op lock.
    """

    def __init__(self, bus: Bus, lock: AbstractContextManager[Any] | None = None,
                 max_stream_buffer: int = MAX_STREAM_BUFFER) -> None:
        self.bus = bus
        self.lock: AbstractContextManager[Any] = lock if lock is not None else threading.Lock()
        self.index: dict[tuple[str | None, str], set[Client]] = {}
        self.by_id: dict[str, Client] = {}
        self.parked = 0
        self.max_stream_buffer = max_stream_buffer
        self.is_json = bus.codec.is_json

    # -- registration
    def capture(self, c: Client) -> None:
        """Start collecting live messages for ``c`` (before its backlog is read: closes the park race)."""
        with self.lock:
            index = self.index
            for key in c.keys:
                s = index.get(key)
                if s is None:
                    index[key] = {c}
                else:
                    s.add(c)
            c.registered = True

    def _unindex(self, c: Client) -> None:
        if not c.registered:
            return
        c.registered = False
        index = self.index
        for key in c.keys:
            s = index.get(key)
            if s is not None:
                s.discard(c)
                if not s:
                    del index[key]
        if c.ready:
            self.parked -= 1
        if self.by_id.get(c.client_id) is c:
            del self.by_id[c.client_id]

    def discard(self, c: Client) -> None:
        with self.lock:
            self._unindex(c)

    def park(self, c: Client) -> tuple[bool, list[Client]]:
        """Make ``c`` the parked request of its client id; deliver what arrived since capture.

        Returns ``(accepted, wake)``: ``accepted`` is False when a parked request with a higher ``__seq``
        exists (``c`` is then unregistered and should be answered with what it has); ``wake`` lists clients
        to wake (a superseded older request, and ``c`` itself if messages arrived meanwhile).
        """
        wake: list[Client] = []
        with self.lock:
            old = self.by_id.get(c.client_id)
            if old is not None and old is not c:
                if old.seq > c.seq:
                    self._unindex(c)
                    c.held = None
                    return False, wake
                old.superseded = True
                old.done = True
                self._unindex(old)
                wake.append(old)
            self.by_id[c.client_id] = c
            held, c.held = c.held, None
            c.ready = True
            self.parked += 1
            if held:
                self._deliver_held(c, held)
                if c.pending or c.done:
                    wake.append(c)
        return True, wake

    def _deliver_held(self, c: Client, held: list[Message]) -> None:
        groups: dict[tuple[str | None, str], list[Message]] = {}
        for m in held:
            groups.setdefault((m.site_id, m.channel), []).append(m)
        for key, msgs in groups.items():
            self._deliver(c, key[1], _Group(msgs, self.is_json), self._filter_ok(msgs))

    def finish(self, c: Client) -> tuple[list[bytes], bytes | None]:
        """Unregister ``c`` (by identity) and take what it still has to send: ``(pending, status_entry)``."""
        with self.lock:
            self._unindex(c)
            c.done = True
            pending, c.pending = c.pending, []
            c.bytes_pending = 0
            return pending, c.status_entry()

    def take(self, c: Client) -> list[bytes]:
        """Streaming: take the queued chunks."""
        with self.lock:
            pending, c.pending = c.pending, []
            c.bytes_pending = 0
            return pending

    # -- delivery
    def _filter_ok(self, msgs: list[Message]) -> list[bool] | None:
        bus = self.bus
        if not bus.client_message_filters:
            return None
        return [filter_allows(bus, m) for m in msgs]

    def dispatch(self, msgs: list[Message]) -> list[Client]:
        """Hand a batch from the bus listener to the waiting clients; return the clients to wake.

        Each (site, channel) group is encoded once for every recipient; a client gets one piece per channel
        per batch (a shared bytes object unless targeting/filters/its last id require a subset).
        """
        index = self.index
        groups: dict[tuple[str | None, str], list[Message]] = {}
        with self.lock:
            if not index:
                return []
            for m in msgs:
                key = (m.site_id, m.channel)
                if key in index:
                    g = groups.get(key)
                    if g is None:
                        groups[key] = [m]
                    else:
                        g.append(m)
            if not groups:
                return []
            wake: list[Client] = []
            woken: set[Client] = set()
            is_json = self.is_json
            for key, gm in groups.items():
                clients = index.get(key)
                if not clients:
                    continue
                group = _Group(gm, is_json)
                ok = self._filter_ok(gm)
                channel = key[1]
                for c in tuple(clients):
                    if not c.ready:
                        if c.held is not None:
                            c.held.extend(gm)
                        continue
                    before = len(c.pending)
                    self._deliver(c, channel, group, ok)
                    if c.done:
                        self._unindex(c)
                        if c not in woken:
                            woken.add(c)
                            wake.append(c)
                    elif len(c.pending) != before and c not in woken:
                        woken.add(c)
                        wake.append(c)
            return wake

    def _deliver(self, c: Client, channel: str, group: _Group, ok: list[bool] | None) -> None:
        msgs = group.msgs
        if msgs[0].epoch != c.epoch:
            c.reset = True
            c.done = True
            if c.streaming:
                st = c.status_entry()
                self._push(c, frame_chunk(b"[" + st + b"]") if st else EMPTY_CHUNK)
            return
        last = c.last.get(channel, 0)
        top = msgs[-1].message_id
        if top <= last:
            return  # all already delivered (or skipped) by the backlog read
        if ok is None and group.plain and msgs[0].message_id > last:
            c.last[channel] = top
            self._push(c, group.shared_frame() if c.streaming else group.shared_inner())
            return
        enc = group.encoded()
        parts = []
        withheld = False
        for i, m in enumerate(msgs):
            if m.message_id <= last:
                continue
            if (ok is not None and not ok[i]) or not c.allowed(m):
                withheld = True
                continue
            parts.append(enc[i])
        c.last[channel] = max(top, last)
        if withheld:
            if c.status_due is None:
                c.status_due = set()
            c.status_due.add(channel)
        if parts:
            inner = b",".join(parts)
            self._push(c, frame_chunk(b"[" + inner + b"]") if c.streaming else inner)

    def _push(self, c: Client, piece: bytes) -> None:
        c.pending.append(piece)
        if c.streaming:
            c.bytes_pending += len(piece)
            if c.bytes_pending > self.max_stream_buffer:
                c.dropped = True
                c.done = True
                c.pending = []
                c.bytes_pending = 0
        elif not c.done:
            c.done = True  # a long poll ends with its first delivery


# ---------------------------------------------------------------------------------------------------- polls
class Poll:
    """The outcome of starting a poll.

    ``mode`` is ``"immediate"`` (send ``response`` and stop), ``"long"`` (wait for ``client`` to be woken or the
    interval to pass, then send :meth:`MessageBusProtocol.long_poll_response`) or ``"stream"`` (send ``headers``
    and ``first_chunk`` now, then :meth:`MessageBusProtocol.stream_chunks` whenever woken, and
    :meth:`MessageBusProtocol.stream_end` at the end).
    """

    __slots__ = ("client", "first_chunk", "headers", "mode", "response")

    def __init__(self, mode: str, response: Response | None = None, client: Client | None = None,
                 headers: list[tuple[str, str]] | None = None, first_chunk: bytes = b"") -> None:
        self.mode = mode
        self.response = response
        self.client = client
        self.headers = headers or []
        self.first_chunk = first_chunk


class MessageBusProtocol:
    """The protocol engine of one middleware instance: options, registry and reply computation."""

    def __init__(self, bus: Bus, options: Options, lock: AbstractContextManager[Any] | None = None) -> None:
        self.bus = bus
        self.options = options
        self.registry = Registry(bus, lock if lock is not None else threading.Lock(), options.max_stream_buffer)
        self.is_json = bus.codec.is_json

    # -- simple responses
    def headers(self, extra: list[tuple[str, str]]) -> list[tuple[str, str]]:
        return BASE_HEADERS + extra if extra else list(BASE_HEADERS)

    def options_response(self, extra: list[tuple[str, str]]) -> Response:
        return Response(200, self.headers(extra), b"OK")

    def broadcast(self, params: Mapping[str, str]) -> Response:
        channel = params.get("channel")
        if not channel:
            raise ProtocolError(400, "broadcast needs a channel parameter")
        _check_channel(channel)
        self.bus.publish(channel, params.get("data"))
        return Response(200, [("content-type", "text/html")], b"sent")

    @staticmethod
    def extra_headers(value: Any) -> list[tuple[str, str]]:
        """Normalise ``extra_response_headers_lookup``'s result (mapping or pairs); ``set-cookie`` is dropped."""
        if not value:
            return []
        items = value.items() if isinstance(value, Mapping) else value
        out = []
        for name, val in items:
            name = str(name)
            if name.lower() == "set-cookie":
                continue
            out.append((name, str(val)))
        return out

    @staticmethod
    def lookups(user_id: Any, group_ids: Any, site_id: Any) -> Lookups:
        groups: frozenset[Any] = frozenset()
        if group_ids:
            if isinstance(group_ids, (str, bytes)):
                group_ids = (group_ids,)
            groups = frozenset(group_ids)
        site = None
        if site_id is not None and site_id != "":
            site = str(site_id)
        return Lookups(user_id, groups, site)

    # -- polls
    def start_poll(self, req: PollRequest, lk: Lookups, extra: list[tuple[str, str]], *,
                   can_park: bool = True, waker: Callable[[Client], Any] | None = None,
                   signal: Any = None) -> Poll:
        """Compute the reply to a poll; register the request when it will wait.

        ``can_park`` is the shell's verdict (e.g. False on a sync WSGI worker): when False the request is
        answered at once, like ``dlp=t``. ``waker(client)`` is called when a waiting request has something
        to send or must end (it may already have been called when this returns: check ``client.done`` and
        ``client.pending`` before waiting); ``signal`` is stored on the client for the waker.
        """
        opts = self.options
        reg = self.registry
        long_poll = (can_park and opts.long_polling_enabled and not req.dlp
                     and reg.parked < opts.max_active_clients)
        streaming = long_poll and req.http11 and not req.dont_chunk and opts.chunked_encoding_enabled
        epoch = self.bus.epoch if long_poll else 0
        c = Client(req.client_id, req.seq, lk, req.channels, streaming, epoch, waker, signal)
        if long_poll:
            reg.capture(c)
        try:
            items, status = self.read_backlog(c, req.channels)
        except BaseException:
            if long_poll:
                reg.discard(c)
            raise
        if status:
            items.append(encode_status(status))
        if not long_poll or (items and not streaming):
            if long_poll:
                reg.discard(c)
            return Poll("immediate", Response(200, self.headers(extra), b"[" + b",".join(items) + b"]"))
        first = frame_chunk(b"[" + b",".join(items) + b"]") if items else EMPTY_CHUNK
        accepted, wake = reg.park(c)
        for other in wake:
            if other is not c:
                self.wake(other)
        if not accepted:  # a newer request of this client id is parked: answer at once
            if streaming:  # the gem: one chunk (the backlog or []) and the terminator, no closing []
                c.done = c.stale = True
                return Poll("stream", client=c, headers=STREAM_HEADERS + extra, first_chunk=first)
            return Poll("immediate", Response(200, self.headers(extra), EMPTY))
        if streaming:
            return Poll("stream", client=c, headers=STREAM_HEADERS + extra, first_chunk=first)
        return Poll("long", client=c, headers=self.headers(extra))

    def wake(self, c: Client) -> None:
        w = c.waker
        if w is not None:
            try:
                w(c)
            except Exception:
                log.exception("shmbus: waking %r failed", c)

    def dispatch(self, msgs: list[Message]) -> None:
        """Deliver a batch and wake the concerned clients (call on the thread that owns the registry)."""
        for c in self.registry.dispatch(msgs):
            self.wake(c)

    def read_backlog(self, c: Client, channels: Mapping[str, int | None]) -> tuple[list[bytes], dict[str, int]]:
        """The gem's ``Client#backlog`` with its ``/__status`` rules; records per channel the last id covered."""
        items: list[bytes] = []
        status: dict[str, int] = {}
        if not channels:
            return items, status
        bus = self.bus
        site = c.site_id or ""  # "" = explicitly no site (never the bus's zero-argument site lookup)
        lasts = bus.last_ids(*channels, site_id=site)
        filters = bool(bus.client_message_filters)
        is_json = self.is_json
        for ch, v in channels.items():
            last = lasts[ch]
            if v is None or v == last:
                c.last[ch] = last
                continue
            if v == -1 or v > last:
                c.last[ch] = last
                status[ch] = last
                continue
            after = max(last + v + 1, 0) if v < -1 else v
            bl = bus.backlog(ch, after, site)
            top = max(last, bl.last_id)
            c.last[ch] = top
            for m in bl:
                if m.message_id > top:
                    c.last[ch] = top = m.message_id
                if c.allowed(m) and (not filters or filter_allows(self.bus, m)):
                    items.append(encode_message(m, is_json))
                else:
                    status[ch] = top
            if v >= 0 and bl.gap:
                status[ch] = top
            if ch in status:
                status[ch] = c.last[ch]
        return items, status

    # -- ends of waiting requests
    def long_poll_response(self, c: Client) -> bytes:
        """Finish a long poll: the body to send (``[]`` on timeout)."""
        pending, st = self.registry.finish(c)
        if st is not None:
            pending.append(st)
        if not pending:
            return EMPTY
        if len(pending) == 1:
            return b"[" + pending[0] + b"]"
        return b"[" + b",".join(pending) + b"]"

    def stream_chunks(self, c: Client) -> list[bytes]:
        return self.registry.take(c)

    def stream_end(self, c: Client) -> list[bytes]:
        """Finish a stream: remaining chunks plus the closing chunk (``[]``, or the due ``/__status``)."""
        pending, st = self.registry.finish(c)
        if c.dropped:
            return []
        if c.reset or c.stale:  # the reset status was already queued / the first chunk was the whole answer
            return pending
        pending.append(frame_chunk(b"[" + st + b"]") if st is not None else EMPTY_CHUNK)
        return pending

    def abandon(self, c: Client) -> None:
        """The client went away: unregister at once."""
        self.registry.finish(c)


def null_lock() -> AbstractContextManager[Any]:
    return nullcontext()
