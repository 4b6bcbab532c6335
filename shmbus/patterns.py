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

__all__ = ["compile_pattern"]

Matcher = Callable[[str], bool]


@lru_cache(maxsize=1024)
def compile_pattern(pattern: str, kind: str = "glob") -> Matcher:
    """Return a predicate ``channel -> bool`` for ``pattern`` of the given kind."""
    if kind == "prefix":
        base = pattern.rstrip("/")
        below = base + "/"
        return lambda ch: ch == base or ch.startswith(below)
    if kind != "glob":
        raise ValueError(f"unknown pattern kind {kind!r}; use 'glob' or 'prefix'")
    return re.compile(_glob_to_regex(pattern)).fullmatch  # type: ignore[return-value]


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
                body = pattern[i + 1 : j]
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append("[" + body.replace("\\", "\\\\") + "]")
                i = j
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)
