"""``DistributedCache``: a dict kept in step across every process through the bus (message_bus's semantics).

Writes publish an operation (``set``/``delete``/``clear``) on a channel of its own, hidden from HTTP clients
(``user_ids=[-1]``, as the gem does) and apply locally at once (read-your-writes). Every process applies every
operation in the bus's id order, its own included, so all copies converge on the same value even when two
processes write one key at the same moment (the gem applies by arrival order and can diverge).

Unlike the gem, a process that starts late sees the current values: it replays the channel's backlog. Whether
that replay is the whole history is the bus's answer, not a guess from ids: the backlog read from the start
reports a gap when older operations were trimmed (on every engine: contiguous ids, or the sparse ids of the
PostgreSQL bridge, where the first id is never 1). To keep the replay short and within the backlog limit, every
``snapshot_every``-th operation (counted in bus order, the same in every process) is followed by a snapshot of the
whole cache, published by the process that wrote that operation once its listener has applied it (so the snapshot
holds exactly the operations up to that id); a late starter begins at the newest snapshot that covers what it
missed and applies the operations after it. Until then it keeps at most ``history`` operations in memory. A
process whose history starts mid-way logs a warning until a snapshot completes it.
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
HIDDEN = [-1]  # user id no HTTP client has: the gem's way of keeping internal traffic off the wire
_FOREVER = 10 * 365 * 86400.0  # the cache's history must not expire like an idle channel's
_DELETED: Any = object()


def _prev(msg: Message) -> int:
    """The ``prev`` an operation carries (0: none, or written by a process that had applied none)."""
    op = msg.data
    prev = op.get("prev") if isinstance(op, dict) else None
    return prev if isinstance(prev, int) and not isinstance(prev, bool) else 0


class DistributedCache(MutableMapping[str, Any]):
    """A dict-like cache, shared by every process attached to ``bus`` (default: the module's default bus).

    Keys are strings; values must be encodable by the bus codec (JSON by default: str, numbers, bools, None,
    lists and dicts with string keys). ``app_version`` scopes the cache: operations from processes running
    another version are ignored. With ``namespace=True`` each site (``bus.site_id_lookup()``) has its own data.
    ``snapshot_every`` and ``history`` (operations retained, default 20 snapshots' worth) bound what a late
    starter replays.
    """

    def __init__(
        self,
        name: str,
        app_version: str | None = None,
        bus: Bus | None = None,
        *,
        namespace: bool = True,
        snapshot_every: int = 200,
        history: int | None = None,
    ) -> None:
        if bus is None:
            from .default import default_bus

            bus = default_bus()
        if not isinstance(name, str) or not name:
            raise ValueError("cache name must be a non-empty string")
        self.name = name
        self.key = name
        self.app_version = app_version
        self.bus = bus
        self.namespace = namespace
        self.snapshot_every = max(int(snapshot_every), 10)
        #: operations kept in the bus for late starters (must span a few snapshots)
        self.history = max(int(history), 2 * self.snapshot_every) if history else 20 * self.snapshot_every
        self.identity = f"{secrets.token_hex(8)}:{os.getpid()}"
        self.channel = CHANNEL_PREFIX + name
        self._data: dict[str, dict[str, Any]] = {}
        self._lock = threading.RLock()
        self._recent: list[Message] = []  # operations applied while incomplete (re-applied on top of a snapshot)
        self._mine: dict[tuple[str, str], tuple[int, Any]] = {}
        self._mine_clear: dict[str, int] = {}
        self._applied_id = 0
        self._since_snapshot = 0  # operations since the last due snapshot, in bus order
        # The replay: the channel's backlog from its start says whether it is the whole history: the bus reports a
        # gap when older operations were trimmed, and so does an operation whose writer had applied one the backlog
        # no longer holds (``prev``: ids that are not contiguous, as the PostgreSQL bridge's, carry no other sign).
        # A snapshot as of at least the id before the oldest one held then completes it.
        with self._lock:
            backlog = bus.backlog(self.channel, 0, site_id="")
            oldest = backlog[0].message_id if backlog else backlog.first_available
            self._complete = not backlog.gap and not any(0 < _prev(m) < oldest for m in backlog)
            self._need_as_of = oldest - 1
            for msg in backlog:
                self._on_message(msg)
            self._sub = bus.subscribe(self.channel, self._on_message, last_id=self._applied_id, site_id="")
        if not self._complete:
            log.warning(
                "shmbus: DistributedCache %r started from an incomplete history (the bus no longer holds "
                "its older operations); values written before then are missing until a snapshot arrives",
                name,
            )

    # ------------------------------------------------------------------ local view
    # ``_data`` holds only what the listener applied, in bus order. This process's own writes that the
    # listener has not applied yet live in ``_mine`` (per key) and ``_mine_clear`` (per site) so reads see them
    # at once (read-your-writes) without making ``_data`` differ from every other process's copy.
    def _site(self) -> str:
        if not self.namespace:
            return "default"
        lookup = self.bus.site_id_lookup
        return (lookup() if lookup else None) or "default"

    def _view(self, site: str) -> dict[str, Any]:
        with self._lock:
            clear_mid = self._mine_clear.get(site, 0)
            view = {} if clear_mid else dict(self._data.get(site, {}))
            for (s, key), (mid, value) in self._mine.items():
                if s == site and mid > clear_mid:
                    if value is _DELETED:
                        view.pop(key, None)
                    else:
                        view[key] = value
            return view

    def hash(self, site_id: str | None = None) -> dict[str, Any]:
        """A copy of the data of ``site_id`` (default: the current site), as the gem's ``hash``."""
        return self._view(site_id or self._site())

    def __getitem__(self, key: str) -> Any:
        key = self._check_key(key)
        site = self._site()
        with self._lock:
            if not self._mine and not self._mine_clear:
                return self._data.get(site, {})[key]
        return self._view(site)[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._view(self._site()))

    def __len__(self) -> int:
        return len(self._view(self._site()))

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key in self._view(self._site())

    @staticmethod
    def _check_key(key: Any) -> str:
        if not isinstance(key, str):
            raise TypeError(f"DistributedCache keys must be str, got {type(key).__name__}")
        return key

    # ------------------------------------------------------------------ writes
    def __setitem__(self, key: str, value: Any) -> None:
        key = self._check_key(key)
        site = self._site()
        mid = self._publish({"op": "set", "key": key, "value": value, "site": site})  # raises: nothing changes
        self._remember(site, key, mid, value)

    def __delitem__(self, key: str) -> None:
        key = self._check_key(key)
        if key not in self:
            raise KeyError(key)
        self.delete(key)

    def delete(self, key: str, publish: bool = True) -> None:
        """Delete ``key`` everywhere (or only here with ``publish=False``); a missing key is not an error."""
        key = self._check_key(key)
        site = self._site()
        if publish:
            self._remember(site, key, self._publish({"op": "delete", "key": key, "site": site}), _DELETED)
        else:
            with self._lock:
                self._data.get(site, {}).pop(key, None)
                self._mine.pop((site, key), None)

    def clear(self) -> None:
        site = self._site()
        mid = self._publish({"op": "clear", "site": site})
        with self._lock:
            if mid > self._applied_id:
                self._mine_clear[site] = mid

    def _remember(self, site: str, key: str, mid: int, value: Any) -> None:
        with self._lock:
            if mid > self._applied_id:  # not applied by the listener yet
                self._mine[(site, key)] = (mid, value)

    def _publish(self, op: dict[str, Any]) -> int:
        op["origin"] = self.identity
        op["prev"] = self._applied_id  # the newest operation this process had applied: a late starter's evidence
        if self.app_version is not None:
            op["v"] = self.app_version
        mid = self.bus.publish(
            self.channel, op, user_ids=HIDDEN, site_id="", max_backlog_size=self.history, max_backlog_age=_FOREVER
        )
        return mid or 0

    def _publish_snapshot(self, as_of: int) -> None:
        """Publish ``_data`` as of operation ``as_of`` (called on the listener right after applying it)."""
        snap: dict[str, Any] = {
            "op": "snapshot",
            "as_of": as_of,
            "prev": as_of,
            "origin": self.identity,
            "data": {site: dict(d) for site, d in self._data.items()},
        }
        if self.app_version is not None:
            snap["v"] = self.app_version
        try:
            self.bus.publish(
                self.channel, snap, user_ids=HIDDEN, site_id="", max_backlog_size=self.history, max_backlog_age=_FOREVER
            )
        except Exception:
            log.exception("shmbus: DistributedCache %r could not publish a snapshot", self.name)

    # ------------------------------------------------------------------ applying operations (listener thread)
    def _on_message(self, msg: Message) -> None:
        op = msg.data
        if not isinstance(op, dict):
            return
        if self.app_version is not None and op.get("v") != self.app_version:
            return
        snapshot_due = False
        with self._lock:
            if op.get("op") == "snapshot":
                self._take_snapshot(op)
            else:
                self._check_predecessor(msg)
                self._apply(op)
                if not self._complete:
                    self._recent.append(msg)
                    if len(self._recent) > self.history:  # bounded: a snapshot must now cover the dropped one
                        self._need_as_of = max(self._need_as_of, self._recent.pop(0).message_id)
                self._since_snapshot += 1
                if self._since_snapshot >= self.snapshot_every:
                    self._since_snapshot = 0
                    snapshot_due = op.get("origin") == self.identity
            self._applied_id = msg.message_id
            if self._mine:
                self._mine = {k: v for k, v in self._mine.items() if v[0] > msg.message_id}
            if self._mine_clear:
                self._mine_clear = {k: v for k, v in self._mine_clear.items() if v > msg.message_id}
            if snapshot_due and self._complete:
                self._publish_snapshot(msg.message_id)

    def _check_predecessor(self, msg: Message) -> None:
        """An operation whose writer had applied one this process never received (``prev``, an earlier id of this
        history, beyond the newest it applied): what it read was not the whole history after all. A process that
        started while its host's relay had not yet stored the backend's history found an empty backlog, and the
        relay then stored only what the backend still held (issue 36: the late starter never got a key set before
        3,000 others). A snapshot as of that operation at least completes it."""
        prev = _prev(msg)
        if self._complete and self._applied_id < prev < msg.message_id:
            self._complete = False
            self._need_as_of = max(self._need_as_of, prev)
            log.warning(
                "shmbus: DistributedCache %r missed operations before id %d (the bus no longer holds them); values "
                "written before then are missing until a snapshot arrives",
                self.name,
                msg.message_id,
            )

    def _take_snapshot(self, op: dict[str, Any]) -> None:
        """Only a process missing the start of the history needs a snapshot, and only one that covers everything it
        missed (as of an operation at or after the newest one it could not read)."""
        as_of = int(op.get("as_of", 0))
        data = op.get("data")
        if self._complete or not isinstance(data, dict) or as_of < self._need_as_of:
            return
        self._data = {str(s): dict(d) for s, d in data.items() if isinstance(d, dict)}
        for m in self._recent:
            if m.message_id > as_of:
                self._apply(m.data)
        self._recent = []
        self._complete = True
        log.info("shmbus: DistributedCache %r is complete from a snapshot as of operation %d", self.name, as_of)

    def _apply(self, op: dict[str, Any]) -> None:
        site = op.get("site") or "default"
        kind = op.get("op")
        if kind == "set":
            self._data.setdefault(site, {})[op["key"]] = op.get("value")
        elif kind == "delete":
            self._data.get(site, {}).pop(str(op.get("key")), None)
        elif kind == "clear":
            self._data.pop(site, None)

    def close(self) -> None:
        """Stop following the bus (the local copy stays readable)."""
        if self._sub is not None:
            self.bus.unsubscribe(self.channel, self._sub)
            self._sub = None

    def __repr__(self) -> str:
        return f"DistributedCache({self.name!r}, {len(self)} keys)"
