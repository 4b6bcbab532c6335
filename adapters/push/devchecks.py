"""What the development push service checks on a push, sans-IO: the rules of RFC 8030 (the request), RFC 8292
(the VAPID ``Authorization``) and RFC 8291 (``aes128gcm``, decrypted as the browser would).

Why a module of its own: these are the rules a real push service applies before it takes a push, kept apart from
the HTTP server (:mod:`.devservice`) so that what is checked reads in one place. The signature is verified with
``cryptography`` directly, not with the sender's VAPID library, so a sender bug is not hidden by the same bug here.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from typing import Any, Protocol

import http_ece
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, utils

__all__ = ["MAX_BODY", "Headers", "Refusal", "b64url", "check_jwt", "check_push", "decode_payload", "unb64url"]

MAX_BODY = 4096  # RFC 8030 8.2: a push service must accept at least this much; the large ones accept no more
MAX_EXP = 86400  # RFC 8292 2: ``exp`` at most 24 hours away

#: ``(HTTP status, reason)``: why a push is refused.
Refusal = tuple[int, str]


class Headers(Protocol):
    """A request's headers, looked up by name without regard to case (``http.server``'s, ``email.message``'s)."""

    def get(self, name: str, default: None = None) -> str | None: ...


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unb64url(text: str) -> bytes:
    """Base64url with or without padding; ValueError when it is not."""
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"not base64url: {exc}") from None


def check_push(headers: Headers, body: bytes, server_key: str, origin: str) -> Refusal | None:
    """A push's request as a push service checks it, before decrypting: the VAPID ``Authorization`` (its key
    must be ``server_key``, the ``applicationServerKey`` the subscription was made with, and its JWT must hold for
    ``origin``), a ``TTL``, ``aes128gcm`` for a body of at most 4096 bytes."""
    auth = headers.get("Authorization") or ""
    if not auth.startswith("vapid "):
        return 401, "missing vapid Authorization (RFC 8292: 'vapid t=<JWT>,k=<public key>')"
    try:
        params = dict(part.strip().split("=", 1) for part in auth[6:].split(","))
        token, key = params["t"], params["k"]
    except (KeyError, ValueError):
        return 401, "malformed vapid Authorization (RFC 8292: 'vapid t=<JWT>,k=<public key>')"
    if key != server_key:
        return 403, "VAPID key differs from the subscription's applicationServerKey"
    problem = check_jwt(token, key, origin)
    if problem:
        return 401, problem
    ttl = headers.get("TTL")
    if ttl is None or not ttl.isdigit():
        return 400, "missing or bad TTL (RFC 8030 5.2: seconds)"
    if body and (headers.get("Content-Encoding") or "").lower() != "aes128gcm":
        return 415, "Content-Encoding must be aes128gcm (RFC 8291)"
    if len(body) > MAX_BODY:
        return 413, f"payload over {MAX_BODY} bytes"
    return None


def check_jwt(token: str, key: str, origin: str, now: float | None = None) -> str | None:
    """Why the VAPID JWT ``token`` does not hold for pushes to ``origin`` (None: it does): ES256 signed by
    ``key``, ``aud`` the origin, ``exp`` in the future and within 24 hours, ``sub`` a contact URI."""
    try:
        head_b64, claims_b64, sig_b64 = token.split(".")
        header = json.loads(unb64url(head_b64))
        claims = json.loads(unb64url(claims_b64))
        sig = unb64url(sig_b64)
        public = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), unb64url(key))
    except ValueError as exc:
        return f"malformed JWT: {exc}"
    if not isinstance(header, dict) or not isinstance(claims, dict):
        return "malformed JWT: header and claims must be JSON objects"
    if header.get("alg") != "ES256" or len(sig) != 64:
        return "JWT must be ES256"
    der = utils.encode_dss_signature(int.from_bytes(sig[:32], "big"), int.from_bytes(sig[32:], "big"))
    try:
        public.verify(der, f"{head_b64}.{claims_b64}".encode(), ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        return "JWT signature does not verify"
    now = time.time() if now is None else now
    if claims.get("aud") != origin:
        return f"aud {claims.get('aud')!r} is not {origin!r}"
    exp = claims.get("exp")
    if not isinstance(exp, int) or not now < exp <= now + MAX_EXP:
        return "exp must be in the future and within 24 hours"
    if not str(claims.get("sub", "")).startswith(("mailto:", "https:")):
        return "sub must be a mailto: or https: URI"
    return None


def decode_payload(body: bytes, key: ec.EllipticCurvePrivateKey, auth: bytes) -> Any:
    """What the browser's service worker gets: the body decrypted with the subscription's private key and auth
    secret, as JSON when it is JSON, else as text (None for a push without a body). ValueError: it does not
    decrypt (the browser would drop it)."""
    if not body:
        return None
    try:
        plain = http_ece.decrypt(body, private_key=key, auth_secret=auth, version="aes128gcm")
    except Exception as exc:  # http_ece raises its own ECEException, and ValueError/InvalidTag from cryptography
        raise ValueError(f"cannot decrypt: {exc}") from None
    text = bytes(plain).decode("utf-8", "replace")
    try:
        return json.loads(text)
    except ValueError:
        return text
