"""A request of the lean server (:class:`Request`): its head, its buffered body and where it is in its life."""

from __future__ import annotations

from typing import Any, Protocol


class BodyListener(Protocol):
    """Who waits for a request's body (the ASGI bridge's cycle): told when more of it, or its end, arrives."""

    def notify(self) -> None: ...


class Request:
    """One parsed request (head, buffered body) while it is read and answered; released when answered."""

    __slots__ = (
        "answered",
        "body",
        "body_size",
        "bus",
        "chunked",
        "complete",
        "cycle",
        "expect_continue",
        "head_done",
        "headers",
        "keep",
        "method",
        "path",
        "query",
        "raw_path",
        "refused",
        "started",
        "too_large",
        "url",
        "version",
    )

    def __init__(self) -> None:
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.body_size = 0
        self.method = "GET"
        self.path = "/"
        self.raw_path = b"/"
        self.query = b""
        self.version = "1.1"
        self.keep = True
        self.bus = False
        self.complete = False
        self.started = False
        self.answered = False  # its response is complete: body bytes still arriving for it are dropped
        self.too_large = False
        self.expect_continue = False
        self.head_done = False
        self.chunked = False
        self.refused: tuple[int, str] | None = None  # answered with this error instead of being served
        self.cycle: BodyListener | None = None  # the bridge's cycle reading its body, if any

    def header(self, name: bytes) -> bytes | None:
        for k, v in self.headers:
            if k == name:
                return v
        return None


def asgi_scope(req: Request, transport: Any, state: dict[str, Any] | None) -> dict[str, Any]:
    """The ASGI ``http`` scope of ``req`` on ``transport`` (``state``: what the lifespan startup left)."""
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": req.version,
        "server": transport.get_extra_info("sockname"),
        "client": transport.get_extra_info("peername"),
        "scheme": "http",
        "method": req.method,
        "root_path": "",
        "path": req.path,
        "raw_path": req.raw_path,
        "query_string": req.query,
        "headers": req.headers,
    }
    if state is not None:
        scope["state"] = dict(state)
    return scope
