"""Griffe extension (mkdocs.yml): render the reST bits of shmbus's docstrings as Markdown.

The docstrings are written for ``help()`` and Sphinx habits: ``:class:`~.x.Y``` roles and ``Example::`` literal
blocks. Markdown would show the role markup as text; this turns a role into inline code of its target (the
``~`` and leading dots dropped; no link, so a relative target can never become a broken reference) and a
trailing ``::`` into ``:`` (the indented block below is already a Markdown code block).

It also shows an integer default as the source writes it: the parser keeps only the value, so ``mode=0o600``
read ``mode: int = 384`` in the API reference.
"""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj):`~?\.*([^`]+)`")
LITERAL = re.compile(r"(\S)::$", re.M)
BASED_INT = r"0[oOxXbB][0-9a-fA-F_]+"


def markdown(text: str) -> str:
    return LITERAL.sub(r"\1:", ROLE.sub(r"`\1`", text))


class RestToMarkdown(Extension):
    def on_object(self, *, obj: Any, loader: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
        if getattr(obj, "is_function", False):
            written_defaults(obj)


def written_defaults(func: Any) -> None:
    """Put back ``0o600`` (or ``0x...``, ``0b...``) where the parser turned a default into its decimal value."""
    try:
        source = func.source
    except Exception:  # no source lines (a compiled or synthetic object)
        return
    for param in func.parameters:
        value = str(param.default) if param.default is not None else ""
        if not value.isdigit():
            continue
        m = re.search(rf"\b{re.escape(param.name)}\s*(?::[^=,()]*)?=\s*({BASED_INT})\b", source)
        if m and int(m.group(1), 0) == int(value):
            param.default = m.group(1)
