"""The house rules of the source tree, checked from the code's own text (nothing is imported or run).

* no import circle among the modules of ``shmbus`` and ``shmbus.adapters`` -- counting every import: top-level,
  function-level and type-only (``if TYPE_CHECKING:``) alike, because a circle hidden by a late import is still a
  circle for a reader;
* layering: the core (``shmbus/``) never imports the adapters (``adapters/``, installed as ``shmbus.adapters``) --
  no import statement of any kind, and no adapter module named in its code as a string (what ``importlib``,
  ``__import__`` or a table of module names would import); what the core reaches of the adapters at run time it
  finds in the package's entry points (``shmbus/providers.py``);
* no module over ``MAX_LINES`` lines;
* no class name defined twice in ``shmbus`` and ``adapters`` (a name means one thing), but for the few in
  ``SHARED_CLASS_NAMES``, each with why.

Run as a script for the report: ``python tests/test_architecture.py``.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: Where each top package's source lives (``adapters/`` is installed as ``shmbus.adapters``).
SOURCES = {"shmbus": ROOT / "shmbus", "shmbus.adapters": ROOT / "adapters"}
MAX_LINES = 400


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


#: An adapter module's dotted name, as the core would import it.
ADAPTER_MODULE = re.compile(r"(shmbus\.)?adapters(\.[A-Za-z_]\w*)*")
_IMPORTERS = {"import_module", "__import__", "find_spec", "find_loader", "load_module", "run_module"}


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes of ``tree`` (text for readers, which may name any module)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _names_adapters(module: str) -> bool:
    return bool(ADAPTER_MODULE.fullmatch(module))


def adapter_uses(source: str, module: str = "shmbus.x", is_package: bool = False) -> list[str]:
    """Where the core module ``module`` (its ``source``) reaches into the adapters: import statements (top-level,
    function-level, type-only), string constants that are an adapter module's name, and an importer (``importlib``,
    ``__import__``, ``runpy``) handed text built from one."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        where = f"line {getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import):
            found += [f"{where}: import {a.name}" for a in node.names if _names_adapters(a.name)]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")
                parts = parts[: len(parts) - node.level + (1 if is_package else 0)]
                base = ".".join(parts + ([node.module] if node.module else []))
            targets = [base, *(f"{base}.{a.name}" for a in node.names)]
            if any(_names_adapters(t) for t in targets):
                found.append(f"{where}: from {'.' * node.level}{node.module or ''} import ...")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            if _names_adapters(node.value):
                found.append(f"{where}: names the adapter module {node.value!r}")
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            text = [c.value for a in node.args for c in ast.walk(a) if isinstance(c, ast.Constant)]
            if name in _IMPORTERS and any(isinstance(t, str) and "adapters" in t for t in text):
                found.append(f"{where}: {name}() of a name built with 'adapters'")
    return found


def core_adapter_uses() -> list[str]:
    """Every place the core (``shmbus/``, not ``adapters/``) reaches into the adapters (see the module doc)."""
    found = []
    for name, path in modules().items():
        if path.is_relative_to(SOURCES["shmbus"]):
            rel = path.relative_to(ROOT)
            found += [f"{rel}: {use}" for use in adapter_uses(path.read_text(), name, path.name == "__init__.py")]
    return found


def big_modules() -> list[tuple[str, int]]:
    sizes = [(str(path.relative_to(ROOT)), len(path.read_text().splitlines())) for path in modules().values()]
    return sorted(((p, n) for p, n in sizes if n > MAX_LINES), key=lambda row: -row[1])


def test_no_import_circle() -> None:
    found = circles(graph())
    assert not found, "import circles (type-only and function-level imports count):\n" + "\n".join(
        " <-> ".join(c) for c in found
    )


def test_the_core_never_imports_the_adapters() -> None:
    found = core_adapter_uses()
    assert not found, "the core reaches into the adapters (use shmbus/providers.py):\n" + "\n".join(found)


