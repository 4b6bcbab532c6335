"""Delivering pushes: one lane per push service, each a bounded queue and a few worker threads with kept-alive
connections; RFC 8291 encryption in the workers; retries that honour ``Retry-After``.

Why lanes: a push service that is slow or hangs must not hold up the others, and nothing in the bus waits for
any of them (the sender reads the segment on its own thread). Each lane's queue is bounded (``max_queue`` jobs):
while the service keeps answering, a full queue is waited for (a burst is paced, not lost); once it is stalled
(:meth:`Sender._stalled`: busy workers without a final answer for ``stall_after`` seconds, default ``timeout``, or
a longer ``Retry-After`` pause), new jobs for it are dropped at once and counted, so a hung service costs the
others at most that one wait. A ``429`` or a ``5xx`` (or a timeout, or a cut
connection) pauses the lane until ``Retry-After`` (or an exponential backoff: 0.5 s doubling to 60 s) and puts
the job back at the front, up to ``max_attempts`` sends; a ``Retry-After`` beyond ``max_retry_after`` gives up.
``404``/``410`` mean the subscription is gone (``expired``: the caller removes it); any other answer is a failure.
A connection goes only to a port ``allow_ports`` names and an address ``allow_address`` accepts, checked after
resolving the host name and then connected to as checked (no second lookup a rebinding DNS could answer
differently); a push to another port or a host with no such address is a failure without a request (an endpoint
is a URL a user chose: SSRF).
"""

from __future__ import annotations

import email.utils
import enum
import http.client
import ipaddress
import logging
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import http_ece
from cryptography.hazmat.primitives.asymmetric import ec

from .addresses import IPAddress, describe_address, endpoint_port
from .options import PushOptions
from .subscriptions import Registration, b64url_decode
from .vapid import VapidKeys

__all__ = ["Job", "Outcome", "Sender"]

log = logging.getLogger(__name__)
MAX_BACKOFF = 60.0
MAX_ANSWER = 64 * 1024  # bytes of a push service's answer read at most (theirs are a few bytes)


class Outcome(enum.Enum):
    SENT = "sent"
    FAILED = "failed"  # a refusal (4xx), or retries exhausted
    EXPIRED = "expired"  # 404/410: the subscription is gone
    DROPPED = "dropped"  # its lane's queue was full


@dataclass
class Job:
    reg: Registration
    payload: bytes
    options: PushOptions
    done: Callable[[Job, Outcome, str], None]
    attempts: int = 0
    context: Any = None  # the caller's (the connector's message ticket)


class AddressRefused(OSError):
    """The endpoint's host resolves to no address the sender may connect to."""


def encrypt(payload: bytes, reg: Registration) -> bytes:
    """RFC 8291 ``aes128gcm``: a fresh ephemeral P-256 key and salt for every push, as the RFC requires."""
    return bytes(
        http_ece.encrypt(
            payload,
            salt=os.urandom(16),
            private_key=ec.generate_private_key(ec.SECP256R1()),
            dh=b64url_decode(reg.p256dh),
            auth_secret=b64url_decode(reg.auth),
            version="aes128gcm",
        )
    )


def retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or an HTTP date), None when absent or bad."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - now, 0.0)


@dataclass
class Lane:
    """One push service: its queue, its pause, its workers."""

    origin: str
    queue: deque[Job] = field(default_factory=deque)
    paused_until: float = 0.0
    progress: float = field(default_factory=time.monotonic)  # its last final answer, or when it stopped being idle
    busy: int = 0
    cond: threading.Condition = field(default_factory=threading.Condition)
    threads: list[threading.Thread] = field(default_factory=list)


@dataclass(frozen=True)
class LaneOptions:
    """How every lane sends: the connector's keywords of the same names and meaning (their defaults are there, in
    one place), with ``stall_after`` resolved (None there: ``timeout``)."""

    workers_per_service: int
    max_queue: int
    timeout: float
    max_attempts: int
    max_retry_after: float
    stall_after: float
    allow_address: Callable[[IPAddress], bool]
    allow_ports: frozenset[int] | None  # None: any


