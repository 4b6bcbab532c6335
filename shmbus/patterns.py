"""Channel patterns for ``subscribe(..., pattern=...)``.

Two documented syntaxes:

* ``"glob"`` (or ``pattern=True``): shell-style, segment aware. ``*`` matches within one path segment (no ``/``),
  ``**`` matches across segments, ``?`` one character, ``[abc]`` a set. ``/chat/*`` matches ``/chat/1`` but not
  ``/chat/1/typing``; ``/chat/**`` matches both.
* ``"prefix"``: guble-style hierarchy. ``/foo`` matches ``/foo`` itself and everything below it (``/foo/bar``,
  ``/foo/bar/baz``) but not ``/foobar``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache

from .errors import InvalidArgument, InvalidChannel

__all__ = ["compile_pattern"]

Matcher = Callable[[str], bool]


@lru_cache(maxsize=1024)
def compile_pattern(pattern: str, kind: str = "glob") -> Matcher:
    """Return a predicate ``channel -> bool`` for ``pattern`` of the given kind.

    A glob that is not well formed (an empty set ``[]`` or ``[!]``, a reversed range ``[z-a]``) raises
    :class:`~shmbus.errors.InvalidChannel`; an unknown kind raises :class:`~shmbus.errors.InvalidArgument` (both
    are ``ValueError``). Nothing else is ever raised, so callers can validate a pattern before they register it.
    """
    if not isinstance(pattern, str):
        raise InvalidChannel(f"a pattern must be a str, got {type(pattern).__name__}")
    if kind == "prefix":
        base = pattern.rstrip("/")
        below = base + "/"
        return lambda ch: ch == base or ch.startswith(below)
    if kind != "glob":
        raise InvalidArgument(f"unknown pattern kind {kind!r}; use 'glob' or 'prefix'")
    try:
        return re.compile(_glob_to_regex(pattern)).fullmatch  # type: ignore[return-value]
    except re.error as exc:  # _glob_to_regex should make this impossible; a typed error all the same
        raise InvalidChannel(f"invalid glob {pattern[:80]!r}: {exc}") from None


def _glob_to_regex(pattern: str) -> str:
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "*":
            if i + 1 < n and pattern[i + 1] == "*":
                out.append(".*")
                i += 2
                continue
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = pattern.find("]", i + 1)
            if j < 0:
                out.append(re.escape(c))
            else:
                out.append(_glob_set(pattern, pattern[i + 1 : j]))
                i = j
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def _glob_set(pattern: str, body: str) -> str:
    """``[body]`` of a glob as a regex set: every character literal (escaped), ``a-z`` a range, a leading ``!``
    (or ``^``, as in bash) negates. An empty set or a reversed range is an :class:`InvalidChannel`, never an
    invalid regex."""
    negate = body[:1] in ("!", "^")
    if negate:
        body = body[1:]
    if not body:
        raise InvalidChannel(f"invalid glob {pattern[:80]!r}: empty set")
    out = ["[^" if negate else "["]
    i, n = 0, len(body)
    while i < n:
        c = body[i]
        if i + 2 < n and body[i + 1] == "-":
            end = body[i + 2]
            if ord(end) < ord(c):
                raise InvalidChannel(f"invalid glob {pattern[:80]!r}: reversed range '{c}-{end}'")
            out.append(re.escape(c) + "-" + re.escape(end))
            i += 3
        else:
            out.append(re.escape(c))
            i += 1
    out.append("]")
    return "".join(out)
