"""MkDocs hook (mkdocs.yml ``hooks:``): let mkdocstrings find ``shmbus.adapters``.

The source tree keeps the adapters in ``adapters/`` and setup.cfg installs them as ``shmbus.adapters``; griffe
(mkdocstrings' loader) reads sources from directories and does not follow that mapping. As scripts/typecheck
does for mypy, this stages the installed layout in a temporary directory (a copy of ``shmbus/`` with
``adapters/`` as ``shmbus/adapters``: griffe resolves symlinks back to the repository, so they would not do)
and points the Python handler there.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path
from typing import Any

from mkdocs.plugins import event_priority

ROOT = Path(__file__).resolve().parent.parent
_stage: Path | None = None


def _staged() -> Path:
    global _stage
    if _stage is None:
        _stage = Path(tempfile.mkdtemp(prefix="shmbus-mkdocs-"))
        atexit.register(shutil.rmtree, _stage, True)
        skip = shutil.ignore_patterns("__pycache__", "static", "*.so")
        shutil.copytree(ROOT / "shmbus", _stage / "shmbus", ignore=skip)
        shutil.copytree(ROOT / "adapters", _stage / "shmbus" / "adapters", ignore=skip)
    return _stage


@event_priority(100)  # before mkdocstrings' own on_config, which creates the handler
def on_config(config: Any) -> Any:
    handlers = config["plugins"]["mkdocstrings"].config["handlers"]
    handlers.setdefault("python", {})["paths"] = [str(_staged())]
    return config