class Sender:
    """Lanes created on first use; ``submit`` waits only while a lane that is answering has a full queue.
    ``on_event(name)`` counts ``retried`` (the outcomes go to each job's ``done``)."""

    def __init__(self, vapid: VapidKeys, options: LaneOptions, on_event: Callable[[str], None] | None = None) -> None:
        self.vapid = vapid
        self.options = options
        self.on_event = on_event or (lambda _name: None)
        self._lanes: dict[str, Lane] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def queue_depth(self) -> int:
        return sum(len(lane.queue) + lane.busy for lane in list(self._lanes.values()))

    def submit(self, job: Job) -> None:
        """Queue ``job``. A full queue of a lane that is making progress is waited for (this holds up only the
        caller, the sender's reader); a full queue of a stalled lane (a hung or throttled service) drops the job
        at once, with ``done(DROPPED)``."""
        lane = self._lane(job.reg.origin)
        with lane.cond:
            while len(lane.queue) >= self.options.max_queue:
                if self._stop.is_set() or self._stalled(lane, time.monotonic()):
                    break
                lane.cond.wait(0.05)
            else:
                lane.queue.append(job)
                lane.cond.notify()
                return
        job.done(job, Outcome.DROPPED, f"queue of {lane.origin} full ({self.options.max_queue}) and stalled")

    def stop(self, grace: float = 0.0) -> int:
        """Stop the workers after up to ``grace`` seconds of draining. Jobs still queued then are abandoned, not
        settled (their ``done`` is never called: their messages stay above the cursor, for the next sender); the
        number abandoned is returned. Pushes already on the wire finish (bounded by ``timeout``)."""
        deadline = time.monotonic() + grace
        while grace and self.queue_depth() and time.monotonic() < deadline:
            time.sleep(0.02)
        self._stop.set()
        left = 0
        for lane in list(self._lanes.values()):
            with lane.cond:
                left += len(lane.queue)
                lane.queue.clear()
                lane.cond.notify_all()
        for lane in list(self._lanes.values()):
            for t in lane.threads:
                t.join(timeout=self.options.timeout + 1)
        return left

    def _stalled(self, lane: Lane, now: float) -> bool:
        """Its workers have waited ``stall_after`` for a final answer, or it is paused for longer than that (a
        ``Retry-After``). A lane whose workers are idle is not stalled: they are about to take the queue."""
        return (
            bool(lane.busy and now - lane.progress > self.options.stall_after)
            or lane.paused_until - now > self.options.stall_after
        )

    def _lane(self, origin: str) -> Lane:
        lane = self._lanes.get(origin)
        if lane is not None:
            return lane
        with self._lock:
            lane = self._lanes.get(origin)
            if lane is None:
                lane = self._lanes[origin] = Lane(origin)
                for i in range(self.options.workers_per_service):
                    t = threading.Thread(target=self._work, args=(lane,), name=f"shmbus-push-{i}", daemon=True)
                    lane.threads.append(t)
                    t.start()
        return lane

    # ------------------------------------------------------------------ a worker
    def _take(self, lane: Lane) -> Job | None:
        with lane.cond:
            while not self._stop.is_set():
                wait = lane.paused_until - time.monotonic()
                if wait <= 0 and lane.queue:
                    if not lane.busy:  # an idle lane starts its clock now: idleness is no stall
                        lane.progress = time.monotonic()
                    lane.busy += 1
                    return lane.queue.popleft()
                lane.cond.wait(timeout=wait if wait > 0 else None)
            return None

    def _work(self, lane: Lane) -> None:
        conn: http.client.HTTPConnection | None = None
        while True:
            job = self._take(lane)
            if job is None:
                break
            try:
                conn = self._one(lane, conn, job)
            except Exception:  # a bug must not kill the lane; the job is settled as failed
                log.exception("shmbus push: sending to %s failed", lane.origin)
                self._settle(lane, job, Outcome.FAILED, "internal error")
        if conn is not None:
            conn.close()

    def _settle(self, lane: Lane, job: Job, outcome: Outcome, why: str, answered: bool = False) -> None:
        """``answered``: the service gave a final answer (2xx, 404/410, another 4xx), which is progress; a
        timeout, a cut connection or retries running out are not."""
        with lane.cond:
            lane.busy -= 1
            if answered:
                lane.progress = time.monotonic()
            lane.cond.notify_all()
        job.done(job, outcome, why)

    def _one(self, lane: Lane, conn: http.client.HTTPConnection | None, job: Job) -> http.client.HTTPConnection | None:
        job.attempts += 1
        status, wait, why = 0, None, ""
        try:
            body = encrypt(job.payload, job.reg)
            if conn is None:
                conn = _connect(lane.origin, self.options)
            status, wait = self._post(conn, job, body)
            why = f"HTTP {status}"
        except AddressRefused as exc:  # final: retrying would resolve to the same refusal
            if conn is not None:
                conn.close()
            self._settle(lane, job, Outcome.FAILED, str(exc)[:200], answered=True)
            return None
        except (OSError, http.client.HTTPException) as exc:
            why = f"{type(exc).__name__}: {exc}"[:200]
            if conn is not None:
                conn.close()
            conn = None
        if 200 <= status < 300:
            self._settle(lane, job, Outcome.SENT, why, answered=True)
        elif status in (404, 410):
            self._settle(lane, job, Outcome.EXPIRED, why, answered=True)
        elif status and status != 429 and status < 500:
            self._settle(lane, job, Outcome.FAILED, why, answered=True)
        else:  # 429, 5xx, timeout, connection error
            self._retry(lane, job, wait, why)
        return conn

    def _retry(self, lane: Lane, job: Job, wait: float | None, why: str) -> None:
        if job.attempts >= self.options.max_attempts or (wait is not None and wait > self.options.max_retry_after):
            self._settle(lane, job, Outcome.FAILED, f"{why}; gave up after {job.attempts} attempt(s)")
            return
        delay = wait if wait is not None else min(0.5 * 2 ** (job.attempts - 1), MAX_BACKOFF)
        self.on_event("retried")
        with lane.cond:
            lane.busy -= 1
            lane.paused_until = max(lane.paused_until, time.monotonic() + delay)
            lane.queue.appendleft(job)
            lane.cond.notify_all()

    def _post(self, conn: http.client.HTTPConnection, job: Job, body: bytes) -> tuple[int, float | None]:
        parts = urlsplit(job.reg.endpoint)
        path = parts.path + ("?" + parts.query if parts.query else "")
        headers = {
            "Authorization": self.vapid.authorization(job.reg.origin),
            "Content-Encoding": "aes128gcm",
            "Content-Type": "application/octet-stream",
            "Content-Length": str(len(body)),
            **job.options.headers(),
        }
        conn.request("POST", path or "/", body=body, headers=headers)
        resp = conn.getresponse()
        whole = _drain(resp, time.monotonic() + self.options.timeout)
        wait = retry_after(resp.getheader("Retry-After"), time.time())
        if resp.will_close or not whole:
            conn.close()
        return resp.status, wait


