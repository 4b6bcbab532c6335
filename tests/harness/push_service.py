"""A local RFC 8030 push service, the protocol peer of the push tests: it checks what a real one checks and
decrypts what a browser would.

Each subscription made by :meth:`PushService.subscribe` has its own P-256 key pair and auth secret (the browser's
side of RFC 8291) and is bound to one VAPID public key (the ``applicationServerKey`` a page subscribes with). A
push (``POST /push/<token>``) is accepted (201) only with: a ``vapid t=<JWT>,k=<key>`` Authorization whose key is
the bound one and whose ES256 signature verifies (checked here with ``cryptography``, not with the sender's
library), ``aud`` equal to this service's origin, ``exp`` in the future and at most 24 hours away, ``sub`` a
``mailto:``/``https:`` URI; a ``TTL`` header; ``Content-Encoding: aes128gcm``; at most 4096 bytes that decrypt
with the subscription's private key. Every accepted push is recorded as a :class:`Delivery`; every refusal too.

Behaviours per subscription (``set_mode``): ``gone`` (404 or 410), ``throttle`` (429 with ``Retry-After`` for
the first n pushes), ``error`` (500 for the first n), ``hang`` (held unanswered until :meth:`release_hung` or
:meth:`stop`), ``slow`` (answer after a delay), ``endless`` (accept, then send a body without end: a hostile
endpoint's server). ``verify=False`` (benchmarks) accepts without decrypting, counting only.
"""

from __future__ import annotations

import base64
import json
import os
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import http_ece
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, utils