@pytest.mark.parametrize(
    "source",
    [
        "import shmbus.adapters.redis",
        "import adapters.http.wire as wire",
        "from shmbus.adapters import redis",
        "from shmbus import adapters",
        "from ..adapters.redis import layout",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from shmbus.adapters.bridge import Relay",
        "def f():\n    from shmbus.adapters.guble import cli",
        "import importlib\nimportlib.import_module('shmbus.adapters.guble.cli')",
        "__import__('shmbus.adapters.redis')",
        "MODULE = 'shmbus.adapters.redis.view'",
        "PROVIDERS = {'redis': 'shmbus.adapters.redis'}",
        "import importlib\nimportlib.import_module('shmbus.' + 'adapters.' + 'redis')",
        "import runpy\nrunpy.run_module('shmbus.%s' % 'adapters')",
    ],
)
def test_every_way_of_reaching_an_adapter_is_seen(source: str) -> None:
    assert adapter_uses(source, "shmbus.sub.mod"), source


@pytest.mark.parametrize(
    "source",
    [
        '"""Docstrings may name shmbus.adapters.redis.RedisBridge for the reader."""',
        "import importlib\ndef load(name):\n    return importlib.import_module(name)",
        "from .engines import Engine",
        "HELP = 'see the adapters'",
    ],
)
def test_what_is_not_reaching_an_adapter(source: str) -> None:
    assert not adapter_uses(source, "shmbus.sub.mod"), source


def test_no_module_over_the_size_limit() -> None:
    assert not big_modules(), f"modules over {MAX_LINES} lines: {big_modules()}"


#: Class names defined in more than one place on purpose: the name -> the files that define it, and why.
SHARED_CLASS_NAMES: dict[str, set[str]] = {
    # message_bus's own name for its middleware, one class per shell (the same options, routes and protocol core):
    # an app imports the one of the shell it runs, ``shmbus.adapters.asgi`` or ``shmbus.adapters.wsgi``.
    "MessageBusMiddleware": {"adapters/asgi.py", "adapters/wsgi.py"},
}


def class_definitions(sources: dict[str, str]) -> dict[str, set[str]]:
    """Every class name -> the files (of ``sources``: path -> text) that define a class of that name, at any depth."""
    found: dict[str, set[str]] = {}
    for path, text in sources.items():
        for node in ast.walk(ast.parse(text, path)):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, set()).add(path)
    return found


def twice_defined(sources: dict[str, str], shared: dict[str, set[str]]) -> dict[str, list[str]]:
    """The class names of ``sources`` defined in two or more files, but for those ``shared`` allows (exactly)."""
    return {
        name: sorted(paths)
        for name, paths in class_definitions(sources).items()
        if len(paths) > 1 and shared.get(name) != paths
    }


def test_no_class_name_is_defined_twice() -> None:
    sources = {str(path.relative_to(ROOT)): path.read_text() for path in modules().values()}
    found = twice_defined(sources, SHARED_CLASS_NAMES)
    assert not found, (
        "class names defined in more than one module (rename one, or add it, with why, to SHARED_CLASS_NAMES):\n"
        + "\n".join(f"{name}: {', '.join(paths)}" for name, paths in sorted(found.items()))
    )
    defined = class_definitions(sources)
    stale = {name: paths for name, paths in SHARED_CLASS_NAMES.items() if defined.get(name) != paths}
    assert not stale, f"SHARED_CLASS_NAMES lists names no longer defined exactly there: {stale}"


def test_a_class_name_defined_twice_is_seen() -> None:
    sources = {"a.py": "class Ring:\n    pass", "b.py": "def f():\n    class Ring:\n        pass", "c.py": "Ring = 1"}
    assert twice_defined(sources, {}) == {"Ring": ["a.py", "b.py"]}
    assert twice_defined(sources, {"Ring": {"a.py", "b.py"}}) == {}
    assert twice_defined({**sources, "c.py": "class Ring: ..."}, {"Ring": {"a.py", "b.py"}}) == {
        "Ring": ["a.py", "b.py", "c.py"]
    }


if __name__ == "__main__":
    edges = graph()
    for component in circles(edges):
        print("circle:", ", ".join(component))
        for name in component:
            inside = sorted(t for t in edges[name] if t in component)
            print(f"    {name} -> {', '.join(inside)}")
    for path, lines in big_modules():
        print(f"big: {path} {lines} lines")
    for use in core_adapter_uses():
        print(f"layering: {use}")
    twice = twice_defined({str(p.relative_to(ROOT)): p.read_text() for p in modules().values()}, SHARED_CLASS_NAMES)
    for name, paths in sorted(twice.items()):
        print(f"class {name} defined in: {', '.join(paths)}")
    sys.exit(1 if circles(edges) or big_modules() or core_adapter_uses() or twice else 0)
