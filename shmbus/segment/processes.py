"""Waiting for new records (the futex) and the process table (who is attached, who sleeps)."""

from __future__ import annotations

import os
import struct
import time

from .. import _native
from ..errors import (
    SegmentCorrupt,
)
from .layout import (
    _I_CHANNELS,
    _I_FUTEX,
    _I_SLEEPERS,
    _OFF_PROCS,
    _PROC_SIZE,
    _Q_HEAD,
    _Q_TAIL,
    ALIGN,
    MAX_PROCS,
    _pid_alive,
)
from .state import SegmentState


class Processes(SegmentState):
    # ------------------------------------------------------------------ waiting
    def wait(self, seen_word: int, timeout: float) -> None:
        """Sleep until a publish after the caller read ``seen_word`` (or ``timeout`` seconds pass)."""
        self._lock()
        try:
            self._u32[_I_SLEEPERS] += 1
            self._set_proc_sleeping(1)
        finally:
            self._unlock()
        try:
            _native.futex_wait(self._futex_addr, seen_word, timeout)
        finally:
            self._lock()
            try:
                self._u32[_I_SLEEPERS] = max(self._u32[_I_SLEEPERS] - 1, 0)
                self._set_proc_sleeping(0)
            finally:
                self._unlock()

    def wake_all(self) -> None:
        """Bump the futex word and wake every sleeper (used by reset and shutdown)."""
        self._lock()
        try:
            self._u32[_I_FUTEX] = (self._u32[_I_FUTEX] + 1) & 0xFFFFFFFF
        finally:
            self._unlock()
        _native.futex_wake(self._futex_addr)

    # ------------------------------------------------------------------ process table
    def _register_process(self) -> None:
        pid = os.getpid()
        self._lock()
        try:
            u64 = self._u64
            head, tail = u64[_Q_HEAD], u64[_Q_TAIL]
            if tail > head or head - tail > self.ring_size or head % ALIGN or tail % ALIGN:
                raise SegmentCorrupt(f"{self.path}: commit state head={head} tail={tail} is impossible")
            if self._u32[_I_CHANNELS] > self.max_channels:
                raise SegmentCorrupt(
                    f"{self.path}: {self._u32[_I_CHANNELS]} channels in a table of {self.max_channels}"
                )
            self._reap_dead_processes()
            for i in range(MAX_PROCS):
                off = _OFF_PROCS + i * _PROC_SIZE
                if self._u32[off >> 2] == 0:
                    self._buf[off + 8 : off + 16] = struct.pack("<d", time.time())
                    self._u32[(off + 4) >> 2] = 0
                    self._u32[off >> 2] = pid
                    self._proc_index = i
                    break
        finally:
            self._unlock()

    def reregister_after_fork(self) -> None:
        """In a forked child: take a process-table slot of our own (the parent keeps its own)."""
        self._proc_index = -1
        self._register_process()

    def _unregister_process(self) -> None:
        if self._proc_index < 0:
            return
        self._lock()
        try:
            off = _OFF_PROCS + self._proc_index * _PROC_SIZE
            if self._u32[off >> 2] == os.getpid():
                self._u32[(off + 4) >> 2] = 0
                self._u32[off >> 2] = 0
            self._proc_index = -1
        finally:
            self._unlock()

    def _set_proc_sleeping(self, flag: int) -> None:
        if self._proc_index >= 0:
            off = _OFF_PROCS + self._proc_index * _PROC_SIZE
            if self._u32[off >> 2] == os.getpid():
                self._u32[(off + 4) >> 2] = flag

    def _reap_dead_processes(self) -> None:
        """Forget processes that died without detaching and recount sleepers (a dead sleeper left it high)."""
        sleepers = 0
        free = 0
        u32 = self._u32
        for i in range(MAX_PROCS):
            slot_index = (_OFF_PROCS + i * _PROC_SIZE) >> 2
            pid, sleeping = u32[slot_index], u32[slot_index + 1]
            if pid == 0:
                free += 1
                continue
            if not _pid_alive(pid):
                u32[slot_index + 1] = 0
                u32[slot_index] = 0
                free += 1
            elif sleeping:
                sleepers += 1
        # With the table full, some processes may have no slot (their sleep is counted but not flagged): only
        # recount when every process could have registered, or a wake-up could be skipped.
        if u32[_I_SLEEPERS] > sleepers and free > 0:
            u32[_I_SLEEPERS] = sleepers

    def processes(self) -> list[int]:
        pids = []
        for i in range(MAX_PROCS):
            pid = self._u32[(_OFF_PROCS + i * _PROC_SIZE) >> 2]
            if pid and _pid_alive(pid):
                pids.append(pid)
        return pids
