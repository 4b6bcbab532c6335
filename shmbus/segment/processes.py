"""Waiting for new records (the futex) and the process table (who is attached, who sleeps)."""

from __future__ import annotations

import math
import mmap
import os
import struct
import time

import posix_ipc

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
    _Q_FLAGS,
    _Q_HEAD,
    _Q_TAIL,
    ALIGN,
    DEFAULT_LOCK_TIMEOUT,
    FLAG_METRICS,
    MAX_PROCS,
    METRIC_FIELDS,
    METRIC_SLOT,
    METRICS_GEN_WORD,
    METRICS_HEADER,
    METRICS_SIZE,
    RETIRED_FIELDS,
    _pid_alive,
)
from .locking import Locking

_M = {name: i for i, name in enumerate(METRIC_FIELDS)}
_M_PID = _M["pid"]
_SEQLOCK_TRIES = 200  # lock-free attempts of a metrics read before it takes the lock (a claimer stopped mid-claim)


def _f64_bits(x: float) -> int:
    return int(struct.unpack("<Q", struct.pack("<d", x))[0])


def _bits_f64(x: int) -> float:
    value = float(struct.unpack("<d", struct.pack("<Q", x))[0])
    return value if math.isfinite(value) else 0.0  # a damaged slot must not put NaN into JSON or Prometheus


