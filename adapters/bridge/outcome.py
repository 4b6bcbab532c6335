"""A publish whose reply was never read: the backend may have stored the message, so the caller must be told so.

A backend's wire code (``redis/commands``, ``postgres/direct``) knows whether its request left: before it was
written, a failure is a definite "not published"; after, a failure while waiting for the reply (a timeout, the
connection lost, an exception from a signal handler) is :class:`ReplyLost`, which the backend turns into
:class:`~shmbus.errors.PublishOutcomeUnknown` with :func:`outcome_unknown`. A ``BaseException`` that is not an
``Exception`` (``KeyboardInterrupt``, ``SystemExit``, gevent's ``Timeout``) is the caller's own stop: it propagates
unchanged, with a note (:func:`note_unknown`), after the wire code dropped the connection whose reply is pending.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from shmbus.errors import PublishOutcomeUnknown

if TYPE_CHECKING:
    from shmbus.engines import Envelope

__all__ = ["ReplyLost", "cause_text", "note_unknown", "outcome_unknown"]


class ReplyLost(Exception):
    """The request was written (``sent``: True; None: part of it may have been) and its reply not read."""

    def __init__(self, cause: BaseException, sent: bool | None = True) -> None:
        super().__init__(cause_text(cause))
        self.cause = cause
        self.sent = sent


def cause_text(exc: BaseException) -> str:
    """The exception named with its text: never an empty reason (``TimeoutError()`` says ``TimeoutError``)."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def outcome_unknown(kind: str, where: str, envelopes: Sequence[Envelope], lost: ReplyLost) -> PublishOutcomeUnknown:
    """``kind``: the backend's kind (``"redis"``, ``"postgres"``), ``where``: its address without secrets."""
    channel = envelopes[0].channel if len(envelopes) == 1 else None
    what = f"the publish on {channel!r}" if channel is not None else f"a batch of {len(envelopes)} messages"
    name, cause = _NAMES.get(kind, kind), cause_text(lost.cause)
    return PublishOutcomeUnknown(
        f"{name} at {where}: {what} was sent but its reply was not read ({cause}); it may or may not have been "
        "stored: check before publishing it again",
        channel=channel,
        backend=kind,
        where=where,
        cause=lost.cause,
        sent=lost.sent,
        count=len(envelopes),
    )


_NAMES = {"redis": "Redis", "postgres": "PostgreSQL", "rabbitmq": "RabbitMQ", "nats": "NATS"}


def note_unknown(exc: BaseException, kind: str) -> None:
    """Say on ``exc`` (Python 3.11's notes; nothing before) that it interrupted a publish already sent."""
    add_note = getattr(exc, "add_note", None)
    if add_note is not None:
        name = _NAMES.get(kind, kind)
        add_note(f"shmbus: it interrupted a {name} publish already sent: the message may or may not be stored")
