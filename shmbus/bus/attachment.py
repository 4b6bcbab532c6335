"""The bus's hold on its segment: attached lazily on first use, closed, destroyed, re-armed after fork."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from ..errors import BusClosed, BusDestroyed
from ..perprocess import Birth
from ..segment import Segment

__all__ = ["Attachment"]


class Attachment:
    """Opens the named segment on first use (so a bus can be built in a pre-forking master) and knows whether it
    may be used: ``closed`` (this process detached; :class:`BusClosed`) and ``destroyed`` (:class:`BusDestroyed`)
    until ``reopen()``. ``on_attach(segment)`` runs once per attach (a bridged segment adopts its engine there)."""

    def __init__(
        self,
        name: str,
        ring_size: int,
        max_channels: int,
        codec_name: str,
        path: str | None,
        create: bool,
        mode: int,
        lock_timeout: float,
    ) -> None:
        self.name = name
        self.ring_size = ring_size
        self.max_channels = max_channels
        self.codec_name = codec_name
        self.path = path
        self.create = create
        self.mode = mode
        self.lock_timeout = lock_timeout
        self.closed = False
        self.destroyed = False
        #: the attached segment, None before the first use and after ``detach()``
        self.current: Segment | None = None
        self.on_attach: list[Callable[[Segment], None]] = []
        self._birth = Birth()
        self._lock = threading.RLock()

    @property
    def segment(self) -> Segment:
        """The attached segment (attaching on first use)."""
        seg = self.current
        return seg if seg is not None else self.attach()

    def check_usable(self) -> None:
        if self.destroyed:
            raise BusDestroyed(f"bus {self.name!r} was destroyed; call on() to use it again")
        if self.closed:
            raise BusClosed(f"bus {self.name!r} was closed in this process; call on() to attach again")

    def attach(self) -> Segment:
        with self._lock:
            self.check_usable()
            if self.current is None:
                seg = Segment.open(
                    self.name,
                    ring_size=self.ring_size,
                    max_channels=self.max_channels,
                    codec_name=self.codec_name,
                    path=self.path,
                    create=self.create,
                    mode=self.mode,
                    lock_timeout=self.lock_timeout,
                )
                if seg.codec_name and seg.codec_name != self.codec_name:
                    seg.close()
                    raise ValueError(
                        f"bus {self.name!r} was created with codec {seg.codec_name!r}, "
                        f"this process uses {self.codec_name!r}; every process must use the same"
                    )
                self.current = seg
                self._birth.renew()
                for hook in self.on_attach:
                    hook(seg)
            return self.current

    def here(self) -> Segment | None:
        """The segment when this process attached it (a forked child's inherited one is not its own until
        :meth:`after_fork`)."""
        seg = self.current
        return seg if seg is not None and self._birth.here else None

    def detach(self) -> None:
        """Unmap the segment in this process (other processes keep it); ``closed`` stays as the caller set it."""
        with self._lock:
            seg, self.current = self.current, None
        if seg is not None and self._birth.here:
            seg.close()

    def destroy(self) -> None:
        """Remove the segment itself, for every process (after :meth:`detach`); ``destroyed`` until reopened."""
        self.destroyed = True
        if self.path is None:
            Segment.destroy_by_name(self.name)
        else:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass

    def reopen(self) -> None:
        """Undo ``closed`` and ``destroyed``: the next use attaches again (creating the bus if allowed)."""
        self.closed = self.destroyed = False

    def after_fork(self) -> None:
        """In a forked child: a fresh lock, and a process-table slot of the child's own."""
        self._lock = threading.RLock()
        if self.current is not None:
            self.current.reregister_after_fork()
            self._birth.renew()
