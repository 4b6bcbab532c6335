"""What the append does while it holds the writers' lock: the calls made holding it keep the GIL."""

from __future__ import annotations

import ctypes

from shmbus import _native


def test_the_calls_made_holding_the_lock_keep_the_gil() -> None:
    """A call that releases the GIL takes it back on return: a trylock that took the bus's lock would then wait for
    the GIL (the switch interval, if another thread runs Python) while every other writer waits for the lock."""
    for fn in (_native._trylock, _native._unlock, _native._consistent, _native._syscall_held):
        assert fn._flags_ & ctypes._FUNCFLAG_PYTHONAPI, fn  # type: ignore[attr-defined]
    # what blocks still lets the process's other threads run
    for fn in (_native._timedlock, _native._syscall):
        assert not fn._flags_ & ctypes._FUNCFLAG_PYTHONAPI, fn  # type: ignore[attr-defined]
