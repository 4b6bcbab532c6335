"""The admin page's ASGI and WSGI shells: routing, the admin check, static files, the live feed.

Routes below ``path`` (default ``/admin``), every one refused with 403 unless ``is_admin_lookup`` says yes:

* ``{path}/`` — the page (``{path}`` redirects there so its relative URLs resolve);
* ``{path}/static/<file>`` — its script and style and the vendored uPlot;
* ``{path}/events?view=<id>&tail=/channel`` — the live feed: the bus's own SSE transport
  (:class:`~shmbus.adapters.transports.sse.SSEApp`, or :class:`~shmbus.adapters.transports.sse_wsgi.SSEWSGIApp`
  under gevent or threads) subscribed to the view's channel ``/_shmbus_admin/<id>``, on which this worker
  publishes one sample (plus the tail) a second while the page is open;
* ``{path}/snapshot.json?tail=/channel&after=N`` — one sample, for the page's polling fallback (sync WSGI
  workers, where a stream would hold the worker).

Why the feed is a bus message: the page is a client of the bus like any other and shows that its transport
works end to end. The samples are published process-locally (``engine=False``: they cost no ring space and
never reach other workers or hosts) and targeted at a random per-app viewer id that only this app's event stream
resolves as its user, so no other transport (message-bus polls, other SSE or WebSocket apps, guble) can deliver
them, whatever channel, prefix or glob its clients ask for.
"""

from __future__ import annotations

import asyncio
import html
import inspect
import json
import logging
import re
import secrets
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol
from urllib.parse import parse_qs

from shmbus.errors import InvalidArgument
from shmbus.presence import hub_for

from ..asgi_support import Receive, Scope, Send, fallback, maybe_await, relative_path, send_whole
from ..transports.connection import Connection
from ..transports.sse import SSEApp
from ..transports.sse_wsgi import SSEWSGIApp
from ..wsgi_support import Environ, StartResponse, start_whole
from .sampler import Sampler, parse_tail, read_tail

if TYPE_CHECKING:
    from shmbus import Bus

__all__ = ["VIEW_CHANNEL_PREFIX", "AdminApp", "AdminWSGIApp"]

log = logging.getLogger(__name__)

#: Each open page listens on ``VIEW_CHANNEL_PREFIX + <its view id>``.
VIEW_CHANNEL_PREFIX = "/_shmbus_admin/"
_VIEW_ID = re.compile(r"[A-Za-z0-9_-]{8,64}")
Tail = tuple[str | None, int | None, str | None]

STATIC_DIR = Path(__file__).resolve().parent / "static"
_TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".html": "text/html; charset=utf-8",
}
STATIC_FILES = ("admin.js", "admin.css", "uPlot.iife.min.js", "uPlot.min.css")
_SECURITY = [
    ("cache-control", "no-store"),
    ("x-content-type-options", "nosniff"),
    ("x-frame-options", "DENY"),
    ("content-security-policy", "default-src 'self'; style-src 'self' 'unsafe-inline'"),
]

Reply = tuple[int, list[tuple[str, str]], bytes]


class _Feeds(Protocol):
    """How a shell feeds its open pages (a task per page on an event loop, a thread per page under WSGI)."""

    def __init__(self, admin: _Admin) -> None: ...

    def open(self, conn: Connection) -> None: ...

    def close(self, conn: Connection) -> None: ...


