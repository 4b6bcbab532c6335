"""The two kernel primitives the segment needs, reached through ctypes (no compiled extension).

* A robust, process-shared pthread mutex stored *inside* the segment: when a holder dies (SIGKILL included) the
  next locker gets ``EOWNERDEAD`` and can repair the log before marking the mutex consistent. POSIX semaphores and
  ``multiprocessing.Lock`` stay taken forever in that case, and ``flock`` is released silently, so neither is used.
* A futex word inside the segment: one ``FUTEX_WAKE`` wakes every sleeping process, and nobody spins.

Measured costs and the reasoning are in ``docs/architecture.md``. Linux + glibc on x86-64 only (robust mutexes do
not exist on macOS, the struct sizes below are glibc's, and the lock-free readers rely on x86-64's store order).
Elsewhere this module still imports, so ``import shmbus`` and the HTTP client work, and a :class:`~shmbus.Bus`
raises :class:`~shmbus.errors.UnsupportedPlatform` (:func:`platform_problem` says why and what to use instead).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import platform
import sys
import threading
import time
from typing import Any

from .errors import BusLockTimeout, UnsupportedPlatform

__all__ = [
    "MUTEX_SIZE",
    "RobustMutex",
    "futex_wait",
    "futex_wake",
    "mutex_holder_pid",
    "mutex_held",
    "mutex_lock",
    "mutex_settle",
    "mutex_unlock",
    "platform_problem",
    "require_supported",
    "supported",
]


def _load_libc(kind: type[ctypes.CDLL]) -> ctypes.CDLL | None:
    for name in (ctypes.util.find_library("c"), "libc.so.6"):
        if name:
            try:
                return kind(name, use_errno=True)
            except OSError:
                continue
    return None


_libc = _load_libc(ctypes.CDLL)
#: The same library, called with the GIL held: for the calls that never block (trylock, unlock, a futex wake). A
#: CDLL call releases the GIL and takes it back on return, and a trylock that took the bus's lock would then wait
#: for the GIL (up to the switch interval, 5 ms, if another thread of the process runs Python meanwhile) while every
#: other writer of the bus waits for the lock; the release and retake also cost a fifth of such a call.
_libc_held = _load_libc(ctypes.PyDLL)

# glibc: sizeof(pthread_mutex_t) is 40 on x86_64; 64 bytes are reserved.
MUTEX_SIZE = 64
_MUTEXATTR_SIZE = 8
_PTHREAD_PROCESS_SHARED = 1
_PTHREAD_MUTEX_ROBUST = 1

_SYS_FUTEX = {"x86_64": 202, "aarch64": 98, "arm64": 98}.get(platform.machine())
_GLIBC_ONLY = ("pthread_mutex_consistent", "pthread_mutex_timedlock", "pthread_mutexattr_setrobust")
_FUTEX_WAIT = 0
_FUTEX_WAKE = 1
_INT_MAX = 0x7FFFFFFF
# glibc's robust mutex: the lock word (offset 0) holds the owner's thread id under these bits, and the owner field
# (offset 8) reads PTHREAD_MUTEX_INCONSISTENT between an EOWNERDEAD lock and pthread_mutex_consistent.
_FUTEX_TID_MASK = 0x3FFFFFFF
_OWNER_INCONSISTENT = 0x7FFFFFFF


def platform_problem() -> str | None:
    """Why this platform cannot hold a bus, with what to use instead; None where it can.

    Linux with glibc (robust mutexes, ``pthread_mutex_timedlock``, futexes) on x86-64: the lock-free readers rely
    on x86-64's total store order (see :mod:`shmbus.segment`); weaker memory models (aarch64, POWER) would need
    explicit barriers that pure Python cannot issue, so they are refused rather than silently trusted.
    """
    machine = platform.machine() or "an unknown CPU"
    if not sys.platform.startswith("linux"):
        why = f"this is {sys.platform} on {machine}, which has no robust process-shared mutex or futex"
    elif machine not in ("x86_64", "AMD64"):
        why = f"this is Linux on {machine}, whose weaker memory ordering the lock-free readers do not handle yet"
    elif _SYS_FUTEX is None or not all(hasattr(_libc, f) for f in _GLIBC_ONLY):
        why = "this Linux's C library is not glibc (robust mutexes and pthread_mutex_timedlock are missing)"
    else:
        return None
    return (
        f"shmbus's shared-memory bus runs on Linux x86-64 with glibc only; {why}. Here, the HTTP client works "
        "(shmbus.client, shmbus listen: pip install 'shmbus[client]'); for the bus itself, develop in a Linux "
        "x86-64 container or VM (e.g. docker run --platform linux/amd64 python:3.12). "
        "The port is planned in docs/architecture.md (Platforms)"
    )


def supported() -> bool:
    """Whether this platform has what the segment needs (:func:`platform_problem` says why not)."""
    return platform_problem() is None


def require_supported() -> None:
    """Raise :class:`~shmbus.errors.UnsupportedPlatform` (why, and what to use instead) where a bus cannot run."""
    problem = platform_problem()
    if problem is not None:
        raise UnsupportedPlatform(problem)


def _symbol(name: str, *, gil_held: bool = False) -> Any:
    """A libc function (``gil_held``: called without releasing the GIL, for one that never blocks); where libc lacks
    it, a stand-in that raises :class:`UnsupportedPlatform` (never reached by a bus, which checks first: it keeps
    ``import shmbus`` working on every platform)."""
    fn = getattr(_libc_held if gil_held else _libc, name, None)
    if fn is not None:
        return fn

    def missing(*_: Any) -> int:
        require_supported()
        raise UnsupportedPlatform(f"the C library has no {name}")

    return missing


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_trylock = _symbol("pthread_mutex_trylock", gil_held=True)
_timedlock = _symbol("pthread_mutex_timedlock")
_unlock = _symbol("pthread_mutex_unlock", gil_held=True)
_consistent = _symbol("pthread_mutex_consistent", gil_held=True)
_syscall = _symbol("syscall")  # a futex wait blocks: the GIL is released
_syscall_held = _symbol("syscall", gil_held=True)  # a futex wake does not
for _fn in (_syscall, _syscall_held):
    if hasattr(_fn, "restype"):
        _fn.restype = ctypes.c_long


#: How many more ``trylock`` calls a locker makes on a busy mutex before it sleeps in the kernel (0: none; about
#: 0.2 us each, with the GIL held). Off: two publishers pinned to the two cores of a loaded 2-core VM slept on the
#: lock about half as often with 20 (2.4 -> 1.3 times per 1,000 publishes, medians of 3) but spent 3% more CPU per
#: publish (2.87 -> 2.96 us; perf/ab_spin.py, perf/RESULTS.md), and earlier rounds on an unpinned loaded machine
#: showed nothing either way. Kept settable for that A/B on a quiet machine (``perf/ab_spin.py --spins 0,20``).
LOCK_SPIN = 0


def mutex_lock(ptr: ctypes.c_void_p, timeout: float) -> bool:
    """Lock within ``timeout`` seconds; True if the previous owner died (the caller repairs, then goes on).

    The uncontended path is one ``trylock`` call (as cheap as ``lock``); only a busy mutex pays for the clock
    read and ``pthread_mutex_timedlock`` (which sleeps in the kernel with the GIL released). A holder that is
    stopped (SIGSTOP, a debugger) or stuck makes this raise :class:`~shmbus.errors.BusLockTimeout` naming it,
    instead of freezing every publisher.

    Call it inside the ``try`` whose ``finally`` unlocks (see :data:`mutex_unlock`), and on an exception from it
    or the repair after it call :func:`mutex_settle`: Python may raise between any two calls here.
    """
    rc = _trylock(ptr)
    if rc == 0:
        return False
    if rc == errno.EBUSY and LOCK_SPIN:  # a holder running on another core may let go within a few tries
        for _ in range(LOCK_SPIN):
            rc = _trylock(ptr)
            if rc != errno.EBUSY:
                break
        if rc == 0:
            return False
    if rc == errno.EBUSY:
        deadline = time.time() + timeout
        sec = int(deadline)
        rc = _timedlock(ptr, ctypes.byref(_Timespec(sec, int((deadline - sec) * 1e9))))
        if rc == 0:
            return False
        if rc == errno.ETIMEDOUT:
            pid = mutex_holder_pid(ptr)
            raise BusLockTimeout(
                f"the bus's writer lock was not free within {timeout:g} s; it is held by pid {pid or '?'} "
                "(stopped or stuck?). Resume or kill that process; a killed holder is repaired automatically",
                holder_pid=pid,
            )
    return _owner_died(ptr, rc)


def mutex_holder_pid(ptr: ctypes.c_void_p) -> int:
    """The process (thread group) id of the mutex's owner, 0 if free or unknown.

    glibc stores the owner's thread id in the mutex (``__data.__owner``, a 32-bit int at offset 8 on x86-64);
    ``/proc/<tid>/status`` maps a thread id to its process.
    """
    tid = ctypes.c_int.from_address((ptr.value or 0) + 8).value & 0x3FFFFFFF
    if tid <= 0:
        return 0
    try:
        with open(f"/proc/{tid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Tgid:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return tid


#: Unlock; for a robust mutex glibc checks the owner, so a thread that does not hold it gets ``EPERM`` and nothing
#: changes. That makes it safe in a ``finally`` whose ``try`` begins *before* the lock is taken: an exception that
#: lands between the lock call and the next line (a signal handler's, an async exception) still releases it.
mutex_unlock = _unlock


def mutex_held(ptr: ctypes.c_void_p) -> bool:
    """Does the calling thread hold the mutex? (for an exception path, which cannot know where it was stopped)"""
    word = ctypes.c_int.from_address(ptr.value or 0).value
    return word & _FUTEX_TID_MASK == threading.get_native_id()


def mutex_settle(ptr: ctypes.c_void_p) -> bool:
    """On an exception path: True if the calling thread holds the mutex. One it holds from a dead owner and that an
    exception stopped before it was marked consistent is marked so now: unlocked inconsistent, it would refuse
    every later locker for good (``ENOTRECOVERABLE``)."""
    if not mutex_held(ptr):
        return False
    if ctypes.c_int.from_address((ptr.value or 0) + 8).value == _OWNER_INCONSISTENT:
        _consistent(ptr)
    return True


def _owner_died(ptr: ctypes.c_void_p, rc: int) -> bool:
    if rc == errno.EOWNERDEAD:
        _check(_consistent(ptr), "pthread_mutex_consistent")
        return True
    if rc == errno.ENOTRECOVERABLE:
        raise OSError(rc, "shmbus: the segment mutex is not recoverable; recreate the bus (shmbus destroy)")
    raise OSError(rc, os.strerror(rc))


class RobustMutex:
    """A robust process-shared mutex living at a fixed address in a shared mapping.

    ``acquire()`` returns ``True`` when the previous owner died while holding the lock: the caller then owns it,
    must repair whatever the dead owner was protecting, and the mutex is marked consistent before returning.
    """

    __slots__ = ("_ptr",)

    def __init__(self, address: int) -> None:
        # A prebuilt c_void_p and no argtypes keep each call near the raw ctypes floor (about 0.2 us).
        self._ptr = ctypes.c_void_p(address)

    @staticmethod
    def initialize(address: int) -> None:
        """Initialise a fresh mutex in place (exactly one process does this, when it creates the segment)."""
        require_supported()
        attr = ctypes.create_string_buffer(_MUTEXATTR_SIZE * 8)
        _check(_symbol("pthread_mutexattr_init")(attr), "pthread_mutexattr_init")
        try:
            _check(_symbol("pthread_mutexattr_setpshared")(attr, _PTHREAD_PROCESS_SHARED), "setpshared")
            _check(_symbol("pthread_mutexattr_setrobust")(attr, _PTHREAD_MUTEX_ROBUST), "setrobust")
            ctypes.memset(address, 0, MUTEX_SIZE)
            _check(_symbol("pthread_mutex_init")(ctypes.c_void_p(address), attr), "pthread_mutex_init")
        finally:
            _symbol("pthread_mutexattr_destroy")(attr)

    def acquire(self, timeout: float) -> bool:
        """Lock within ``timeout`` s; True if the previous owner died holding it (the caller repairs, then goes on)."""
        return mutex_lock(self._ptr, timeout)

    def release(self) -> None:
        _unlock(self._ptr)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise OSError(rc, f"{what}: {os.strerror(rc)}")


#: Relative timeouts of futex waits, made once per value (the listener's is always the same second): building the
#: struct cost as much as the wait's system call when it returns at once. The kernel only reads it, so one struct
#: serves every thread. At most 16 values are kept.
_timeouts: dict[float, Any] = {}


def futex_wait(address: int, expected: int, timeout: float | None) -> None:
    """Sleep while the 32-bit word at ``address`` equals ``expected`` (or until woken / timed out).

    The kernel compares the word atomically with queueing the waiter, so a wake that raced the caller's last read
    is never lost; the timeout is only insurance. Releases the GIL while sleeping (ctypes does).
    """
    if timeout is None:
        ts = None
    else:
        ts = _timeouts.get(timeout)
        if ts is None:
            sec = int(timeout)
            ts = ctypes.byref(_Timespec(sec, int((timeout - sec) * 1e9)))
            if len(_timeouts) < 16:
                _timeouts[timeout] = ts
    _syscall(_SYS_FUTEX, ctypes.c_void_p(address), _FUTEX_WAIT, ctypes.c_uint32(expected), ts, None, 0)


def futex_wake(address: int) -> None:
    """Wake every process sleeping on the word at ``address`` (without releasing the GIL: it never blocks)."""
    _syscall_held(_SYS_FUTEX, ctypes.c_void_p(address), _FUTEX_WAKE, _INT_MAX, None, None, 0)
