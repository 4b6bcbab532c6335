"""guble's WebSocket protocol and REST publish, served from a shmbus bus: :class:`GubleApp` (ASGI).

The WebSocket shell is the transports' (:class:`~shmbus.adapters.transports.websocket.WebSocketApp`: per-loop
fan-out, bounded buffers, slow clients dropped, ``on_open``/``on_close`` connection hooks); this module supplies
guble's grammar (:mod:`.protocol`), its topics and its user spaces:

* ``+ /foo`` receives ``/foo`` and every subtopic (``/foo/bar``); a message matched by several subscriptions of
  one connection is sent once, live or replayed.
* Replays (``+ <path> <startId>[,<maxCount>]``, ``replay ...``) read the topic itself (guble: "fetching of stored
  messages does not recognize subtopics"); ``sequenceId`` is the channel's message id.
* ``/user/<userId>/...`` topics reach only connections of that user: a connection is subscribed to
  ``/user/<userId>/<applicationId>`` and ``/user/<userId>/common`` on connect, and can subscribe to more of its
  own space, never to another user's (not even through ``/user`` or ``/``). Anyone may send to a user's topics.
"""

from __future__ import annotations

import json
import logging
import secrets
import string
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

from shmbus.bus import Bus
from shmbus.errors import ShmbusError
from shmbus.message import Message

from ..asgi_support import Receive, Scope, Send, fallback, maybe_await, relative_path
from ..http import MAX_BODY_SIZE, ProtocolError
from ..transports.identity import Identity
from ..transports.rest import AsgiRestPublish, publish_or_refuse
from ..transports.sink import DEFAULT_MAX_BUFFER, Sink
from ..transports.validation import MAX_SUBSCRIPTIONS, check_client_channel
from ..transports.websocket import MAX_FRAME, WebSocketApp
from .protocol import (
    BadRequest,
    Cancel,
    Replay,
    format_message,
    iso_time,
    message_data,
    notification,
    parse_command,
    unpack,
)
from .protocol import (
    Receive as ReceiveCmd,
)
from .protocol import (
    Send as SendCmd,
)

__all__ = ["GubleApp", "GubleRestPublish", "user_space_ids", "user_topic_owner"]

log = logging.getLogger(__name__)

CONNECTED_TEXT = "You are connected to the server."
USER_SPACE = "/user/"
_ALPHABET = string.ascii_letters + string.digits


def new_application_id() -> str:
    """A random application id, as guble gives a client that names none (16 letters and digits)."""
    return "".join(secrets.choice(_ALPHABET) for _ in range(16))


def user_topic_owner(channel: str) -> str | None:
    """The user whose space ``channel`` is in (``/user/<userId>/...``), or None outside user spaces."""
    if not channel.startswith(USER_SPACE):
        return None
    return channel[len(USER_SPACE) :].split("/", 1)[0]


def user_space_ids(owner: str) -> list[Any]:
    """The ``user_ids`` a send to ``owner``'s user space is published with, so the bus's targeting keeps it
    private on every transport (message_bus polls, SSE, the generic WebSocket app). Lookups often return integer
    ids, so a digits-only owner is targeted both as the string and as the integer (as REST publish reads ids)."""
    ids: list[Any] = [owner]
    if owner.isdigit() and len(owner) < 19:
        ids.append(int(owner))
    return ids


def _has_user_space(user_id: str) -> bool:
    """A user id that names exactly one user space: not empty, no '/' (user ``bob`` would own ``bob/x``'s
    topics) and no ',' (guble paths have none)."""
    return bool(user_id) and "/" not in user_id and "," not in user_id


def _encode(msg: Message) -> str:
    return format_message(unpack(msg.channel, msg.message_id, msg.data, msg.timestamp))


class _GubleSink(Sink):
    """A connection's sink with guble's user-space rule on top of the bus's targeting."""

    user_id = ""
    application_id = ""
    space = ""  # the user space this connection may read ("" for none: anonymous, or an id with '/' or ',')

    def allowed(self, msg: Message) -> bool:
        if "," in msg.channel:  # published by another transport: no guble header line can carry it
            return False
        owner = user_topic_owner(msg.channel)
        if owner is not None and (not self.space or owner != self.space):
            return False
        return super().allowed(msg)


