"""What the A/B scripts (``ab_*.py``) share: another checkout's interpreter, paired rounds in alternating order,
the medians table, and a callgrind instruction count."""

from __future__ import annotations

import re
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

__all__ = ["callgrind_instructions", "paired", "print_medians", "python_of"]


def python_of(tree: Path) -> str:
    """The checkout's own interpreter (its ``.venv``), else this one."""
    venv = tree / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def paired(
    rounds: int, here: Path, other: Path, measure: Callable[[Path], dict[str, float]]
) -> tuple[list[dict[str, float]], list[dict[str, float]]]:
    """``measure`` each tree once per round, the order alternating (neither always goes first): (this, other)."""
    this: list[dict[str, float]] = []
    that: list[dict[str, float]] = []
    for i in range(rounds):
        pair = [(here, this), (other, that)]
        for tree, into in pair if i % 2 else pair[::-1]:
            into.append(measure(tree))
    return this, that


def print_medians(
    this: list[dict[str, float]], other: list[dict[str, float]], name_width: int, cell: str, ratio: str
) -> None:
    """One line per measurement: the other tree's median, this one's, and this/other (``cell``, ``ratio``: their
    formats, e.g. ``"8.2f"``)."""
    width = int(cell.split(".")[0])
    print(
        f"{'measurement':{name_width}s} {'other':>{width}s} {'this':>{width}s}  this/other  (medians of "
        f"{len(this)} rounds)"
    )
    for name in this[0]:
        a, b = statistics.median(r[name] for r in other), statistics.median(r[name] for r in this)
        print(f"{name:{name_width}s} {a:{cell}} {b:{cell}}  {b / a if a else float('nan'):{ratio}}")


def callgrind_instructions(argv: list[str], tree: Path) -> int:
    """The instructions ``argv`` runs under callgrind (its dump discarded), run in ``tree``."""
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv],
        capture_output=True,
        text=True,
        cwd=tree,
    )
    found = re.search(r"Collected : (\d+)", done.stderr)
    assert found and done.returncode == 0, done.stderr[-2000:]
    return int(found.group(1))
