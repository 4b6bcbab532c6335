"""Reading a callgrind dump: its total and each function's exclusive cost (the A/B scripts' instruction counts)."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

__all__ = ["parse"]


def parse(path: Path, names: dict[str, str]) -> tuple[int, dict[str, int]]:
    """A callgrind dump's total and exclusive cost per function (``names``: the compressed names seen so far)."""
    per: dict[str, int] = defaultdict(int)
    fn = "?"
    skip_next = False
    total = 0
    for line in path.read_text().splitlines():
        if line.startswith("summary:"):
            total = int(line.split()[1])
        elif line.startswith("fn="):
            m = re.match(r"fn=\((\d+)\)(?: (.*))?", line)
            if m:
                if m.group(2):
                    names[m.group(1)] = m.group(2)
                fn = names.get(m.group(1), m.group(1))
            else:
                fn = line[3:]
        elif line.startswith("cfn="):
            m = re.match(r"cfn=\((\d+)\) (.*)", line)
            if m:
                names[m.group(1)] = m.group(2)
        elif line.startswith("calls="):
            skip_next = True  # the next cost line is the call's inclusive cost
        elif line[:1].isdigit() or line[:1] in "+-*":
            if skip_next:
                skip_next = False
                continue
            parts = line.split()
            if len(parts) >= 2:
                per[fn] += int(parts[1])
    return total, per