class GubleApp(WebSocketApp):
    """ASGI app: guble's WebSocket protocol under ``path`` (``/stream/`` and anything below it, e.g. guble's
    ``/stream/user/<userId>``), and, when ``authorize`` is given, guble's REST publish
    ``POST <rest_prefix><topic>?userId=..&messageId=..`` with ``X-Guble-*`` headers. Everything else goes to
    ``app`` (or 404).

    ``user_id_lookup(scope)`` gives the connection's ``UserId`` (the middleware's lookup; None: anonymous, with no
    user space), ``application_id_lookup(scope)`` its ``ApplicationId`` (default: random per connection).
    ``allow_send(scope, path) -> bool`` (plain or async) permits the ``>`` command; without it sending over the
    socket is refused with ``!error-send``. ``authorize(scope, channel) -> bool`` guards REST publishing, which is
    off without it. The other options are :class:`WebSocketApp`'s.
    """

    def __init__(
        self,
        app: Callable[..., Any] | None = None,
        *,
        bus: Bus | None = None,
        path: str = "/stream/",
        application_id_lookup: Callable[[Any], Any] | None = None,
        allow_send: Callable[[Any, str], Any] | None = None,
        authorize: Callable[[Any, str], Any] | None = None,
        rest_prefix: str = "/api/message/",
        max_body_size: int = MAX_BODY_SIZE,
        max_buffer: int = DEFAULT_MAX_BUFFER,
        max_subscriptions: int = MAX_SUBSCRIPTIONS,
        max_frame: int = MAX_FRAME,
        keepalive_interval: float = 15.0,
        **lookups: Any,
    ) -> None:
        for name, fn in (("application_id_lookup", application_id_lookup), ("allow_send", allow_send)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{name} must be callable, got {fn!r}")
        super().__init__(
            app,
            bus=bus,
            path=path.rstrip("/") or "/",
            max_buffer=max_buffer,
            max_subscriptions=max_subscriptions,
            max_frame=max_frame,
            keepalive_interval=keepalive_interval,
            **lookups,
        )
        self.application_id_lookup = application_id_lookup
        self.allow_send = allow_send
        self.rest: GubleRestPublish | None = None
        if authorize is not None:
            self.rest = GubleRestPublish(
                app,
                bus=self.bus,
                authorize=authorize,
                prefix=rest_prefix,
                max_body_size=max_body_size,
                subscribe_allowed=self.lookups.subscribe_allowed,
            )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.rest is not None:
            await self.rest(scope, receive, send)  # not a REST path: it falls through to ``app``
        elif scope["type"] == "websocket" and self.matches(scope):
            await super().__call__(scope, receive, send)
        else:
            await fallback(self.app, scope, receive, send)

    # ------------------------------------------------------------------ the WebSocket shell's hooks
    def matches(self, scope: Scope) -> bool:
        path = relative_path(scope)
        return path == self.path or path.startswith(self.path.rstrip("/") + "/")

    async def open_sink(self, identity: Identity, scope: Scope) -> Sink:
        gate = self.lookups.gate(identity, scope)
        sink = _GubleSink(self.bus, identity, _encode, max_buffer=self.max_buffer, on_reset=self._on_reset, gate=gate)
        user = identity.lookups.user_id
        sink.user_id = "" if user is None else str(user)
        sink.space = sink.user_id if _has_user_space(sink.user_id) else ""
        app_id = await maybe_await(self.application_id_lookup(scope)) if self.application_id_lookup else None
        sink.application_id = str(app_id) if app_id else new_application_id()
        if sink.space:  # guble: every connection hears its application topic and the user's common topic
            floor = self.bus.segment.global_id()
            for topic in (sink.application_id, "common"):
                try:
                    channel = check_client_channel(f"{USER_SPACE}{sink.space}/{topic}")
                    if "," in channel:
                        continue  # an application id with a comma makes no guble path
                    sink.add_pattern(channel, "prefix", floor)
                except ProtocolError:
                    pass  # an id that makes no valid channel gets no user topic
        return sink

    def hello(self, sink: Sink) -> str:
        assert isinstance(sink, _GubleSink)
        info = {"ApplicationId": sink.application_id, "UserId": sink.user_id, "Time": iso_time(time.time())}
        return notification("ok-connected", CONNECTED_TEXT, info)

    def refusal(self, reason: str, internal: bool) -> str:
        """At connect (an invalid ``?client_id=``, a failing ``on_open``): guble's status line and its JSON line."""
        return notification("error-server-internal" if internal else "error-bad-request", reason, {"reason": reason})

    def _error(self, sink: Sink, reason: str, ref: Any = None) -> None:
        sink.push(notification("error-bad-request", reason, error=True))  # as guble's README prints it

    def _on_reset(self, sink: Sink, old: int, new: int) -> None:
        """guble has no resets: say so, and continue with new messages (sequence ids restart)."""
        text = f"the bus was reset (epoch {old} -> {new})"
        sink.push(notification("error-server-internal", text, {"reason": text, "epoch": new, "previousEpoch": old}))
        sink.refloor(self.bus.segment.global_id())

    async def _handle(self, sink: Sink, scope: Scope, text: str) -> None:
        assert isinstance(sink, _GubleSink)
        try:
            cmd = parse_command(text)
            if isinstance(cmd, SendCmd):
                await self._send_cmd(sink, scope, cmd)
            elif isinstance(cmd, ReceiveCmd):
                await self._receive_cmd(sink, cmd)
            elif isinstance(cmd, Cancel):
                sink.drop_pattern(cmd.path, "prefix")  # cancelling what was not subscribed is not an error
                sink.push(notification("canceled", cmd.path))
            elif isinstance(cmd, Replay):
                await self._replay_cmd(sink, cmd)
        except BadRequest as exc:
            self._error(sink, str(exc))
        except ProtocolError as exc:
            self._error(sink, exc.reason)
        except Exception as exc:  # never let one command end the connection
            log.exception("shmbus: guble command failed")
            text = f"internal error ({type(exc).__name__}); see the server log"
            sink.push(notification("error-server-internal", text, {"reason": text}))

    # ------------------------------------------------------------------ commands
    async def _readable(self, sink: _GubleSink, path: str) -> bool:
        """``subscribe_allowed`` on the topic itself (guble's read check); refused: ``!error-subscribed-to``.
        A subtopic is asked about when its first message comes (the sink's gate)."""
        if await self.may_read(sink, path):
            return True
        reason = f"not allowed to subscribe to {path[:80]}"
        sink.push(notification("error-subscribed-to", path, {"reason": reason}))
        return False

    async def _receive_cmd(self, sink: _GubleSink, cmd: ReceiveCmd) -> None:
        path = check_client_channel(cmd.path, "path")
        if not await self._readable(sink, path):
            return
        known = (path, "prefix") in sink.patterns
        if cmd.count is None and not known and sink.subscription_count() >= self.max_subscriptions:
            raise BadRequest(f"too many subscriptions (limit {self.max_subscriptions})")
        upto = self.bus.segment.global_id()
        if cmd.start is not None:
            site = sink.site or ""
            last = self.bus.last_id(path, site)
            start = cmd.start
            after = start - 1 if start > 0 else (self.bus.look_back(path, -start, site) if start < 0 else 0)
            backlog = self.bus.backlog(path, min(after, last), site, limit=cmd.count)
            for m in backlog:
                # sent already (or about to be) by a live subscription of this connection: once is enough
                if m.global_id <= upto and sink.allowed(m) and not sink.wants(m):
                    sink.deliver(m)
        if cmd.count is not None:
            sink.push(notification("fetch-done", path))
            return
        sink.add_pattern(path, "prefix", upto)
        sink.push(notification("ok-subscribed-to", path))

    async def _replay_cmd(self, sink: _GubleSink, cmd: Replay) -> None:
        path = check_client_channel(cmd.path, "path")
        if not await self._readable(sink, path):
            return
        site = sink.site or ""
        last = self.bus.last_id(path, site)
        after = max(cmd.after, 0)
        if cmd.count is not None:
            after = max(after, self.bus.look_back(path, cmd.count, site))
        for m in self.bus.backlog(path, min(after, last), site):
            if sink.allowed(m):
                sink.deliver(m)
        sink.push(notification("fetch-done", path))

    async def _send_cmd(self, sink: _GubleSink, scope: Scope, cmd: SendCmd) -> None:
        now = iso_time(time.time())
        info: dict[str, Any] = {
            "sequenceId": "",
            "path": cmd.path,
            "publisherMessageId": cmd.message_id,
            "messagePublishingTime": now,
        }

        def refuse(reason: str) -> None:
            text = f"{cmd.message_id} {reason}" if cmd.message_id else reason
            sink.push(notification("error-send", text, info, error=True))

        try:
            check_client_channel(cmd.path, "path")
        except ProtocolError as exc:
            refuse(exc.reason)
            return
        if self.allow_send is None:
            refuse("sending is disabled on this server")
            return
        if not await maybe_await(self.allow_send(scope, cmd.path)):
            refuse(f"not allowed to send to {cmd.path[:80]}")
            return
        data = message_data(sink.user_id, sink.application_id, cmd.message_id, now, cmd.headers, cmd.body)
        owner = user_topic_owner(cmd.path)
        try:
            mid = self.bus.publish(
                cmd.path,
                data,
                site_id=sink.site or "",
                user_ids=None if owner is None else user_space_ids(owner),
            )
        except (ShmbusError, TypeError, ValueError) as exc:
            refuse(str(exc)[:200])
            return
        if mid is None:
            refuse("the bus is off (publishing disabled)")
            return
        if await self.may_read(sink, cmd.path):  # else the id would tell how many messages the topic holds
            info["sequenceId"] = str(mid)
        sink.push(notification("ok-send", cmd.message_id, info))


class GubleRestPublish(AsgiRestPublish):
    """guble's ``POST /api/message/<topic>?userId=..&messageId=..``: the body is the message (UTF-8 text),
    ``X-Guble-<Name>`` headers become the header JSON (``{"<Name>": value}``, names in HTTP canonical case)."""

    def answer(
        self,
        channel: str,
        query: str,
        content_type: str | None,
        body: bytes,
        headers: dict[str, str],
        show_id: bool = True,
    ) -> bytes:
        try:
            params = parse_qs(query, keep_blank_values=True, errors="strict", max_num_fields=100)
        except (UnicodeDecodeError, ValueError):
            raise ProtocolError(400, "malformed query string")
        if "," in channel:
            raise ProtocolError(400, "a topic must not contain commas (a message's header line is comma separated)")
        unknown = sorted(set(params) - {"userId", "messageId"})
        if unknown:
            raise ProtocolError(400, f"unknown query parameter(s) {unknown}; known: userId, messageId")
        user = (params.get("userId") or [""])[-1]
        mid = (params.get("messageId") or [""])[-1]
        for name, value in (("userId", user), ("messageId", mid)):
            if len(value) > 256 or any(c in value for c in ",\r\n"):
                raise ProtocolError(400, f"{name} must be at most 256 characters without commas or line breaks")
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError(400, "the body is not valid UTF-8 (guble messages are text)")
        guble_headers = {
            _canonical(name[len("x-guble-") :]): value
            for name, value in headers.items()
            if name.startswith("x-guble-") and len(name) > len("x-guble-")
        }
        header_json = json.dumps(guble_headers, separators=(",", ":"), ensure_ascii=False) if guble_headers else ""
        now = iso_time(time.time())
        data = message_data(user, new_application_id(), mid, now, header_json, text)
        owner = user_topic_owner(channel)
        seq = publish_or_refuse(self.bus, channel, data, user_ids=None if owner is None else user_space_ids(owner))
        return json.dumps(
            {
                "sequenceId": str(seq) if show_id else "",
                "path": channel,
                "publisherMessageId": mid,
                "messagePublishingTime": now,
            }
        ).encode()


def _canonical(name: str) -> str:
    """HTTP canonical case, as guble (Go) sees header names: ``correlation-id`` -> ``Correlation-Id``."""
    return "-".join(part[:1].upper() + part[1:].lower() for part in name.split("-"))
