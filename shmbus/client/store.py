"""Where a client keeps its positions between runs: a :class:`PositionStore`, and the saver that writes to it.

A store is read once, when the client is made (its channels start where they were), and written at most once per
``save_interval`` while positions move, and once more on ``stop()``. Writes happen on a worker thread (a store may
do I/O: a file, Redis), so the event loop is never blocked by one; a write that raises is logged, counted in
``stats.store_errors`` and tried again at the next interval.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol, runtime_checkable

import anyio
import anyio.to_thread

from .outcomes import ClientStats

__all__ = ["FilePositionStore", "PositionSaver", "PositionStore", "check_positions"]

log = logging.getLogger("shmbus.client")


@runtime_checkable
class PositionStore(Protocol):
    """``load()``: the saved ``{channel: id}`` (empty when nothing was saved); ``save(positions)``: replace them.
    ``save`` runs on a worker thread, one call at a time."""

    def load(self) -> Mapping[str, int]: ...

    def save(self, positions: Mapping[str, int]) -> None: ...


def check_positions(positions: Mapping[str, int], where: str) -> dict[str, int]:
    """``positions`` as a plain dict, or ValueError: a store that hands back garbage must not start a channel at
    a wrong place (a silent loss or a replay)."""
    if not isinstance(positions, Mapping):
        raise ValueError(f"{where}: positions must be a mapping of channel to id, got {positions!r}")
    for channel, mid in positions.items():
        if not isinstance(channel, str) or isinstance(mid, bool) or not isinstance(mid, int):
            raise ValueError(f"{where}: not a channel and an id: {channel!r}: {mid!r}")
    return dict(positions)


class FilePositionStore:
    """Positions in a JSON file. A save writes a temporary file beside it, flushes it to disk and renames it over
    the old one, so a crash leaves the old positions or the new ones, never half a file."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def load(self) -> dict[str, int]:
        """The saved positions; ``{}`` if the file does not exist; ValueError if it holds something else."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"{self.path}: not JSON positions ({exc})") from None
        return check_positions(data, str(self.path))

    def save(self, positions: Mapping[str, int]) -> None:
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent or ".")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(dict(positions), f, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def __repr__(self) -> str:
        return f"FilePositionStore({str(self.path)!r})"


class PositionSaver:
    """Saves ``current()`` to ``store`` when it changed: every ``interval`` seconds (:meth:`run`, a task of the
    client), and on stop (:meth:`save` from the loop, or :meth:`save_now` from the sync client's caller, after its
    loop has ended). Channels no longer subscribed keep their last saved position, so a channel left for a while
    resumes where it was. Writes are serialized, and one older than the last written is skipped: a write whose task
    was cancelled (its thread goes on) never lands over a newer one."""

    def __init__(
        self,
        store: PositionStore,
        interval: float,
        current: Callable[[], Mapping[str, int]],
        stats: ClientStats,
        loaded: Mapping[str, int],
    ) -> None:
        self.store = store
        self.interval = interval
        self._current = current
        self._stats = stats
        self._saved = dict(loaded)
        self._lock = threading.Lock()
        self._made = 0  # the number of the last set of positions made
        self._written = 0  # the number of the last one written

    async def run(self) -> None:
        while True:
            await anyio.sleep(self.interval)
            await self.save()

    async def save(self) -> None:
        """Save if a position moved (only known ones: a channel still "from now" has none), on a worker thread."""
        change = self._change()
        if change is not None:
            written = await anyio.to_thread.run_sync(self._write, *change, abandon_on_cancel=True)
            self._done(change[1], written)

    def save_now(self) -> None:
        """:meth:`save` in the calling thread (the sync client's stop, once its loop has ended)."""
        change = self._change()
        if change is not None:
            self._done(change[1], self._write(*change))

    def _change(self) -> tuple[int, dict[str, int]] | None:
        merged = {**self._saved, **{c: i for c, i in self._current().items() if i >= 0}}
        if merged == self._saved:
            return None
        self._made += 1
        return self._made, merged

    def _write(self, number: int, positions: dict[str, int]) -> bool:
        with self._lock:
            if number <= self._written:
                return False  # a newer set is there already (and becomes _saved where it was written)
            try:
                self.store.save(positions)
            except Exception:
                self._stats.store_errors += 1
                log.exception("shmbus.client: saving positions to %r failed (again in %g s)", self.store, self.interval)
                return False
            self._written = number
            return True

    def _done(self, positions: dict[str, int], ok: bool) -> None:
        if ok:
            self._saved = positions
