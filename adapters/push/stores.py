"""Where push subscriptions and the sender's cursor live: never in process memory only.

:class:`~.state.Store` (in :mod:`.state`) is the contract; :class:`FileStore` keeps them in files next to a
file-backed bus (one host), and :class:`~shmbus.adapters.push.pgstore.PostgresStore` in the PostgreSQL bridge's
database (every host). :func:`store_for` picks the one the bus's users already have state in.

The sender's state (:class:`~.state.SenderState`) is the cursor (the newest global id whose pushes are all
settled), the counters, and a *term*: each new sender increments it when it takes over, and a cursor save names
its term, so a sender that lost its election without noticing can never move the cursor
(:class:`~.state.StaleSender`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

from .state import SenderState, StaleSender, Store
from .subscriptions import Registration, user_key

__all__ = ["FileStore", "store_for", "write_atomically"]


def write_atomically(path: str, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that readers, and a writer killed at any point, see the old or the new
    content, never a mix: a temporary file is written and fsynced, renamed over ``path``, and the directory
    fsynced (the rename itself is durable)."""
    directory = os.path.dirname(path) or "."
    tmp = f"{path}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dfd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


class FileStore:
    """Subscriptions in ``<base>.json`` and the sender state in ``<base>.state.json`` (mode 0600), each replaced
    atomically (:func:`write_atomically`); read-modify-write is serialised across processes by ``flock`` on
    ``<base>.lock`` (released by the kernel if the writer dies). Every change rewrites the whole file: fine for
    thousands of devices on one host; use PostgreSQL beyond that."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.path = base + ".json"
        self.state_path = base + ".state.json"
        self.lock_path = base + ".lock"
        os.makedirs(os.path.dirname(os.path.abspath(base)), exist_ok=True)

    def __repr__(self) -> str:
        return f"FileStore({self.base!r})"

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing the description drops the flock

    def _read(self, path: str) -> Any:
        try:
            with open(path, "rb") as f:
                return json.loads(f.read())
        except FileNotFoundError:
            return None

    def _subs(self) -> dict[str, dict[str, Any]]:
        data = self._read(self.path) or {"subscriptions": []}
        return {item["endpoint"]: item for item in data["subscriptions"]}

    def _write_subs(self, subs: dict[str, dict[str, Any]]) -> None:
        body = {"subscriptions": list(subs.values())}
        write_atomically(self.path, json.dumps(body, separators=(",", ":")).encode())

    def add(self, reg: Registration) -> None:
        with self._locked():
            subs = self._subs()
            subs[reg.endpoint] = reg.to_json()
            self._write_subs(subs)

    def remove(self, endpoint: str, user_id: Any = None) -> bool:
        with self._locked():
            subs = self._subs()
            item = subs.get(endpoint)
            if item is None or (user_id is not None and user_key(item["user_id"]) != user_key(user_id)):
                return False
            del subs[endpoint]
            self._write_subs(subs)
            return True

    def of_user(self, user_id: Any) -> list[Registration]:
        key = user_key(user_id)
        return [Registration.from_json(i) for i in self._subs().values() if user_key(i["user_id"]) == key]

    def all(self) -> list[Registration]:
        return [Registration.from_json(i) for i in self._subs().values()]

    def version(self) -> Any:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)  # a replace always makes a new inode

    def load(self) -> SenderState:
        return SenderState.from_json(self._read(self.state_path) or {})

    def take_over(self, leader: str) -> SenderState:
        with self._locked():
            state = self.load()
            state.term += 1
            state.leader = leader
            write_atomically(self.state_path, json.dumps(asdict(state)).encode())
            return state

    def save(self, state: SenderState) -> None:
        with self._locked():
            if self.load().term != state.term:
                raise StaleSender(f"term {state.term} is over")
            write_atomically(self.state_path, json.dumps(asdict(state)).encode())

    def close(self) -> None:
        pass


def store_for(bus: Any, namespace: str = "default") -> Store:
    """The store a bus's users already have state in: the PostgreSQL bridge's database when the bus uses one,
    else files next to a file-backed bus (``Bus(path=...)``). Anything else (a ``/dev/shm`` bus, the Redis
    bridge) has no durable place of its own: pass ``store=`` explicitly (a :class:`FileStore` on a persistent
    disk, or a :class:`~shmbus.adapters.push.pgstore.PostgresStore`)."""
    engine = bus.default
    if type(engine).__name__ == "PostgresBridge":
        from .pgstore import PostgresStore

        return PostgresStore(engine.dsn, namespace)
    if bus.path:
        return FileStore(f"{bus.path}.push-{namespace}")
    raise ValueError(
        f"no durable place for push subscriptions on bus {bus.name!r}: it is neither file-backed (Bus(path=...)) nor "
        "bridged through PostgreSQL; pass store=FileStore('/var/lib/app/push') or store=PostgresStore(dsn)"
    )
