"""How a poll can end besides with an answer, and the counters the client keeps about it."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ClientStats", "NoFirstChunk", "PollFailed", "RateLimited", "Repoll"]


class PollFailed(Exception):
    """A poll the server did not answer with 200 (kept in ``stats.last_error``; the client backs off)."""


class RateLimited(Exception):
    """A 429: wait ``seconds`` (its Retry-After, at least the floor)."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"429: retry after {seconds:g} s")
        self.seconds = seconds


class NoFirstChunk(Exception):
    """A streamed poll sent no first chunk in time (a buffering proxy): fall back to non-chunked polls."""


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
