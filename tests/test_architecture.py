"""The house rules of the source tree, checked from the code's own text (nothing is imported or run).

* no import circle among the modules of ``shmbus`` and ``shmbus.adapters`` -- counting every import: top-level,
  function-level and type-only (``if TYPE_CHECKING:``) alike, because a circle hidden by a late import is still a
  circle for a reader;
* no module over ``MAX_LINES`` lines.

Run as a script for the report: ``python tests/test_architecture.py``.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Where each top package's source lives (``adapters/`` is installed as ``shmbus.adapters``).
SOURCES = {"shmbus": ROOT / "shmbus", "shmbus.adapters": ROOT / "adapters"}
MAX_LINES = 420  # the "about 400"


def modules() -> dict[str, Path]:
    """Every module's dotted name → its file."""
    found: dict[str, Path] = {}
    for package, folder in SOURCES.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


def _imports(name: str, path: Path, known: dict[str, Path]) -> Iterator[str]:
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            # ``from pkg import mod`` imports the module pkg.mod when there is one; else a name of pkg
            targets = [
                f"{prefix}.{alias.name}" if f"{prefix}.{alias.name}" in known else prefix for alias in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in known:  # ``import a.b.c`` where only a.b is ours, say
                target = target.rpartition(".")[0]
            if target and target != name:
                yield target


def graph() -> dict[str, set[str]]:
    known = modules()
    edges = {name: set(_imports(name, path, known)) for name, path in known.items()}
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of two or more modules (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def big_modules() -> list[tuple[str, int]]:
    sizes = [(str(path.relative_to(ROOT)), len(path.read_text().splitlines())) for path in modules().values()]
    return sorted(((p, n) for p, n in sizes if n > MAX_LINES), key=lambda row: -row[1])


def test_no_import_circle() -> None:
    found = circles(graph())
    assert not found, "import circles (type-only and function-level imports count):\n" + "\n".join(
        " <-> ".join(c) for c in found
    )


def test_no_module_over_the_size_limit() -> None:
    assert not big_modules(), f"modules over {MAX_LINES} lines: {big_modules()}"


if __name__ == "__main__":
    edges = graph()
    for component in circles(edges):
        print("circle:", ", ".join(component))
        for name in component:
            inside = sorted(t for t in edges[name] if t in component)
            print(f"    {name} -> {', '.join(inside)}")
    for path, lines in big_modules():
        print(f"big: {path} {lines} lines")
    sys.exit(1 if circles(edges) or big_modules() else 0)