__all__ = ["Delivery", "PushService", "b64url"]


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass
class Delivery:
    token: str
    payload: Any  # the decrypted JSON
    ttl: int
    urgency: str | None
    topic: str | None
    at: float


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
    """Start with :meth:`start`; stop with :meth:`stop` (also releases hung requests)."""

    verify: bool = True
    deliveries: list[Delivery] = field(default_factory=list)
    refusals: list[tuple[str, int, str]] = field(default_factory=list)
    attempts: list[tuple[str, float, int]] = field(default_factory=list)  # (token, time, status answered)
    accepted: int = 0

    def __post_init__(self) -> None:
        self._subs: dict[str, _Sub] = {}
        self._lock = threading.Lock()
        self._unhang = threading.Event()
        self.hanging = 0  # requests held open by "hang" right now
        self._server: ThreadingHTTPServer | None = None

    # ------------------------------------------------------------------ control
    def start(self) -> PushService:
        service = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                service._handle(self)

            def do_GET(self) -> None:  # the count, for a benchmark running the service in another process
                body = json.dumps({"accepted": service.accepted}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="push-service", daemon=True).start()
        return self

    def release_hung(self) -> None:
        """Cut every request held by ``hang`` (and those that arrive later) without an answer."""
        self._unhang.set()

    def stop(self) -> None:
        self._unhang.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    @property
    def origin(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def subscribe(self, server_key: str) -> dict[str, Any]:
        """A new browser subscription bound to ``server_key``: the ``PushSubscription.toJSON()`` a page posts."""
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
    def token_of(subscription: dict[str, Any]) -> str:
        return str(subscription["endpoint"]).rsplit("/", 1)[1]

    def set_mode(self, subscription: dict[str, Any], mode: str, count: int = 0, arg: float = 0.0) -> None:
        with self._lock:
            sub = self._subs[self.token_of(subscription)]
            sub.mode, sub.count, sub.arg = mode, count, arg

    def received(self, subscription: dict[str, Any]) -> list[Delivery]:
        token = self.token_of(subscription)
        with self._lock:
            return [d for d in self.deliveries if d.token == token]

    # ------------------------------------------------------------------ a push
    def _handle(self, req: BaseHTTPRequestHandler) -> None:
        length = int(req.headers.get("Content-Length") or 0)
        body = req.rfile.read(length)
        token = req.path.rsplit("/", 1)[-1]
        if not self.verify:  # benchmarks: any token, counted only
            with self._lock:
                self.accepted += 1
            self._answer(req, token, 201, "")
            return
        with self._lock:
            sub = self._subs.get(token) if req.path.startswith("/push/") else None
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
        problem = self._check(req, sub, body)
        if problem is not None:
            self._answer(req, token, problem[0], problem[1])
            return
        if mode == "endless":
            self._endless(req, token)
            return
        self._answer(req, token, 201, "", {"Location": f"{self.origin}/message/{b64url(os.urandom(6))}"})

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
                headers: dict[str, str] | None = None) -> None:  # fmt: skip
        data = reason.encode()
        if self.verify:  # benchmarks keep no per-push record
            with self._lock:
                self.attempts.append((token, time.time(), status))
                if status >= 300:
                    self.refusals.append((token, status, reason))
        try:
            req.send_response(status)
            for k, v in (headers or {}).items():
                req.send_header(k, v)
            req.send_header("Content-Length", str(len(data)))
            req.end_headers()
            req.wfile.write(data)
        except OSError:
            pass

    def _check(self, req: BaseHTTPRequestHandler, sub: _Sub, body: bytes) -> tuple[int, str] | None:
        """What a push service checks (RFC 8030, 8291, 8292), then what the browser does: decrypt."""
        auth = req.headers.get("Authorization") or ""
        if not auth.startswith("vapid "):
            return 401, "missing vapid Authorization"
        try:
            params = dict(part.strip().split("=", 1) for part in auth[6:].split(","))
            token, key = params["t"], params["k"]
        except (KeyError, ValueError):
            return 401, "malformed vapid Authorization"
        if key != sub.server_key:
            return 403, "VAPID key differs from the subscription's applicationServerKey"
        problem = self._check_jwt(token, key)
        if problem:
            return 401, problem
        ttl = req.headers.get("TTL")
        if ttl is None or not ttl.isdigit():
            return 400, "missing or bad TTL"
        if (req.headers.get("Content-Encoding") or "").lower() != "aes128gcm":
            return 415, "Content-Encoding must be aes128gcm"
        if len(body) > 4096:
            return 413, "payload over 4096 bytes"
        try:
            plain = http_ece.decrypt(body, private_key=sub.key, auth_secret=sub.auth, version="aes128gcm")
            payload = json.loads(plain)
        except Exception as exc:  # a push the browser could not read
            return 400, f"cannot decrypt: {exc}"
        with self._lock:
            self.deliveries.append(
                Delivery(
                    sub.token, payload, int(ttl), req.headers.get("Urgency"), req.headers.get("Topic"), time.time()
                )
            )
        return None

    def _check_jwt(self, token: str, key: str) -> str | None:
        try:
            head_b64, claims_b64, sig_b64 = token.split(".")
            header = json.loads(_unb64(head_b64))
            claims = json.loads(_unb64(claims_b64))
            sig = _unb64(sig_b64)
            public = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), _unb64(key))
        except ValueError as exc:
            return f"malformed JWT: {exc}"
        if header.get("alg") != "ES256" or len(sig) != 64:
            return "JWT must be ES256"
        der = utils.encode_dss_signature(int.from_bytes(sig[:32], "big"), int.from_bytes(sig[32:], "big"))
        try:
            public.verify(der, f"{head_b64}.{claims_b64}".encode(), ec.ECDSA(hashes.SHA256()))
        except InvalidSignature:
            return "JWT signature does not verify"
        now = time.time()
        if claims.get("aud") != self.origin:
            return f"aud {claims.get('aud')!r} is not {self.origin!r}"
        exp = claims.get("exp")
        if not isinstance(exp, int) or not now < exp <= now + 86400:
            return "exp must be in the future and within 24 hours"
        if not str(claims.get("sub", "")).startswith(("mailto:", "https:")):
            return "sub must be a mailto: or https: URI"
        return None


if __name__ == "__main__":  # a count-only service for benchmarks: prints its origin, serves until killed
    service = PushService(verify=False).start()
    print(service.origin, flush=True)
    threading.Event().wait()
