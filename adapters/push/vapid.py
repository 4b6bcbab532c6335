"""The application server's VAPID identity (RFC 8292): its key pair and the ``Authorization`` header per push service.

Why a cache: a VAPID token is an ES256 JWT over ``{aud, exp, sub}``; ``aud`` is the push service's origin, so one
token serves every push to that service until it expires. pywebpush's ``webpush()`` signs one per call; the
sender signs one per service every ``lifetime / 2`` (RFC 8292 allows at most 24 hours; we use 12).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from py_vapid import Vapid02, b64urlencode

__all__ = ["VapidKeys"]


class VapidKeys:
    """A VAPID key pair plus the ``sub`` claim (``mailto:`` or ``https:`` contact the push service may use).

    Build one with :meth:`load` (a PEM file written by ``vapid --gen``, PEM text, or the raw base64url private
    key) or :meth:`generate` (tests; a key that changes invalidates every browser's subscription)."""

    def __init__(self, vapid: Vapid02, sub: str, lifetime: int = 12 * 3600) -> None:
        if not isinstance(sub, str) or not sub.startswith(("mailto:", "https:")):
            raise ValueError(f"VAPID sub must be a mailto: or https: URI, got {sub!r}")
        if not 60 <= lifetime <= 24 * 3600:
            raise ValueError("VAPID token lifetime must be 60 s to 24 h (RFC 8292)")
        self.vapid = vapid
        self.sub = sub
        self.lifetime = lifetime
        self._lock = threading.Lock()
        self._tokens: dict[str, tuple[float, str]] = {}

    @classmethod
    def load(cls, key: str, sub: str, **kw: Any) -> VapidKeys:
        """From a PEM file path, PEM text, or a base64url raw/DER private key."""
        if os.path.isfile(key):
            return cls(Vapid02.from_file(key), sub, **kw)
        if "-----BEGIN" in key:
            return cls(Vapid02.from_pem(key.encode()), sub, **kw)
        return cls(Vapid02.from_string(key), sub, **kw)

    @classmethod
    def generate(cls, sub: str, **kw: Any) -> VapidKeys:
        vapid = Vapid02()
        vapid.generate_keys()
        return cls(vapid, sub, **kw)

    @property
    def public_key(self) -> str:
        """The ``applicationServerKey`` a page passes to ``pushManager.subscribe`` (base64url, 65-byte point)."""
        from cryptography.hazmat.primitives import serialization

        raw = self.vapid.public_key.public_bytes(
            serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
        )
        return str(b64urlencode(raw))

    def private_pem(self) -> bytes:
        return bytes(self.vapid.private_pem())

    def authorization(self, origin: str, now: float | None = None) -> str:
        """``vapid t=<jwt>,k=<public key>`` for pushes to ``origin`` (re-signed at half its lifetime)."""
        now = time.time() if now is None else now
        with self._lock:
            cached = self._tokens.get(origin)
            if cached is not None and cached[0] - now > self.lifetime / 2:
                return cached[1]
        exp = int(now) + self.lifetime
        header = str(self.vapid.sign({"aud": origin, "exp": exp, "sub": self.sub})["Authorization"])
        with self._lock:
            self._tokens[origin] = (exp, header)
        return header
