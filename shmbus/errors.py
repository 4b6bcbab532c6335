"""Typed exceptions: every bad input gets one of these, never a crash or a silent loss."""

from __future__ import annotations

import pickle
from typing import Any

__all__ = [
    "BusBridged",
    "BusClosed",
    "BusDestroyed",
    "BusLockTimeout",
    "BusNotFound",
    "ChannelTableFull",
    "EngineError",
    "IllegalTransition",
    "InvalidArgument",
    "InvalidChannel",
    "InvalidMessage",
    "InvalidMessageTarget",
    "LayoutMismatch",
    "NotASegment",
    "PayloadTooLarge",
    "PublishOutcomeUnknown",
    "SegmentCorrupt",
    "ShmbusError",
    "UnsafeSegment",
    "UnsupportedPlatform",
]


class ShmbusError(Exception):
    """Base class of every error shmbus raises on purpose."""


class InvalidArgument(ShmbusError, ValueError):
    """An argument of the wrong type or out of range (an option, an id, a count); nothing was written."""


class InvalidChannel(InvalidArgument):
    """A channel name that is not a non-empty string, is too long, or contains NUL."""


class InvalidMessage(InvalidArgument):
    """A publish that message_bus would refuse (e.g. ``user_ids`` on a ``/global/`` channel)."""


class InvalidMessageTarget(InvalidMessage):
    """An empty ``client_ids``/``user_ids``/``group_ids`` list: it would target nobody."""


class PayloadTooLarge(ShmbusError, ValueError):
    """The encoded message does not fit the ring's per-record limit (a quarter of the ring)."""


class BusDestroyed(ShmbusError):
    """The bus was destroyed; call ``on()`` to use it again."""


class BusClosed(BusDestroyed):
    """The bus was closed by this process."""


class BusNotFound(ShmbusError, FileNotFoundError):
    """``Bus(name)`` (without ``create=True``) or the command line names a bus that does not exist: a typo, or
    the app that creates it has not started. Raised by the constructor, not at first use; the message lists the
    buses that do exist. A ``FileNotFoundError``, as before it had its own type."""


class LayoutMismatch(ShmbusError):
    """The named segment was written by an incompatible shmbus layout version."""


class NotASegment(ShmbusError):
    """The named shared-memory object exists but is not a shmbus segment."""


class SegmentCorrupt(NotASegment):
    """A segment whose header, sizes or record chains are damaged (a foreign writer or a tampered file).

    Readers raise it instead of looping or reading past the mapping; the message says what was found where.
    """


class UnsafeSegment(ShmbusError, PermissionError):
    """The named segment belongs to another user or grants group/other more than this process allows.

    Such a file could have been planted to read targeted messages or inject forged ones; pass a matching ``mode=``
    (e.g. ``0o660``) to share a bus with a group on purpose.
    """


class BusLockTimeout(ShmbusError, TimeoutError):
    """The writer lock was not acquired within ``lock_timeout`` (its holder is stopped or stuck).

    ``holder_pid`` is the pid the mutex names as its owner (0 if unknown).
    """

    def __init__(self, message: str, holder_pid: int = 0) -> None:
        super().__init__(message)
        self.holder_pid = holder_pid


class ChannelTableFull(ShmbusError):
    """Every channel slot holds a channel with live messages; raise ``max_channels``."""


class IllegalTransition(ShmbusError, RuntimeError):
    """A state machine asked to take a step its table does not allow (a waiting request finished before it was
    parked, a connection answering twice): a fault in the code that drives it, never bad input. The message names
    the machine, its state and the step."""


class EngineError(ShmbusError):
    """An engine (e.g. the Redis bridge) could not carry out a publish; the message was not stored."""


class PublishOutcomeUnknown(ShmbusError):
    """A bridged publish whose request reached (or may have reached) the backend but whose reply was never read: a
    timeout, a connection lost mid-reply, an exception raised by a signal handler. The message may have been stored
    and delivered everywhere, or not at all; retrying blindly may publish it twice (see ``docs/faults.md`` for a
    retry without duplicates). Deliberately not an :class:`EngineError`, whose promise is "not stored".

    ``channel`` (None for a batch of several), ``count`` (messages in the request), ``backend`` (``"redis"``,
    ``"postgres"``), ``where`` (its address without secrets), ``sent`` (True: the whole request was written;
    None: some of it may have been) and ``cause`` (the exception that ended the wait, also ``__cause__``)."""

    def __init__(
        self,
        message: str,
        *,
        channel: str | None,
        backend: str,
        where: str,
        cause: BaseException,
        sent: bool | None = True,
        count: int = 1,
    ) -> None:
        super().__init__(message)
        self.channel = channel
        self.count = count
        self.backend = backend
        self.where = where
        self.cause = cause
        self.sent = sent

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled with its fields (a task queue sends a task's exception to another process); a cause that cannot
        be pickled travels as its text."""
        try:
            cause: BaseException = pickle.loads(pickle.dumps(self.cause))
        except Exception:
            cause = RuntimeError(f"{type(self.cause).__name__}: {self.cause}")
        fields = {"channel": self.channel, "backend": self.backend, "where": self.where, "cause": cause}
        return (_rebuild_outcome_unknown, (str(self), {**fields, "sent": self.sent, "count": self.count}))


def _rebuild_outcome_unknown(message: str, fields: dict[str, Any]) -> PublishOutcomeUnknown:
    return PublishOutcomeUnknown(message, **fields)


class BusBridged(EngineError):
    """The bus is bridged (Redis, PostgreSQL: the segment records which) and this process publishes without that
    engine: a local id would be one the backend later gives another message, splitting the bus. Configure the
    engine (``engine=`` or ``SHMBUS_ENGINE_URL``); the message says which."""


class UnsupportedPlatform(ShmbusError):
    """The shared-memory bus needs Linux x86-64 with glibc (robust mutexes, futexes, x86-64's store order). Raised by
    ``Bus(...)``, not by ``import shmbus``, so the HTTP client works everywhere; the message says what to use."""
