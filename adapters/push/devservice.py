"""A development push service: a local stand-in for the browser vendors' push services, FOR DEVELOPMENT ONLY.

Why: a real browser pushes only through its vendor's service (Chrome: FCM; Firefox: Mozilla's autopush), which a
machine offline or a test cannot reach. This one speaks RFC 8030 to the application server and plays the browser's
part itself: it hands out subscriptions (``POST /subscriptions`` with the ``applicationServerKey``, or
:meth:`PushService.subscribe`), each with its own P-256 key pair and auth secret, so it can decrypt what it
receives. A push (``POST /push/<token>``) is taken (201) only with what a real service checks
(:mod:`.devchecks`): a VAPID ``Authorization`` by the subscription's key whose JWT verifies for this origin, a
``TTL``, ``aes128gcm``, at most 4096 bytes, and a body that decrypts. Every push taken is kept (the newest
``keep``) with its decrypted payload: ``GET /`` shows them, ``GET /deliveries[?endpoint=URL][&after=SEQ]`` is
JSON. Nothing is ever delivered to a browser, and nothing is stored on disk (a restarted service knows no
subscription: pushes to old ones are 404, and the sender removes them).

Run it: ``shmbus push-dev`` (or ``python -m shmbus.adapters.push.devservice``), on 127.0.0.1:8030 by default;
the sender refuses loopback addresses and ports other than 443 unless told (:class:`~.devpolicy.DevAllowance`).
docs/push.md has the steps. The tests use the same class in-process, with ``set_mode`` behaviours a real push
service shows: ``gone`` (404 or 410), ``throttle`` (429 with ``Retry-After`` for the first n pushes), ``error``
(500 for the first n), ``hang`` (held unanswered until :meth:`~PushService.release_hung` or ``stop``), ``slow``
(answer after a delay), ``endless`` (201 and a body without end: a hostile endpoint's server). ``verify=False``
(benchmarks) takes any push to any token, counting only.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from .devchecks import b64url, check_push, decode_payload, unb64url
from .devpage import ReceivedPush, deliveries_view, index_page

__all__ = ["DEFAULT_PORT", "ReceivedPush", "PushService", "b64url", "main"]

DEFAULT_PORT = 8030  # after RFC 8030
MAX_SUBSCRIBE = 4096  # bytes of a POST /subscriptions body


class _Server6(ThreadingHTTPServer):
    address_family = socket.AF_INET6


@dataclass
class _Sub:
    token: str
    key: ec.EllipticCurvePrivateKey
    auth: bytes
    server_key: str  # the applicationServerKey it is bound to
    mode: str = "ok"
    count: int = 0  # how many pushes the mode still applies to (throttle, error)
    arg: float = 0.0  # Retry-After seconds, delay, or the 404/410 status
    attempts: int = 0


@dataclass
class PushService:
    """Start with :meth:`start`; stop with :meth:`stop` (also releases hung requests). ``host``/``port``: where
    it listens (port 0: a free one; :attr:`origin` says which), ``keep``: how many deliveries, refusals and
    attempts are kept (None: all, as the tests want), ``on_push(token, status, text)``: called for every push
    answered (``text``: the refusal's reason, or the payload taken as JSON)."""

    verify: bool = True
    host: str = "127.0.0.1"
    port: int = 0
    keep: int | None = None
    on_push: Callable[[str, int, str], None] | None = None
    deliveries: list[ReceivedPush] = field(default_factory=list)
    refusals: list[tuple[str, int, str]] = field(default_factory=list)
    attempts: list[tuple[str, float, int]] = field(default_factory=list)  # (token, time, status answered)
    accepted: int = 0

    def __post_init__(self) -> None:
        self._subs: dict[str, _Sub] = {}
        self._lock = threading.Lock()
        self._unhang = threading.Event()
        self._seq = 0
        self.hanging = 0  # requests held open by "hang" right now
        self._server: ThreadingHTTPServer | None = None
        self._conns: set[socket.socket] = set()  # open (kept-alive) connections: stop() cuts them

    # ------------------------------------------------------------------ control
    def start(self) -> PushService:
        service = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                with service._lock:
                    service._conns.add(self.connection)

            def finish(self) -> None:
                try:
                    super().finish()
                finally:
                    with service._lock:
                        service._conns.discard(self.connection)

            def do_POST(self) -> None:
                service._post(self)

            def do_GET(self) -> None:
                service._get(self)

        self._server = (_Server6 if ":" in self.host else ThreadingHTTPServer)((self.host, self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="push-service", daemon=True).start()
        return self

    def release_hung(self) -> None:
        """Cut every request held by ``hang`` (and those that arrive later) without an answer."""
        self._unhang.set()

    def stop(self) -> None:
        """Stop listening and cut the open connections: a stopped service answers nothing more (a kept-alive
        connection would otherwise go on being served)."""
        self._unhang.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    @property
    def origin(self) -> str:
        assert self._server is not None
        host, port = str(self._server.server_address[0]), self._server.server_address[1]
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def subscribe(self, server_key: str) -> dict[str, Any]:
        """A new browser subscription bound to ``server_key``: the ``PushSubscription.toJSON()`` a page posts.
        ValueError: ``server_key`` is not a P-256 public key (as ``pushManager.subscribe`` refuses it)."""
        try:
            ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), unb64url(server_key))
        except (TypeError, ValueError):
            raise ValueError("applicationServerKey must be a base64url P-256 public key (65 bytes)") from None
        token = b64url(os.urandom(12))
        key = ec.generate_private_key(ec.SECP256R1())
        sub = _Sub(token, key, os.urandom(16), server_key)
        with self._lock:
            self._subs[token] = sub
        point = key.public_key().public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)
        return {
            "endpoint": f"{self.origin}/push/{token}",
            "expirationTime": None,
            "keys": {"p256dh": b64url(point), "auth": b64url(sub.auth)},
        }

    @staticmethod
    def token_of(subscription: dict[str, Any] | str) -> str:
        """The token of a subscription (or of its endpoint URL)."""
        endpoint = subscription if isinstance(subscription, str) else subscription["endpoint"]
        return str(endpoint).rsplit("/", 1)[1]

    def set_mode(self, subscription: dict[str, Any], mode: str, count: int = 0, arg: float = 0.0) -> None:
        with self._lock:
            sub = self._subs[self.token_of(subscription)]
            sub.mode, sub.count, sub.arg = mode, count, arg

    def received(self, subscription: dict[str, Any] | str) -> list[ReceivedPush]:
        token = self.token_of(subscription)
        with self._lock:
            return [d for d in self.deliveries if d.token == token]

    # ------------------------------------------------------------------ the developer's routes
    def _get(self, req: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(req.path)
        query = parse_qs(parts.query, max_num_fields=10)
        if parts.path == "/count":  # a benchmark's count (the service in another process)
            self._reply(req, 200, json.dumps({"accepted": self.accepted}).encode(), "application/json")
        elif parts.path == "/deliveries":
            with self._lock:
                view = deliveries_view(query, self.deliveries, self.refusals, self.origin)
            self._reply(req, 200, json.dumps(view, default=str).encode(), "application/json")
        elif parts.path == "/":
            with self._lock:
                page = index_page(self.origin, len(self._subs), self.deliveries[-100:], self.refusals[-20:])
            self._reply(req, 200, page.encode(), "text/html; charset=utf-8")
        else:
            self._reply(req, 404, b"no such page; see / (pushes go to POST /push/<token>)")

    def _post(self, req: BaseHTTPRequestHandler) -> None:
        if req.path.startswith("/push/"):
            self._handle(req)
        elif req.path == "/subscriptions":
            self._subscribe(req)
        else:
            self._reply(req, 404, b"POST /push/<token> (a push) or /subscriptions (a new subscription)")

    def _subscribe(self, req: BaseHTTPRequestHandler) -> None:
        """``POST /subscriptions`` ``{"applicationServerKey": ...}`` (JSON only: no cross-site form can send it)
        -> 201 and the ``PushSubscription.toJSON()`` to register with the application server."""
        length = req.headers.get("Content-Length") or ""
        if (req.headers.get("Content-Type") or "").split(";")[0].strip().lower() != "application/json":
            self._reply(req, 415, b'send {"applicationServerKey": "<base64url>"} as application/json')
            return
        if not length.isdigit() or int(length) > MAX_SUBSCRIBE:
            self._reply(req, 413, b"body too large (or no Content-Length)")
            return
        try:
            body = json.loads(req.rfile.read(int(length)))
            sub = self.subscribe(body["applicationServerKey"])
        except (ValueError, KeyError, TypeError) as exc:
            reason = str(exc) if isinstance(exc, ValueError) else 'send {"applicationServerKey": "<base64url>"}'
            self._reply(req, 400, reason.encode())
            return
        self._reply(req, 201, json.dumps(sub).encode(), "application/json")

    # ------------------------------------------------------------------ a push
    def _handle(self, req: BaseHTTPRequestHandler) -> None:
        length = req.headers.get("Content-Length") or "0"
        if not length.isdigit() or int(length) > 2 * 4096:
            self._answer(req, "", 413, "payload over 4096 bytes (or a bad Content-Length)")
            req.close_connection = True
            return
        body = req.rfile.read(int(length))
        token = req.path.rsplit("/", 1)[-1]
        if not self.verify:  # benchmarks: any token, counted only
            with self._lock:
                self.accepted += 1
            self._answer(req, token, 201, "")
            return
        with self._lock:
            sub = self._subs.get(token) if req.path.count("/") == 2 else None
        if sub is None:
            self._answer(req, token, 404, "no such subscription")
            return
        with self._lock:
            sub.attempts += 1
            mode = sub.mode
            if mode in ("throttle", "error") and sub.count <= 0:
                mode = "ok"
            elif mode in ("throttle", "error"):
                sub.count -= 1
        if mode == "gone":
            self._answer(req, token, int(sub.arg or 410), "gone")
            return
        if mode == "hang":  # hold the request until release_hung() (or stop), then cut the connection unanswered
            with self._lock:
                self.hanging += 1
            self._unhang.wait()
            with self._lock:
                self.hanging -= 1
            req.close_connection = True
            return
        if mode == "throttle":
            self._answer(req, token, 429, "slow down", {"Retry-After": str(int(sub.arg))})
            return
        if mode == "error":
            self._answer(req, token, 500, "internal error")
            return
        if mode == "slow":
            time.sleep(sub.arg)
        problem = check_push(req.headers, body, sub.server_key, self.origin)
        if problem is None:
            try:
                payload = decode_payload(body, sub.key, sub.auth)
            except ValueError as exc:  # a push the browser could not read
                problem = 400, str(exc)
        if problem is not None:
            self._answer(req, token, *problem)
            return
        self._keep(token, payload, req)
        if mode == "endless":
            self._endless(req, token)
            return
        shown = json.dumps(payload, default=str)[:300]
        self._answer(req, token, 201, "", {"Location": f"{self.origin}/message/{b64url(os.urandom(6))}"}, shown)

    def _keep(self, token: str, payload: Any, req: BaseHTTPRequestHandler) -> None:
        with self._lock:
            self._seq += 1
            head = req.headers
            ttl = int(head.get("TTL") or 0)
            got = ReceivedPush(token, payload, ttl, head.get("Urgency"), head.get("Topic"), time.time(), self._seq)
            self.deliveries.append(got)
            self.accepted += 1
            if self.keep is not None and len(self.deliveries) > self.keep:
                del self.deliveries[: len(self.deliveries) - self.keep]

    def _endless(self, req: BaseHTTPRequestHandler, token: str) -> None:
        """201 with a body (no length: it ends when the connection does) written until the client hangs up."""
        with self._lock:
            self.attempts.append((token, time.time(), 201))
        req.close_connection = True
        try:
            req.send_response(201)
            req.end_headers()
            while not self._unhang.is_set():
                req.wfile.write(b"x" * 16384)
        except OSError:
            pass

    def _answer(self, req: BaseHTTPRequestHandler, token: str, status: int, reason: str,
                headers: dict[str, str] | None = None, shown: str | None = None) -> None:  # fmt: skip
        """A push's answer, recorded (benchmarks keep no per-push record); ``on_push`` gets the reason, or for a
        push taken ``shown``: its payload."""
        if self.verify:
            with self._lock:
                self.attempts.append((token, time.time(), status))
                if status >= 300:
                    self.refusals.append((token, status, reason))
                    if self.keep is not None and len(self.refusals) > self.keep:
                        del self.refusals[: len(self.refusals) - self.keep]
                if self.keep is not None and len(self.attempts) > self.keep:
                    del self.attempts[: len(self.attempts) - self.keep]
            if self.on_push is not None:
                self.on_push(token, status, reason if shown is None else shown)
        self._reply(req, status, reason.encode(), headers=headers)

    @staticmethod
    def _reply(req: BaseHTTPRequestHandler, status: int, data: bytes, ctype: str = "text/plain; charset=utf-8",
               headers: dict[str, str] | None = None) -> None:  # fmt: skip
        try:
            req.send_response(status)
            for k, v in (headers or {}).items():
                req.send_header(k, v)
            req.send_header("Content-Type", ctype)
            req.send_header("Cache-Control", "no-store")
            req.send_header("Content-Length", str(len(data)))
            req.end_headers()
            req.wfile.write(data)
        except OSError:
            pass


# ---------------------------------------------------------------------- the command
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on and name in endpoints "
                   "(default 127.0.0.1: keep a development tool on loopback)")  # fmt: skip
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}; 0: a free port")
    p.add_argument("--keep", type=int, default=1000, help="deliveries kept (the newest; default 1000)")
    p.add_argument("--count-only", action="store_true", help="take any push to any token, keep nothing "
                   "(benchmarks)")  # fmt: skip
    p.add_argument("--quiet", action="store_true", help="no line per push on stderr")


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted; the origin goes to stdout first (a script started with ``--port 0`` reads it)."""
    if args.host in ("0.0.0.0", "::", ""):
        sys.exit("shmbus push-dev: --host must be the address the application server connects to, not a wildcard")

    def show(token: str, status: int, reason: str) -> None:
        print(f"shmbus push-dev: {status} for …{token[-8:]}{': ' + reason if reason else ''}", file=sys.stderr,
              flush=True)  # fmt: skip

    quiet = args.quiet or args.count_only
    service = PushService(verify=not args.count_only, host=args.host, port=args.port, keep=max(args.keep, 1),
                          on_push=None if quiet else show)  # fmt: skip
    try:
        service.start()
    except OSError as exc:
        sys.exit(f"shmbus push-dev: cannot listen on {args.host}:{args.port}: {exc}")
    print(service.origin, flush=True)
    if not args.count_only:
        print(f"shmbus push-dev: a DEVELOPMENT push service (not a real one) at {service.origin}/ ; pushes it takes "
              "are shown there. Point an app at it: docs/push.md, 'The development push service'. Stop: Ctrl-C",
              file=sys.stderr, flush=True)  # fmt: skip
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        service.stop()
    return 0


def main(argv: list[str] | None = None, prog: str = "python -m shmbus.adapters.push.devservice") -> int:
    p = argparse.ArgumentParser(prog=prog, description="A development push service: a local stand-in for the "
                                "browsers' push services, for development and tests only (docs/push.md).")  # fmt: skip
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