def _drain(resp: http.client.HTTPResponse, deadline: float) -> bool:
    """Read the answer's body, at most :data:`MAX_ANSWER` bytes until ``deadline``; False when there was more
    (the caller hangs up): an endpoint is a URL a user chose, and its server may answer without end."""
    got = 0
    while not resp.isclosed():
        if resp.length == 0:  # all of it read (``read1`` leaves the response open then; ``read`` closes it)
            resp.read()
            break
        if got > MAX_ANSWER or time.monotonic() > deadline:
            return False
        chunk = resp.read1(16384)
        if not chunk:
            break
        got += len(chunk)
    return True


def _connect(origin: str, options: LaneOptions) -> http.client.HTTPConnection:
    """A connection to ``origin`` on a port ``options.allow_ports`` names, whose socket goes only to an address
    ``options.allow_address`` accepts (TLS still verifies the host name: SNI and the certificate are the name's,
    the address is the checked one)."""
    parts = urlsplit(origin)
    port, ports, allow = endpoint_port(origin), options.allow_ports, options.allow_address
    if ports is not None and port not in ports:
        raise AddressRefused(f"port {port} is not allowed (allow_ports: {', '.join(map(str, sorted(ports)))})")
    conn: http.client.HTTPConnection
    if parts.scheme == "https":
        conn = http.client.HTTPSConnection(parts.hostname or "", port, timeout=options.timeout)
    else:
        conn = http.client.HTTPConnection(parts.hostname or "", port, timeout=options.timeout)

    def create_connection(address: tuple[str, int], timeout: Any = None, source: Any = None) -> socket.socket:
        host, port = address
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise OSError(f"cannot resolve {host}: {exc}") from None
        allowed = [i for i in infos if allow(_address(i[4][0]))]
        if not allowed:
            shown = ", ".join(sorted({describe_address(_address(i[4][0])) for i in infos}))[:200]
            raise AddressRefused(f"{host} resolves to no allowed address ({shown}): not connected")
        error: OSError | None = None
        for family, kind, proto, _name, sockaddr in allowed:
            sock = socket.socket(family, kind, proto)
            try:
                sock.settimeout(timeout)
                if source:
                    sock.bind(source)
                sock.connect(sockaddr)
                return sock
            except OSError as exc:
                sock.close()
                error = exc
        assert error is not None
        raise error

    conn._create_connection = create_connection  # type: ignore[attr-defined]
    try:  # now, before the push is signed: a refused address fails as such, whatever else is wrong with the job
        conn.connect()
    except BaseException:
        conn.close()
        raise
    return conn


def _address(text: Any) -> IPAddress:
    """A resolved address without its IPv6 zone (``fe80::1%eth0``)."""
    return ipaddress.ip_address(str(text).split("%", 1)[0])
