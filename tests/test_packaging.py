"""The installed package holds every module of the source tree.

setup.cfg lists its packages by hand (``adapters/`` is mapped to ``shmbus.adapters``, which ``find_packages``
cannot express), so a new subpackage that is not listed would be missing from a wheel while an editable install,
which the test suite uses, still finds it. This compares the list with the tree.
"""

from __future__ import annotations

import configparser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROOTS = {"shmbus": ROOT / "shmbus", "shmbus.adapters": ROOT / "adapters"}


def tree_packages() -> set[str]:
    found = set()
    for name, base in ROOTS.items():
        for init in base.rglob("__init__.py"):
            if "__pycache__" in init.parts:
                continue
            rel = init.parent.relative_to(base).parts
            found.add(".".join((name, *rel)))
    return found


def test_every_package_of_the_tree_is_listed_in_setup_cfg() -> None:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    listed = {line.strip() for line in cfg["options"]["packages"].splitlines() if line.strip()}
    assert tree_packages() == listed, (
        f"missing from setup.cfg: {tree_packages() - listed}; stale: {listed - tree_packages()}"
    )


def test_typed_marker_for_both_roots() -> None:
    assert (ROOT / "shmbus" / "py.typed").exists() and (ROOT / "adapters" / "py.typed").exists()