class _Admin:
    """What both shells share: options, the sampler, the event stream and routing to a reply (sans-IO)."""

    #: the shell's event-stream app (:class:`SSEApp` or :class:`SSEWSGIApp`) and how it feeds open pages
    _stream_app: ClassVar[Callable[..., Any]]
    _feeds_of: ClassVar[type[_Feeds]]

    def __init__(
        self,
        app: Callable[..., Any] | None = None,
        *,
        bus: Bus,
        is_admin_lookup: Callable[[Any], Any],
        path: str = "/admin",
        interval: float = 1.0,
        tail: str | None = None,
        panels: dict[str, Callable[[], dict[str, Any]]] | None = None,
        presence: bool = True,
    ) -> None:
        if not callable(is_admin_lookup):
            raise TypeError(
                "the admin page needs is_admin_lookup (scope or environ -> bool): it shows every worker's figures "
                "and channel payloads, so it is never open to everyone by default"
            )
        if not path.startswith("/") or path.endswith("/"):
            raise ValueError(f"path must start with '/' and not end with one, got {path!r}")
        if interval <= 0:
            raise ValueError(f"interval must be positive, got {interval!r}")
        self.app = app
        self.bus = bus
        self.is_admin_lookup = is_admin_lookup
        self.path = path
        self.interval = interval
        self.tail_default = tail
        self.panels = dict(panels or {})
        self.presence = presence  # presence per channel (docs/presence.md): this process reads it once a page opens
        self.sampler = Sampler(bus, min_interval=interval * 0.9)
        # The user id the event stream gives its clients and the samples are targeted at: random per app, so no
        # user id any other transport's lookup returns can equal it.
        self.viewer = f"shmbus-admin:{secrets.token_hex(16)}"
        self.feeds = type(self)._feeds_of(self)
        self.events = type(self)._stream_app(
            bus=bus,
            path=path + "/events",
            on_open=self.feeds.open,
            on_close=self.feeds.close,
            user_id_lookup=self.viewer_id,
        )

    def viewer_id(self, _scope_or_environ: Any) -> str:
        """``user_id_lookup`` of the admin event stream (it is only reached after the admin check)."""
        return self.viewer

    def check_view(self, query: dict[str, list[str]]) -> None:
        """Refuse a bad event-stream request up front (ValueError with the reason; InvalidArgument is one): the view
        id, and a tail the bus cannot read (e.g. a channel and site too long together). Reads no sample."""
        _, (channel, after, site) = parse_view(query)
        if channel:
            read_tail(self.bus, channel, after, site)

    def body(self, tail: Tail) -> tuple[dict[str, Any], int | None]:
        """One feed message (the sample, plus the tail when one is asked for) and the tail's new position."""
        channel, after, site = tail
        body: dict[str, Any] = {"sample": self.sampler.sample()}
        if self.panels:
            body["panels"] = {name: _panel(fn) for name, fn in self.panels.items()}
        if self.presence:
            body["presence"] = hub_for(self.bus).summary()
        if channel:
            body["tail"] = read_tail(self.bus, channel, after, site)
            after = body["tail"]["last_id"]
        return body, after

    def publish_view(self, channel: str, body: dict[str, Any]) -> None:
        """Send one feed message to the page listening on ``channel``: through this process's transports only."""
        self.bus.publish(channel, body, engine=False, user_ids=[self.viewer])

    def owns(self, path: str) -> bool:
        return path == self.path or path.startswith(self.path + "/")

    def answer(self, path: str, raw_query: str, root: str) -> Reply | None:
        """An admin's GET of ``path`` (below ``root``, the shell's mount point): its reply, or None for the event
        stream once its request checks out. Reads files and samples: the ASGI shell calls it in a thread."""
        query = _query(raw_query)
        if "__bad__" in query:
            return _text(400, "malformed query string")
        reply = self.reply(path, query)
        if reply is None:
            try:
                self.check_view(query)
            except ValueError as exc:
                return _text(400, str(exc))
            return None
        if reply[0] == 308:  # relative to the mount point, like any redirect of a mounted app
            return 308, [("location", root + self.path + "/")], b""
        return reply

    def reply(self, path: str, query: dict[str, list[str]]) -> Reply | None:
        """The reply to an admin's GET (None: the event stream, which only the ASGI shell serves)."""
        sub = path[len(self.path) :]
        if sub == "":
            return 308, [("location", self.path + "/")], b""
        if sub == "/":
            return 200, [("content-type", _TYPES[".html"])], self.page()
        if sub.startswith("/static/"):
            name = sub[len("/static/") :]
            if name not in STATIC_FILES:
                return _text(404, "no such file")
            return 200, [("content-type", _TYPES[Path(name).suffix])], (STATIC_DIR / name).read_bytes()
        if sub == "/snapshot.json":
            try:
                channel, after, site = parse_tail(query)
            except ValueError as exc:
                return _text(400, str(exc))
            try:
                body, _ = self.body((channel, after, site))
            except InvalidArgument as exc:  # e.g. channel and site together too long to be stored
                return _text(400, str(exc))
            return 200, [("content-type", "application/json")], json.dumps(body).encode()
        if sub == "/events":
            return None
        return _text(404, "not found")

    def page(self) -> bytes:
        page = (STATIC_DIR / "index.html").read_text()
        config = json.dumps({"bus": self.bus.name, "interval": self.interval, "tail": self.tail_default or ""})
        return page.replace("{{CONFIG}}", html.escape(config, quote=True)).encode()


