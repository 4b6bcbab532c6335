"""How a poll can end besides with an answer, and the counters the client keeps about it."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ClientStats", "HeadersFailed", "NoFirstChunk", "PollFailed", "RateLimited", "Repoll"]


class PollFailed(Exception):
    """A poll the server did not answer with 200 (kept in ``stats.last_error``; the client backs off)."""


class RateLimited(Exception):
    """A 429: wait ``seconds`` (its Retry-After, at least the floor)."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"429: retry after {seconds:g} s")
        self.seconds = seconds


class NoFirstChunk(Exception):
    """A streamed poll sent no first chunk in time (a buffering proxy): fall back to non-chunked polls."""


class HeadersFailed(PollFailed):
    """The ``headers`` callable raised or returned no mapping: the poll is not sent (a failure: backed off)."""


class Repoll(Exception):
    """The answer so far reset a position: the rest of it counts from the old one; poll again at once."""


@dataclass
class ClientStats:
    """Counters since the client was made (a copy: read ``client.stats`` again for fresh figures)."""

    polls: int = 0
    failures: int = 0
    rate_limited: int = 0
    messages: int = 0
    callback_errors: int = 0
    duplicates: int = 0
    resets: int = 0
    chunked_fallbacks: int = 0
    #: answers (or pieces of one) over ``max_body_bytes``, not read further (each also a failure)
    too_large: int = 0
    bytes: int = 0
    consecutive_failures: int = 0
    last_error: str | None = None
    #: hooks (``on_connect``, ``on_error``, ...) that raised (each logged; the poll loop went on)
    hook_errors: int = 0
    #: messages whose ``decoder`` raised (each logged and not delivered; the position moved past it)
    decode_errors: int = 0
    #: saves of the ``position_store`` that raised (each logged; retried at the next ``save_interval``)
    store_errors: int = 0
    #: messages dropped unseen by ``overflow="drop_oldest"`` (``max_pending`` were already waiting)
    dropped: int = 0
    #: times the poll loop stopped reading until the callbacks caught up (``max_pending``, ``overflow="block"``)
    backpressure: int = 0
