"""Every logger shmbus logs through is in the logging table of docs/operations.md, and the table names no other.

The loggers are read from the code (each ``logging.getLogger(...)`` of ``shmbus/`` and ``adapters/``, which is
installed as ``shmbus.adapters``, so ``getLogger(__name__)`` there is ``shmbus.adapters.<module>``). The table once
named ``shmbus.spark`` and ``shmbus.admin`` (no such loggers) and left out the WSGI start-up warning's, the
Django checks', Web Push's and the HTTP client's. A logger named anywhere else in the docs must exist too.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.harness import REPO_ROOT

OPERATIONS = REPO_ROOT / "docs" / "operations.md"
NAME = re.compile(r"`(shmbus(?:\.\w+)*)`")
MENTION = re.compile(r"`(shmbus(?:\.\w+)*)` logger|logger `(shmbus(?:\.\w+)*)`")


def _module_name(path: Path) -> str:
    rel = path.relative_to(REPO_ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[0] == "adapters":
        parts.insert(0, "shmbus")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def code_loggers() -> dict[str, list[str]]:
    """logger name -> the files that get it."""
    found: dict[str, list[str]] = {}
    for root in ("shmbus", "adapters"):
        for path in sorted((REPO_ROOT / root).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "getLogger"):
                    continue
                [arg] = node.args
                if isinstance(arg, ast.Name) and arg.id == "__name__":
                    name = _module_name(path)
                else:
                    assert isinstance(arg, ast.Constant) and isinstance(arg.value, str), (path, ast.dump(arg))
                    name = arg.value
                found.setdefault(name, []).append(str(path.relative_to(REPO_ROOT)))
    return found


def table_loggers() -> set[str]:
    """The names in the first column of the logging table."""
    section = OPERATIONS.read_text().split("## Logging", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `shmbus")]
    assert rows, "docs/operations.md has no logging table"
    return {name for row in rows for name in NAME.findall(row.split("|")[1])}


def test_every_logger_in_the_code_is_documented_and_no_other() -> None:
    code, documented = code_loggers(), table_loggers()
    assert "shmbus" in code and "shmbus.adapters.wsgi" in code  # the scan finds both trees
    missing = {name: files for name, files in code.items() if name not in documented}
    assert not missing, f"loggers not in the table of docs/operations.md: {missing}"
    assert documented <= set(code), f"the table names loggers nothing logs to: {sorted(documented - set(code))}"


def test_loggers_named_elsewhere_in_the_docs_exist() -> None:
    code = set(code_loggers())
    for path in [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]:
        for match in MENTION.finditer(path.read_text()):
            name = match.group(1) or match.group(2)
            assert name in code, f"{path.name} names the logger {name!r}, which does not exist"
