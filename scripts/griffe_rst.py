"""Griffe extension (mkdocs.yml): render the reST bits of shmbus's docstrings as Markdown.

The docstrings are written for ``help()`` and Sphinx habits: ``:class:`~.x.Y``` roles and ``Example::`` literal
blocks. Markdown would show the role markup as text; this turns a role into inline code of its target (the
``~`` and leading dots dropped; no link, so a relative target can never become a broken reference) and a
trailing ``::`` into ``:`` (the indented block below is already a Markdown code block).
"""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj):`~?\.*([^`]+)`")
LITERAL = re.compile(r"(\S)::$", re.M)


def markdown(text: str) -> str:
    return LITERAL.sub(r"\1:", ROLE.sub(r"`\1`", text))


class RestToMarkdown(Extension):
    def on_object(self, *, obj: Any, loader: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