class Processes(Locking):
    """Part of :class:`~shmbus.segment.Segment`: sleeping on the futex word, this process's entry in the process
    table and its metrics slot (the counters the append bumps under the lock are this part's words)."""

    def __init__(
        self,
        name: str,
        fd: int,
        mm: mmap.mmap,
        path: str,
        owner_shm: posix_ipc.SharedMemory | None,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    ) -> None:
        super().__init__(name, fd, mm, path, owner_shm, lock_timeout)
        self._proc_index = -1
        end = self.ring_off + self.ring_size
        #: byte offset of the metrics area (:data:`~.layout.FLAG_METRICS`), -1 in a segment without one
        self.metrics_off = end if self._u64[_Q_FLAGS] & FLAG_METRICS and len(mm) >= end + METRICS_SIZE else -1
        self._metrics_base = -1  # word index of this process's metrics slot
        self._pub_word = 0  # word indexes of this process's publish / relay counters (0: not counting)
        self._relay_word = 0
        #: (futex word, pid) this process is counted among the sleepers for (see :meth:`wait`). Added as a 30th
        #: attribute, it made every publish run 1% more instructions on CPython 3.11 (perf/ab_lock.py: the append's
        #: attribute loads), so the file descriptor and the shm object share one attribute, _handles.
        self._counted_for: tuple[int, int] | None = None

    # ------------------------------------------------------------------ waiting
    def wait(self, seen_word: int, timeout: float) -> None:
        """Sleep until a publish after the caller read ``seen_word`` (or ``timeout`` seconds pass).

        The sleeper count says whom the writers must wake, and the writers take sleepers off it: a sleeper adds
        itself under the lock, only while the futex word is still ``seen_word`` (else a publish came since: there
        is something to read), and the next publish (which bumps the word under the lock) that finds the count
        non-zero wakes every sleeper, then zeroes it, both before it unlocks. So a woken sleeper takes no lock to
        leave; publishes call the kernel once per round of sleeps, not each one until every sleeper has taken itself
        off; a sleeper whose wait timed out stays counted while the word is the same, and waits again without the
        lock. A count too high (a sleeper that died; a reset or repair, which bump the word without zeroing it)
        costs the next publish one needless wake-up call. It is never too low: it is zeroed only by a publish that
        has woken every sleeper, and one stopped before that (killed, or an exception) leaves it for the next.
        """
        counted = (seen_word, os.getpid())
        if self._counted_for != counted:
            try:
                self._lock()
                if self._u32[_I_FUTEX] != seen_word:
                    return
                self._u32[_I_SLEEPERS] += 1
                # stays set while attached: a recount never goes below the sleepers
                self._set_proc_sleeping(1, counted[1])
                self._counted_for = counted
            finally:
                self._unlock()
        _native.futex_wait(self._futex_addr, seen_word, timeout)

    def wake_all(self) -> None:
        """Bump the futex word and wake every sleeper (used by reset and shutdown)."""
        try:
            self._lock()
            self._u32[_I_FUTEX] = (self._u32[_I_FUTEX] + 1) & 0xFFFFFFFF
        finally:
            self._unlock()
        _native.futex_wake(self._futex_addr)

    # ------------------------------------------------------------------ process table
    def _register_process(self) -> None:
        pid = os.getpid()
        try:
            self._lock()
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
                    self._claim_metrics_slot(i, pid)
                    break
            else:  # the process table is full: no slot of our own
                self._count_without_slot()
        finally:
            self._unlock()

    def _claim_metrics_slot(self, index: int, pid: int) -> None:
        """Make metrics slot ``index`` this process's (under the lock): the previous owner's counters move to the
        retired totals first, so host totals survive restarts and a slot is never counted twice."""
        self._pub_word = self._relay_word = 0
        self._metrics_base = -1
        if self.metrics_off < 0:
            return
        u64 = self._u64
        area = self.metrics_off >> 3
        base = (self.metrics_off + METRICS_HEADER + index * METRIC_SLOT) >> 3
        gen = area + METRICS_GEN_WORD
        u64[gen] |= 1  # odd: a claim is under way (already odd: a claimer died mid-claim; it stays odd till done)
        if u64[base + _M_PID]:
            for i, name in enumerate(RETIRED_FIELDS):
                u64[area + i] += u64[base + _M[name]]
        for i in range(METRIC_SLOT >> 3):
            u64[base + i] = 0
        u64[base + _M["started"]] = _f64_bits(time.time())
        u64[base + _M_PID] = pid
        u64[gen] = (u64[gen] + 1) & 0xFFFFFFFFFFFFFFFF  # even: done
        self._metrics_base = base
        self._pub_word = base + _M["publishes"]
        self._relay_word = base + _M["relayed"]

    def _count_without_slot(self) -> None:
        """A process beyond the process table (no slot): its publishes and relayed stores still count in the host
        totals, straight into the retired totals (under the lock, like every count); not per process, and its
        flushed figures (deliveries, losses, gauges) are not kept."""
        self._metrics_base = -1
        self._pub_word = self._relay_word = 0
        if self.metrics_off >= 0:
            area = self.metrics_off >> 3
            self._pub_word = area + RETIRED_FIELDS.index("publishes")
            self._relay_word = area + RETIRED_FIELDS.index("relayed")

    def write_metrics(self, values: dict[str, int | float]) -> bool:
        """Store figures in this process's metrics slot (one aligned store each; no lock: only we write it).
        Floats are stored as their bits (``started``, ``updated``). False when this process has no slot."""
        base = self._metrics_base
        if base < 0 or self._closed:
            return False
        u64 = self._u64
        if u64[base + _M_PID] != os.getpid():
            return False
        for name, value in values.items():
            u64[base + _M[name]] = _f64_bits(value) if isinstance(value, float) else max(int(value), 0)
        return True

    def count_published(self, n: int = 1) -> None:
        """Count publishes that did not append here themselves (through an engine, or ``engine=False``). Under
        the lock, like the append's own count of the same word."""
        if self._pub_word and not self._closed:
            try:
                self._lock()
                self._u64[self._pub_word] += n
            finally:
                self._unlock()

    def store_metric(self, name: str, value: int) -> None:
        """One field of this process's slot (the listener's position, after each batch)."""
        base = self._metrics_base
        if base >= 0 and not self._closed:
            self._u64[base + _M[name]] = value

    def read_metrics(self) -> tuple[dict[str, int], list[dict[str, float]]] | None:
        """The metrics area as it is now: ``(retired totals, [slot fields for each used slot])``; None when the
        segment has no area. Each row also says whether the slot's process-table entry still names its pid
        (``attached``: 0 once that process detached it, or died and was reaped).

        Lock-free: each field is one aligned load, so a value is never torn (fields of a slot may be from
        consecutive flushes); a slot claim (which moves counters from a slot to the retired totals) is never seen
        half done: the read is retried around it (the generation word, ``METRICS_GEN_WORD``), so host totals
        never go down. After many tries (a claimer stopped under the lock) it reads under the lock."""
        if self.metrics_off < 0:
            return None
        gen = (self.metrics_off >> 3) + METRICS_GEN_WORD
        u64 = self._u64
        for _ in range(_SEQLOCK_TRIES):
            before = u64[gen]
            if before & 1:
                time.sleep(0)  # a claim is under way (it holds the lock for a few microseconds)
                continue
            area = self._read_metrics_area()
            if u64[gen] == before:
                return area
        try:
            self._lock()
            if u64[gen] & 1:  # a claimer died mid-claim (the lock's repair ran): what it left is all there is
                u64[gen] = (u64[gen] + 1) & 0xFFFFFFFFFFFFFFFF
            return self._read_metrics_area()
        finally:
            self._unlock()

    def _read_metrics_area(self) -> tuple[dict[str, int], list[dict[str, float]]]:
        u64 = self._u64
        area = self.metrics_off >> 3
        retired = {name: int(u64[area + i]) for i, name in enumerate(RETIRED_FIELDS)}
        slots: list[dict[str, float]] = []
        width = len(METRIC_FIELDS)
        for index in range(MAX_PROCS):
            base = (self.metrics_off + METRICS_HEADER + index * METRIC_SLOT) >> 3
            if not u64[base + _M_PID]:
                continue
            row: dict[str, float] = {name: int(u64[base + i]) for i, name in enumerate(METRIC_FIELDS[:width])}
            row["started"] = _bits_f64(int(row["started"]))
            row["updated"] = _bits_f64(int(row["updated"]))
            # is the slot's process still attached through it? (its process-table entry, same index, names it;
            # a Bus closed in a process that goes on leaves a slot with its pid that is not)
            row["attached"] = int(self._u32[(_OFF_PROCS + index * _PROC_SIZE) >> 2] == row["pid"])
            slots.append(row)
        return retired, slots

    def reregister_after_fork(self) -> None:
        """In a forked child: take a process-table slot of our own (the parent keeps its own)."""
        self._proc_index = -1
        self._register_process()

    def _unregister_process(self) -> None:
        if self._proc_index < 0:
            return
        try:
            self._lock()
            off = _OFF_PROCS + self._proc_index * _PROC_SIZE
            if self._u32[off >> 2] == os.getpid():
                self._u32[(off + 4) >> 2] = 0
                self._u32[off >> 2] = 0
            self._proc_index = -1
            self._pub_word = self._relay_word = 0  # the slot keeps its figures (retired when it is reused)
            self._metrics_base = -1
        finally:
            self._unlock()

    def _set_proc_sleeping(self, flag: int, pid: int) -> None:
        if self._proc_index >= 0:
            off = _OFF_PROCS + self._proc_index * _PROC_SIZE
            if self._u32[off >> 2] == pid:
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
