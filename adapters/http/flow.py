"""The one sequence every message-bus request follows, as a generator the shells drive (the h11 way).

route -> OPTIONS preflight -> (a browser asset) -> body -> broadcast -> poll request -> lookups -> the channels
``subscribe_allowed`` refuses left out (:mod:`.subscribe`) -> presence noted (the ``presence`` option, on the
channels left) -> start the poll,
and on any error ``on_middleware_error`` -> the 4xx of a :class:`ProtocolError` (anything else propagates to the shell).

The generator never does I/O. It yields a step and the shell answers with ``gen.send(value)``:

* :data:`READ_BODY`: read the request body (bounded by ``options.max_body_size``, timed by the shell) and send
  the bytes; a body the shell refuses (chunked, too large, too slow) is reported with ``gen.throw(ProtocolError)``;
* :class:`CallLookup`: call ``step.fn(context, *step.args)`` with the shell's context (the WSGI environ or the
  ASGI scope), awaiting it if the shell can, and send the result; an exception is reported with ``gen.throw``.

It returns a :class:`~.protocol.Poll` (``StopIteration.value``): an immediate response, or a registered client to
wait for. :func:`run_sync` drives it for shells whose lookups are plain functions.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, NamedTuple

from shmbus.presence.browser import hook_channel

from .assets import asset_response
from .protocol import MessageBusProtocol, Poll
from .request import form_params, poll_request
from .subscribe import SubscribeAllowed, ask, refused_header, request_info, verdict
from .waiter import Lookups
from .wire import ProtocolError, Response, triple_response

__all__ = ["READ_BODY", "CallLookup", "Flow", "ReadBody", "RequestHead", "advance", "request_flow", "run_sync"]

log = logging.getLogger("shmbus.adapters")

_BAD_HEADER = re.compile(r"[\r\n\x00]")
_NO_LOOKUPS = Lookups()


class RequestHead(NamedTuple):
    """What the flow needs of a request before its body (the shell extracts it from its own request type).

    A NamedTuple, not a frozen dataclass: it is built once per request, and a frozen dataclass costs ~5x more."""

    method: str
    #: the path relative to the app's root (``root_path`` / ``SCRIPT_NAME`` removed)
    path: str
    query: str = ""
    content_type: str | None = None
    dont_chunk: bool = False
    http11: bool = True
    #: the gem's ``message_bus.channels`` / ``message_bus.seq``, set by an upstream middleware
    override: Any = None
    override_seq: Any = None


class ReadBody:
    """Step: read the request body and send it back as bytes."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "READ_BODY"


READ_BODY = ReadBody()