def _panel(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """One extra panel's figures; a panel that fails shows its error instead of breaking the page."""
    try:
        return {k: v if isinstance(v, (int, float, str, bool)) or v is None else str(v) for k, v in fn().items()}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[:200]}


def parse_view(query: dict[str, list[str]]) -> tuple[str, Tail]:
    """``?view=<id>&tail=..`` of the event stream -> (the view's channel, the tail); ValueError with a reason."""
    view = (query.get("view") or [""])[-1]
    if not _VIEW_ID.fullmatch(view):
        raise ValueError("view must be 8 to 64 letters, digits, '-' or '_' (the page makes one at random)")
    return VIEW_CHANNEL_PREFIX + view, parse_tail(query)


def _text(status: int, reason: str) -> Reply:
    return status, [("content-type", "text/plain; charset=utf-8")], (reason + "\n").encode()


def _query(raw: str) -> dict[str, list[str]]:
    try:
        return parse_qs(raw, keep_blank_values=True, errors="strict", max_num_fields=20)
    except (ValueError, UnicodeDecodeError):
        return {"__bad__": [""]}


class _TaskFeeds:
    """A task per open page on the event loop, publishing a sample a second until the page goes."""

    def __init__(self, admin: _Admin) -> None:
        self.admin = admin
        self.tasks: dict[int, asyncio.Task[None]] = {}

    def open(self, conn: Connection) -> None:
        channel, tail = parse_view(_query(conn.scope.get("query_string", b"").decode("latin-1")))
        conn.subscribe(channel)
        self.tasks[id(conn)] = asyncio.ensure_future(self._feed(conn, channel, tail))

    def close(self, conn: Connection) -> None:
        feed = self.tasks.pop(id(conn), None)
        if feed is not None:
            feed.cancel()

    async def _feed(self, conn: Connection, channel: str, tail: Tail) -> None:
        admin = self.admin
        try:
            while conn.open and not conn.live:  # the stream is still opening
                await asyncio.sleep(0.005)
            while conn.open:
                body, after = await asyncio.to_thread(admin.body, tail)
                tail = (tail[0], after, tail[2])
                admin.publish_view(channel, body)
                await asyncio.sleep(admin.interval)
        except Exception:  # the bus closed under it, or a bug (a cancel when the page goes is no Exception)
            log.exception("shmbus: the admin feed of %s stopped", channel)


