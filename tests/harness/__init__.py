"""Shared test harness for shmbus: real services, real processes, loud skips.

Tests import it as ``tests.harness`` (``tests/`` is a package; pytest puts the repo root on ``sys.path``).

A missing service or tool normally *skips* the test that needs it, so a developer without
Chromium can still run the rest.  Under ``SHMBUS_REQUIRE_ALL=1`` (set by ``scripts/test`` when
``CI`` is set) every such skip becomes a failure, so CI cannot go green by skipping.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import NoReturn

import pytest

__all__ = [
    "REPO_ROOT",
    "TESTS_DIR",
    "import_file",
    "message_bus_gem",
    "require",
    "require_all",
    "require_binary",
    "require_module",
    "skip_or_fail",
]

TESTS_DIR = Path(__file__).resolve().parent.parent
REPO_ROOT = TESTS_DIR.parent

_FALSE = {"", "0", "false", "no", "off"}


def require_all() -> bool:
    """True when missing services must fail tests instead of skipping them (read at call time)."""
    return os.environ.get("SHMBUS_REQUIRE_ALL", "").strip().lower() not in _FALSE


def skip_or_fail(reason: str) -> NoReturn:
    """Skip the current test because ``reason`` is missing, or fail it under SHMBUS_REQUIRE_ALL.

    ``reason`` should say what is missing and how to get it, e.g.
    ``"chromium not found at /usr/bin/chromium (apt-get install chromium, or run scripts/test)"``.
    """
    __tracebackhide__ = True  # report the caller's line, not this helper's
    if require_all():
        pytest.fail(f"required but missing: {reason} [SHMBUS_REQUIRE_ALL=1 turns this skip into a failure]")
    pytest.skip(reason)


def require(condition_or_reason: bool | str | None, reason: str | None = None) -> None:
    """Check a precondition; skip (or fail under SHMBUS_REQUIRE_ALL) when it does not hold.

    - ``require(ok, "why it matters / how to get it")``: a bool and a reason;
    - ``require(missing)``: ``None`` means nothing is missing, a string is the reason
      something is missing (handy with checker functions that return ``str | None``).
    """
    __tracebackhide__ = True  # report the caller's line, not this helper's
    if condition_or_reason is None or condition_or_reason is True:
        return
    if isinstance(condition_or_reason, str):
        skip_or_fail(condition_or_reason if reason is None else f"{reason}: {condition_or_reason}")
    if not condition_or_reason:
        skip_or_fail(reason or "a test precondition does not hold (no reason given)")


def require_binary(name: str, how: str) -> str:
    """Return the path of executable ``name`` on PATH, else skip_or_fail saying ``how`` to get it."""
    __tracebackhide__ = True  # report the caller's line, not this helper's
    path = shutil.which(name)
    if path is None:
        skip_or_fail(f"executable {name!r} not found on PATH ({how})")
    return path


def import_file(path: Path, name: str | None = None) -> ModuleType:
    """Import the module at ``path`` (a perf/ or examples/ script: not a package) without touching ``sys.path``.

    It is registered in ``sys.modules`` under ``name`` (default: its file name) while it runs, as an import would.
    """
    name = name or path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def require_module(name: str, how: str | None = None) -> ModuleType:
    """Import and return module ``name``, else skip_or_fail saying how to install it."""
    __tracebackhide__ = True  # report the caller's line, not this helper's
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        hint = how or "pip install -e '.[all,test]', or run scripts/test"
        skip_or_fail(f"Python module {name!r} cannot be imported: {exc} ({hint})")


def message_bus_gem(checked_from_python: str) -> Path:
    """The message_bus gem's checkout named by ``MESSAGE_BUS_GEM_DIR``, runnable by this machine's Ruby (with the
    pg and rack libraries), else a loud skip that names ``checked_from_python``, the tests that cover the same
    format without Ruby.

    Never a failure, even under SHMBUS_REQUIRE_ALL: the gem is on no registry this project installs from (only
    Ruby itself is, from Debian: ``apt-get install ruby ruby-pg ruby-rack``), so a fresh machine cannot have it.
    """
    gem_dir = os.environ.get("MESSAGE_BUS_GEM_DIR", "")
    why = ""
    if shutil.which("ruby") is None:
        why = "ruby is not installed (Debian: ruby ruby-pg ruby-rack)"
    elif not gem_dir or not (Path(gem_dir) / "lib" / "message_bus.rb").is_file():
        why = "MESSAGE_BUS_GEM_DIR does not name a checkout of the message_bus gem (its lib/ is loaded from there)"
    elif subprocess.run(["ruby", "-e", "require 'pg'; require 'rack'"], capture_output=True).returncode:
        why = "Ruby's pg or rack library is missing (Debian: ruby-pg ruby-rack)"
    if why:
        pytest.skip(
            f"LOUD SKIP: the message_bus gem's own code cannot run here: {why}. Covered without Ruby by "
            f"{checked_from_python}"
        )
    return Path(gem_dir)
