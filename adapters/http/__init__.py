"""Sans-IO core of the message_bus HTTP protocol: no sockets, no framework, shared by every shell.

In the style of h11, this package only turns request data into decisions and bytes; the shells
(:mod:`shmbus.adapters.wsgi`, :mod:`shmbus.adapters.asgi` and the lean server :mod:`shmbus.adapters.server`)
read bodies, call lookups, wait and write. Modules: ``wire`` (limits, headers, framing), ``options`` (options and
routes), ``request`` (poll parsing), ``waiter`` (a waiting request), ``interning`` (one shared copy of common
values), ``registry`` (delivery to waiting requests), ``group`` (a channel's messages of a batch, encoded once;
their delivery to many clients made a few at a time), ``protocol`` (backlog reads and the ends of polls) and
``flow`` (the one sequence every request follows) and ``subscribe`` (``subscribe_allowed``: who may read a
channel).

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

from .flow import CallLookup, ReadBody, RequestHead, request_flow
from .options import Options, Route, match_route, normalize_base_route
from .protocol import MessageBusProtocol, Poll
from .request import PollRequest, parse_body, poll_request
from .subscribe import REFUSED_HEADER, RequestInfo, SubscribeAllowed
from .waiter import Lookups, Waiter
from .wire import (
    BASE_HEADERS,
    JSON_CONTENT_TYPE,
    MAX_BODY_SIZE,
    MAX_CHANNELS_PER_POLL,
    MAX_CLIENT_ID_LENGTH,
    MAX_ID,
    MAX_STREAM_BUFFER,
    SEPARATOR,
    STREAM_CONTENT_TYPE,
    STREAM_HEADERS,
    ProtocolError,
    Response,
    encode_message,
    escape_chunk,
    frame_chunk,
)

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
    "CallLookup",
    "Waiter",
    "Lookups",
    "MessageBusProtocol",
    "Options",
    "Poll",
    "PollRequest",
    "REFUSED_HEADER",
    "RequestInfo",
    "SubscribeAllowed",
    "ProtocolError",
    "ReadBody",
    "RequestHead",
    "Response",
    "Route",
    "encode_message",
    "escape_chunk",
    "frame_chunk",
    "match_route",
    "normalize_base_route",
    "parse_body",
    "poll_request",
    "request_flow",
]