class AdminApp(_Admin):
    """ASGI: the admin page under ``path``; other requests go to ``app`` (404 without one).

    ``is_admin_lookup(scope)`` (may be async) decides who sees it — the same lookup the message-bus middleware
    takes; anyone else gets 403. ``tail`` names a channel the page tails when it opens. ``panels`` adds named
    tables of figures, each a callable read with every sample (``{"push": connector.stats}``).
    """

    _stream_app = SSEApp
    _feeds_of = _TaskFeeds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = relative_path(scope) if scope["type"] == "http" else ""
        if scope["type"] != "http" or not self.owns(path):
            await fallback(self.app, scope, receive, send)
            return
        refused = _method_refused(scope.get("method"))
        if refused is None and not await maybe_await(self.is_admin_lookup(scope)):
            refused = _FORBIDDEN
        reply = refused or await asyncio.to_thread(
            self.answer, path, scope.get("query_string", b"").decode("latin-1"), scope.get("root_path", "")
        )
        if reply is None:
            await self.events(scope, receive, send)
            return
        status, headers, body = reply
        await send_whole(send, status, [*headers, *_SECURITY], body)


class _ThreadFeeds:
    """A thread (a greenlet under gevent's patching) per open page, like the stream it feeds."""

    def __init__(self, admin: _Admin) -> None:
        self.admin = admin
        self.stops: dict[int, threading.Event] = {}
        self.lock = threading.Lock()

    def open(self, conn: Connection) -> None:
        channel, tail = parse_view(_query(conn.scope.get("QUERY_STRING", "")))
        conn.subscribe(channel)
        stop = threading.Event()
        with self.lock:
            self.stops[id(conn)] = stop
        threading.Thread(target=self._feed, args=(conn, channel, tail, stop), daemon=True).start()

    def close(self, conn: Connection) -> None:
        with self.lock:
            stop = self.stops.pop(id(conn), None)
        if stop is not None:
            stop.set()

    def _feed(self, conn: Connection, channel: str, tail: Tail, stop: threading.Event) -> None:
        admin = self.admin
        try:
            while conn.open and not conn.live and not stop.is_set():  # the stream is still opening
                stop.wait(0.005)
            while conn.open and not stop.is_set():
                body, after = admin.body(tail)
                tail = (tail[0], after, tail[2])
                admin.publish_view(channel, body)
                stop.wait(admin.interval)
        except Exception:  # the bus closed under it, or a bug: the page shows it stopped updating
            log.exception("shmbus: the admin feed of %s stopped", channel)


class AdminWSGIApp(_Admin):
    """WSGI twin of :class:`AdminApp` (``is_admin_lookup(environ)``, a plain function). Its event stream is the
    bus's :class:`~shmbus.adapters.transports.sse_wsgi.SSEWSGIApp`, so it needs gevent or threaded workers; a
    sync worker refuses it with 503 (a stream would hold the worker) and the page polls ``snapshot.json`` once a
    second instead."""

    _stream_app = SSEWSGIApp
    _feeds_of = _ThreadFeeds

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if not self.owns(path):
            if self.app is not None:
                result: Iterable[bytes] = self.app(environ, start_response)
                return result
            return _start(start_response, _text(404, "not found"))
        refused = _method_refused(environ.get("REQUEST_METHOD"))
        if refused is None and not self._plain_verdict(environ):
            refused = _FORBIDDEN
        reply = refused or self.answer(path, environ.get("QUERY_STRING", ""), environ.get("SCRIPT_NAME", ""))
        if reply is None:
            events: Iterable[bytes] = self.events(environ, start_response)
            return events
        return _start(start_response, reply)

    def _plain_verdict(self, environ: Environ) -> bool:
        verdict = self.is_admin_lookup(environ)
        if inspect.isawaitable(verdict):
            if inspect.iscoroutine(verdict):
                verdict.close()
            raise TypeError("AdminWSGIApp needs a plain (not async) is_admin_lookup")
        return bool(verdict)


def _method_refused(method: str | None) -> Reply | None:
    return None if method in ("GET", "HEAD") else _text(405, "GET only")


_FORBIDDEN = _text(403, "forbidden: the admin page is for admins (is_admin_lookup said no)")


def _start(start_response: StartResponse, reply: Reply) -> list[bytes]:
    status, headers, body = reply
    return start_whole(start_response, status, [*headers, *_SECURITY], body)