@dataclass(frozen=True)
class CallLookup:
    """Step: call ``fn(context, *args)`` and send back its result."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()


Flow = Generator["ReadBody | CallLookup", Any, Poll]


def request_flow(
    proto: MessageBusProtocol,
    head: RequestHead,
    *,
    can_park: bool = True,
    waker: Callable[[Any], Any] | None = None,
    signal: Any = None,
) -> Flow:
    """The flow of one request under ``proto.options.prefix`` (see the module docstring).

    ``can_park``, ``waker`` and ``signal`` go to :meth:`MessageBusProtocol.start_poll`.
    """
    try:
        opts = proto.options
        route = proto.route(head.method, head.path)
        if route.kind == "options":  # before any other lookup: a cheap CORS preflight
            return Poll("immediate", proto.options_response((yield from _extra_headers(proto))))
        if route.error is not None:
            raise route.error
        if route.kind == "asset":
            return Poll("immediate", asset_response(head.method, route.asset))
        body = yield READ_BODY
        if route.kind == "broadcast":
            return Poll("immediate", proto.broadcast(form_params(head.query, body, head.content_type)))
        req = poll_request(
            route.client_id,
            head.content_type,
            body,
            head.query,
            opts,
            override=head.override,
            override_seq=head.override_seq,
            dont_chunk=head.dont_chunk,
            http11=head.http11,
        )
        if head.method == "HEAD":  # nothing of a body would be sent: never hold the request
            req.dlp = True
        if opts.user_id_lookup or opts.group_ids_lookup or opts.site_id_lookup:
            user_id = (yield CallLookup(opts.user_id_lookup)) if opts.user_id_lookup else None
            group_ids = (yield CallLookup(opts.group_ids_lookup)) if opts.group_ids_lookup else None
            site_id = (yield CallLookup(opts.site_id_lookup)) if opts.site_id_lookup else None
            lookups = proto.lookups(user_id, group_ids, site_id)
        else:
            lookups = _NO_LOOKUPS
        extra = (yield from _extra_headers(proto)) if opts.extra_response_headers_lookup is not None else []
        if opts.subscribe_allowed is not None and req.channels:
            refused = yield from _refused(opts.subscribe_allowed, route.client_id, lookups, req.channels)
            if refused:
                extra = [*extra, refused_header(refused)]
        if opts.presence:
            proto.note_presence(route.client_id, lookups.user_id, req.channels)
        poll = proto.start_poll(req, lookups, extra, can_park=can_park, waker=waker, signal=signal)
        proto.ask_snapshots(route.client_id, req.channels)  # after the poll read its ids: the snapshot comes later
        return poll
    except Exception as exc:
        return Poll("immediate", (yield from _error_response(proto, exc)))


def _refused(
    hook: SubscribeAllowed, client_id: str, lookups: Lookups, channels: dict[str, int | None]
) -> Generator[CallLookup, Any, list[str]]:
    """Ask ``hook`` once per channel of the poll and remove the refused ones from ``channels`` (so nothing of
    them is read, parked on or answered); the refused channels, in the poll's order."""
    info = yield CallLookup(request_info, (client_id, lookups))
    refused = []
    for ch in channels:
        if not verdict((yield CallLookup(ask, (hook, info, hook_channel(ch))))):
            refused.append(ch)
    for ch in refused:
        del channels[ch]
    return refused


def _extra_headers(proto: MessageBusProtocol) -> Generator[CallLookup, Any, list[tuple[str, str]]]:
    """``extra_response_headers_lookup``'s headers; a name or value with CR, LF or NUL is dropped (logged)."""
    lookup = proto.options.extra_response_headers_lookup
    if lookup is None:
        return []
    headers = proto.extra_headers((yield CallLookup(lookup)))
    if any(_BAD_HEADER.search(name) or _BAD_HEADER.search(value) for name, value in headers):
        log.error("shmbus: dropping response headers with CR/LF/NUL from extra_response_headers_lookup")
        headers = [(n, v) for n, v in headers if not _BAD_HEADER.search(n) and not _BAD_HEADER.search(v)]
    return headers


def _error_response(proto: MessageBusProtocol, exc: Exception) -> Generator[CallLookup, Any, Response]:
    """``on_middleware_error``'s answer, else the 4xx of a :class:`ProtocolError`; anything else is re-raised."""
    handler = proto.options.on_middleware_error
    if handler is not None:
        try:
            result = yield CallLookup(handler, (exc,))
        except Exception:
            log.exception("shmbus: on_middleware_error failed on %r", exc)
            result = None
        if result:
            return triple_response(result)
    if not isinstance(exc, ProtocolError):
        raise exc
    response = exc.response()
    try:
        response.headers += yield from _extra_headers(proto)
    except Exception:
        pass  # the lookup failed on a request we are refusing anyway: the 4xx goes out without its headers
    return response


def advance(flow: Flow, value: Any = None, error: Exception | None = None) -> ReadBody | CallLookup | Poll:
    """Send ``value`` (or throw ``error``) into ``flow``: its next step, or the :class:`Poll` it ended with."""
    try:
        return flow.send(value) if error is None else flow.throw(error)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


def run_sync(flow: Flow, read_body: Callable[[], bytes], call_lookup: Callable[[CallLookup], Any]) -> Poll:
    """Drive ``flow`` to its end for a shell whose lookups are plain functions (``call_lookup(step)`` calls one).

    The loop is written out (not through :func:`advance`): it runs once per request on the lean server."""
    send = flow.send
    try:
        step = send(None)
        while True:
            try:
                value = read_body() if step is READ_BODY else call_lookup(step)  # type: ignore[arg-type]
            except Exception as exc:
                step = flow.throw(exc)
            else:
                step = send(value)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
