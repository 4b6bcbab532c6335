"""A message or docstring that sends the reader to a section ("(docs/web.md, 'Serving')") names one that exists;
the README's install list names every extra.

Issue 34: the sync-worker warning pointed to a README section ("Servers") that did not exist.
"""

from __future__ import annotations

import re

import pytest

from tests.harness import REPO_ROOT

REFERENCE = re.compile(r"\((README|docs/[\w-]+\.md), ['\"]([^'\"]+)['\"]")
SOURCES = sorted([*(REPO_ROOT / "shmbus").rglob("*.py"), *(REPO_ROOT / "adapters").rglob("*.py")])


def references() -> list[tuple[str, str, str]]:
    """``(where, file, section)`` for every such reference in the code."""
    found = []
    for path in SOURCES:
        for m in REFERENCE.finditer(path.read_text()):
            found.append((str(path.relative_to(REPO_ROOT)), m.group(1), m.group(2)))
    return found


def headings(doc: str) -> list[str]:
    path = REPO_ROOT / ("README.md" if doc == "README" else doc)
    return [line.lstrip("#").strip() for line in path.read_text().splitlines() if line.startswith("#")]


def test_the_sync_worker_warning_is_among_the_references() -> None:
    assert any(where == "adapters/wsgi.py" for where, _, _ in references())


@pytest.mark.parametrize(("where", "doc", "section"), references())
def test_a_referenced_section_exists(where: str, doc: str, section: str) -> None:
    assert any(h == section or h.startswith(section + ":") for h in headings(doc)), (
        f"{where} points to {doc}, section {section!r}, which has no such heading: {headings(doc)}"
    )


def test_the_readme_install_list_names_every_extra() -> None:
    """Issue 34: ``[client]`` was missing from the list. Every extra of setup.cfg but the test suite's own."""
    import configparser

    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(REPO_ROOT / "setup.cfg")
    extras = set(cfg["options.extras_require"]) - {"test"}
    install = (REPO_ROOT / "README.md").read_text().split("## Install", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"pip install 'shmbus\[(\w+)\]'", install))
    assert extras <= listed, f"extras missing from the README's install list: {sorted(extras - listed)}"
