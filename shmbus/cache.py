"""``DistributedCache``: a dict kept in step across every process through the bus (message_bus's semantics).

Writes publish an operation (``set``/``delete``/``clear``) on a channel of its own, hidden from HTTP clients
(``user_ids=[-1]``, as the gem does) and apply locally at once (read-your-writes). Every process applies every
operation in the bus's id order, its own included, so all copies converge on the same value even when two
processes write one key at the same moment (the gem applies by arrival order and can diverge).

Unlike the gem, a process that starts late sees the current values: it replays the channel's backlog. To keep
that replay short and within the backlog limit, every ``snapshot_every``-th operation is followed by a snapshot of
the whole cache, published by the process that wrote that operation; a late starter begins at the newest
snapshot and applies the operations after it.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
from collections.abc import Iterator, MutableMapping
from typing import TYPE_CHECKING, Any

from .message import Message

if TYPE_CHECKING:
    from .bus import Bus

__all__ = ["DistributedCache"]

log = logging.getLogger("shmbus")
CHANNEL_PREFIX = "/__shmbus_cache/"
HIDDEN = [-1]
_FOREVER = 10 * 365 * 86400.0  # the cache's history must not expire like an idle channel's  # user id no HTTP client has: the gem's way of keeping internal traffic off the wire


class DistributedCache(MutableMapping[str, Any]):
    """A dict-like cache, shared by every process attached to ``bus`` (default: the module's default bus).

    Keys are strings; values must be encodable by the bus codec (JSON by default: str, numbers, bools, None,
    lists and dicts with string keys). ``app_version`` scopes the cache: operations from processes running
    another version are ignored. With ``namespace=True`` each site (``bus.site_id_lookup()``) has its own data.
    """

    def __init__(
        self,
        name: str,
        app_version: str | None = None,
        bus: Bus | None = None,
        *,
        namespace: bool = True,
        snapshot_every: int = 200,
    ) -> None:
        if bus is None:
            from . import default_bus

            bus = default_bus()
        if not isinstance(name, str) or not name:
            raise ValueError("cache name must be a non-empty string")
        self.name = name
        self.key = name
        self.app_version = app_version
        self.bus = bus
        self.namespace = namespace
        self.snapshot_every = max(int(snapshot_every), 10)
        self.identity = f"{secrets.token_hex(8)}:{os.getpid()}"
        self.channel = CHANNEL_PREFIX + name
        self._data: dict[str, dict[str, Any]] = {}
        self._lock = threading.RLock()
        self._pending: list[Message] = []  # operations since the newest snapshot (for snapshot catch-up)
        self._applied_id = 0
        self._complete = True
        self._sub = bus.subscribe(self.channel, self._on_message, last_id=0, site_id="")
        if not self._complete:
            log.warning("shmbus: DistributedCache %r started from an incomplete history (the bus no longer holds "
                        "its older operations); values written before then are missing", name)

    # ------------------------------------------------------------------ local view
    def _site(self) -> str:
        if not self.namespace:
            return "default"
        lookup = self.bus.site_id_lookup
        return (lookup() if lookup else None) or "default"

    def hash(self, site_id: str | None = None) -> dict[str, Any]:
        """A copy of the data of ``site_id`` (default: the current site), as the gem's ``hash``."""
        with self._lock:
            return dict(self._data.get(site_id or self._site(), {}))

    def __getitem__(self, key: str) -> Any:
        return self._data.get(self._site(), {})[self._check_key(key)]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._data.get(self._site(), {})))

    def __len__(self) -> int:
        return len(self._data.get(self._site(), {}))

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key in self._data.get(self._site(), {})

    @staticmethod
    def _check_key(key: Any) -> str:
        if not isinstance(key, str):
            raise TypeError(f"DistributedCache keys must be str, got {type(key).__name__}")
        return key

    # ------------------------------------------------------------------ writes
    def __setitem__(self, key: str, value: Any) -> None:
        key = self._check_key(key)
        site = self._site()
        self._publish({"op": "set", "key": key, "value": value, "site": site})  # raises before any local change
        with self._lock:
            self._data.setdefault(site, {})[key] = value

    def __delitem__(self, key: str) -> None:
        key = self._check_key(key)
        site = self._site()
        with self._lock:
            if key not in self._data.get(site, {}):
                raise KeyError(key)
        self.delete(key)

    def delete(self, key: str, publish: bool = True) -> None:
        """Delete ``key`` everywhere (or only here with ``publish=False``); a missing key is not an error."""
        key = self._check_key(key)
        site = self._site()
        if publish:
            self._publish({"op": "delete", "key": key, "site": site})
        with self._lock:
            self._data.get(site, {}).pop(key, None)

    def clear(self) -> None:
        site = self._site()
        self._publish({"op": "clear", "site": site})
        with self._lock:
            self._data.pop(site, None)

    def _publish(self, op: dict[str, Any]) -> None:
        op["origin"] = self.identity
        if self.app_version is not None:
            op["v"] = self.app_version
        mid = self.bus.publish(self.channel, op, user_ids=HIDDEN, site_id="",
                               max_backlog_size=self.snapshot_every * 20, max_backlog_age=_FOREVER)
        if mid and mid % self.snapshot_every == 0:
            self._publish_snapshot(mid)

    def _publish_snapshot(self, mid: int) -> None:
        """Publish the whole cache as of operation ``mid`` (this process has applied every op up to it)."""
        with self._lock:
            data = {site: dict(d) for site, d in self._data.items()}
        snap: dict[str, Any] = {"op": "snapshot", "as_of": mid, "data": data, "origin": self.identity}
        if self.app_version is not None:
            snap["v"] = self.app_version
        try:
            self.bus.publish(self.channel, snap, user_ids=HIDDEN, site_id="",
                             max_backlog_size=self.snapshot_every * 20, max_backlog_age=_FOREVER)
        except Exception:
            log.exception("shmbus: DistributedCache %r could not publish a snapshot", self.name)

    # ------------------------------------------------------------------ applying operations
    def _on_message(self, msg: Message) -> None:
        op = msg.data
        if not isinstance(op, dict):
            return
        if self.app_version is not None and op.get("v") != self.app_version:
            return
        with self._lock:
            if self._applied_id == 0 and msg.message_id > 1 and op.get("op") != "snapshot":
                # First thing we see is not the start of the history and not a snapshot: we may miss values.
                self._complete = False
            kind = op.get("op")
            if kind == "snapshot":
                as_of = int(op.get("as_of", 0))
                data = op.get("data")
                if isinstance(data, dict):
                    self._data = {str(s): dict(d) for s, d in data.items() if isinstance(d, dict)}
                    self._complete = True
                    # Operations we already saw that the snapshot does not include: apply them again on top.
                    replay = [m for m in self._pending if m.message_id > as_of]
                    self._pending = []
                    for m in replay:
                        self._apply(m.data)
                        self._pending.append(m)
            else:
                self._apply(op)
                self._pending.append(msg)
                if len(self._pending) > self.snapshot_every * 2:
                    del self._pending[: self.snapshot_every]
            self._applied_id = msg.message_id

    def _apply(self, op: dict[str, Any]) -> None:
        site = op.get("site") or "default"
        kind = op.get("op")
        if kind == "set":
            self._data.setdefault(site, {})[op["key"]] = op.get("value")
        elif kind == "delete":
            self._data.get(site, {}).pop(op.get("key"), None)
        elif kind == "clear":
            self._data.pop(site, None)

    def close(self) -> None:
        """Stop following the bus (the local copy stays readable)."""
        if self._sub is not None:
            self.bus.unsubscribe(self.channel, self._sub)
            self._sub = None

    def __repr__(self) -> str:
        return f"DistributedCache({self.name!r}, {len(self)} keys)"
