"""The admin page's ASGI and WSGI shells: routing, the admin check, static files, the event stream.

Routes below ``path`` (default ``/admin``), every one refused with 403 unless ``is_admin_lookup`` says yes:

* ``{path}/`` — the page (``{path}`` redirects there so its relative URLs resolve);
* ``{path}/static/<file>`` — its script and style and the vendored uPlot;
* ``{path}/events?tail=/channel`` — ASGI only: Server-Sent Events, one sample (plus the tail) a second;
* ``{path}/snapshot.json?tail=/channel&after=N`` — one sample, for the page's polling fallback (and WSGI).
"""

from __future__ import annotations

import asyncio
import html
import inspect
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from shmbus.errors import InvalidArgument

from ..asgi_support import maybe_await
from ..transports.hub import relative_path
from .sampler import Sampler, parse_tail, read_tail

if TYPE_CHECKING:
    from shmbus import Bus

__all__ = ["AdminApp", "AdminWSGIApp"]

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


class _Admin:
    """What both shells share: options, the sampler, routing to a reply."""

    def __init__(
        self, bus: Bus, is_admin_lookup: Callable[[Any], Any], path: str, interval: float, tail_default: str | None
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
        self.bus = bus
        self.is_admin_lookup = is_admin_lookup
        self.path = path
        self.interval = interval
        self.tail_default = tail_default
        self.sampler = Sampler(bus, min_interval=interval * 0.9)

    def owns(self, path: str) -> bool:
        return path == self.path or path.startswith(self.path + "/")

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
            body = {"sample": self.sampler.sample()}
            if channel:
                try:
                    body["tail"] = read_tail(self.bus, channel, after, site)
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


def _text(status: int, reason: str) -> Reply:
    return status, [("content-type", "text/plain; charset=utf-8")], (reason + "\n").encode()


def _query(raw: str) -> dict[str, list[str]]:
    try:
        return parse_qs(raw, keep_blank_values=True, errors="strict", max_num_fields=20)
    except (ValueError, UnicodeDecodeError):
        return {"__bad__": [""]}


class AdminApp(_Admin):
    """ASGI: the admin page under ``path``; other requests go to ``app`` (404 without one).

    ``is_admin_lookup(scope)`` (may be async) decides who sees it — the same lookup the message-bus middleware
    takes; anyone else gets 403. ``tail`` names a channel the page tails when it opens.
    """

    def __init__(
        self,
        app: Callable[..., Any] | None = None,
        *,
        bus: Bus,
        is_admin_lookup: Callable[[Any], Any],
        path: str = "/admin",
        interval: float = 1.0,
        tail: str | None = None,
    ) -> None:
        super().__init__(bus, is_admin_lookup, path, interval, tail)
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = relative_path(scope) if scope["type"] == "http" else ""
        if scope["type"] != "http" or not self.owns(path):
            if self.app is not None:
                await self.app(scope, receive, send)
            elif scope["type"] == "http":
                await _send(send, _text(404, "not found"))
            return
        if scope.get("method") not in ("GET", "HEAD"):
            await _send(send, _text(405, "GET only"))
            return
        if not await maybe_await(self.is_admin_lookup(scope)):
            await _send(send, _text(403, "forbidden: the admin page is for admins (is_admin_lookup said no)"))
            return
        query = _query(scope.get("query_string", b"").decode("latin-1"))
        if "__bad__" in query:
            await _send(send, _text(400, "malformed query string"))
            return
        reply = await asyncio.to_thread(self.reply, path, query)
        if reply is not None and reply[0] == 308:
            reply = (308, [("location", scope.get("root_path", "") + self.path + "/")], b"")
        if reply is not None:
            await _send(send, reply)
            return
        try:
            channel, after, site = parse_tail(query)
            if channel:
                await asyncio.to_thread(read_tail, self.bus, channel, after, site)  # refuse a bad tail up front
        except ValueError as exc:  # InvalidArgument is one
            await _send(send, _text(400, str(exc)))
            return
        await self._events(send, receive, channel, after, site)

    async def _events(self, send: Any, receive: Any, channel: str | None, after: int | None, site: str | None) -> None:
        gone = asyncio.Event()

        async def watch() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    gone.set()
                    return

        watcher = asyncio.ensure_future(watch())
        headers = [("content-type", "text/event-stream"), *_SECURITY]
        await send({"type": "http.response.start", "status": 200, "headers": _encode(headers)})
        try:
            while not gone.is_set():
                body: dict[str, Any] = {"sample": await asyncio.to_thread(self.sampler.sample)}
                if channel:
                    tail = await asyncio.to_thread(read_tail, self.bus, channel, after, site)
                    after = tail["last_id"]
                    body["tail"] = tail
                chunk = b"data: " + json.dumps(body).encode() + b"\n\n"
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                try:
                    await asyncio.wait_for(gone.wait(), timeout=self.interval)
                except asyncio.TimeoutError:
                    pass
        except OSError:  # the client went away mid-write
            pass
        finally:
            watcher.cancel()
        try:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            pass


def _encode(headers: list[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]


async def _send(send: Any, reply: Reply) -> None:
    status, headers, body = reply
    headers = [*headers, ("content-length", str(len(body))), *_SECURITY]
    await send({"type": "http.response.start", "status": status, "headers": _encode(headers)})
    await send({"type": "http.response.body", "body": body})


_REASONS = {
    200: "OK",
    308: "Permanent Redirect",
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
}


class AdminWSGIApp(_Admin):
    """WSGI twin of :class:`AdminApp` (``is_admin_lookup(environ)``, a plain function). It serves no event
    stream (a sync worker would be held by it): the page polls ``snapshot.json`` once a second instead."""

    def __init__(
        self,
        app: Callable[..., Any] | None = None,
        *,
        bus: Bus,
        is_admin_lookup: Callable[[Any], Any],
        path: str = "/admin",
        interval: float = 1.0,
        tail: str | None = None,
    ) -> None:
        super().__init__(bus, is_admin_lookup, path, interval, tail)
        self.app = app

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if not self.owns(path):
            if self.app is not None:
                result: Iterable[bytes] = self.app(environ, start_response)
                return result
            return _wsgi(start_response, _text(404, "not found"))
        if environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
            return _wsgi(start_response, _text(405, "GET only"))
        verdict = self.is_admin_lookup(environ)
        if inspect.isawaitable(verdict):
            if inspect.iscoroutine(verdict):
                verdict.close()
            raise TypeError("AdminWSGIApp needs a plain (not async) is_admin_lookup")
        if not verdict:
            return _wsgi(
                start_response, _text(403, "forbidden: the admin page is for admins (is_admin_lookup said no)")
            )
        query = _query(environ.get("QUERY_STRING", ""))
        if "__bad__" in query:
            return _wsgi(start_response, _text(400, "malformed query string"))
        reply = self.reply(path, query)
        if reply is None:
            return _wsgi(start_response, _text(404, "no event stream under WSGI: poll snapshot.json"))
        if reply[0] == 308:  # relative to the script root (SCRIPT_NAME) like any WSGI redirect
            reply = (308, [("location", environ.get("SCRIPT_NAME", "") + self.path + "/")], b"")
        return _wsgi(start_response, reply)


def _wsgi(start_response: Callable[..., Any], reply: Reply) -> list[bytes]:
    status, headers, body = reply
    start_response(
        f"{status} {_REASONS.get(status, '')}",
        [*headers, ("content-length", str(len(body))), *_SECURITY],
    )
    return [body]
