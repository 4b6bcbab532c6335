"""A scripted HTTP server for what real servers cannot be made to do on cue: a 429, a first chunk that never
comes, an exact byte stream. It records every request (time, path, headers, form body)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl


@dataclass
class Seen:
    at: float
    path: str
    headers: dict[str, str]
    form: dict[str, str]


@dataclass
class Reply:
    """``status``, ``headers`` and ``pieces`` (bytes; a float: sleep that long; None: drop the connection there, as
    a killed server does); chunked unless ``length``."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=lambda: {"Content-Type": "application/json; charset=utf-8"})
    pieces: list[bytes | float | None] = field(default_factory=lambda: [b"[]"])
    chunked: bool = False


class Stub:
    """``Stub(script)``: ``script(seen, n)`` returns the Reply to the n-th request (0-based)."""

    def __init__(self, script: Callable[[Seen, int], Reply]) -> None:
        self.script = script
        self.seen: list[Seen] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
                seen = Seen(time.monotonic(), self.path, dict(self.headers.items()), dict(parse_qsl(body)))
                stub.seen.append(seen)
                reply = stub.script(seen, len(stub.seen) - 1)
                self.send_response(reply.status)
                for k, v in reply.headers.items():
                    self.send_header(k, v)
                data = [p for p in reply.pieces if isinstance(p, bytes)]
                if reply.chunked:
                    self.send_header("Transfer-Encoding", "chunked")
                else:
                    self.send_header("Content-Length", str(sum(map(len, data))))
                self.end_headers()
                try:
                    for piece in reply.pieces:
                        if piece is None:
                            self.close_connection = True
                            return
                        if isinstance(piece, float):
                            time.sleep(piece)
                        elif reply.chunked:
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                        else:
                            self.wfile.write(piece)
                        self.wfile.flush()
                    if reply.chunked:
                        self.wfile.write(b"0\r\n\r\n")
                except OSError:
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="stub-server", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> Stub:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)
