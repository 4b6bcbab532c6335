"""Every shell block of README.md and docs/*.md runs as written, or says why it is not run.

A fenced ``sh`` block runs from the repository root with ``.venv/bin`` first on PATH (the README's setup) and must
exit 0. A block preceded by ``<!-- doc-blocks: not run (REASON) -->`` is skipped, and must give a reason
(a server that runs until stopped, an install from PyPI, the whole test suite). A ``python`` block preceded by
``<!-- doc-blocks: run -->`` runs too. Bus names the docs use (``myapp``, ``demo``) are replaced by one private
to the test, so runs in parallel never meet, and the bus is destroyed afterwards.

What a run block prints is checked when a ``text`` block marked ``<!-- doc-blocks: output -->`` follows it (only
blank lines between): the output must match it line for line, ``...`` standing for any text (as in doctest). A run
block that calls ``print`` must have one, or printing it would prove nothing: the home page's first snippet printed
nothing in 7 runs of 10 (it closed the bus before its listener delivered) and still passed.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import signal
import subprocess
import sys

import pytest

from tests.harness import REPO_ROOT
from tests.harness.shm import files_for_bus

DOCS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w+)\s*$")
MARK = re.compile(r"^<!-- doc-blocks: (not run \((?P<reason>[^)]+)\)|run|output) -->\s*$")
BUS_NAMES = ("myapp", "demo")


Block = tuple[str, int, str, str, "str | None"]


def blocks() -> list[Block]:
    """``(file, line, language, code, mark)`` for every fenced block of the docs."""
    out = []
    for path in DOCS:
        lines = path.read_text().splitlines()
        i = 0
        while i < len(lines):
            m = FENCE.match(lines[i])
            if not m:
                i += 1
                continue
            lang, start = m.group(1), i
            mark = MARK.match(lines[i - 1]) if i else None
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            out.append(
                (
                    str(path.relative_to(REPO_ROOT)),
                    start + 1,
                    lang,
                    "\n".join(lines[i + 1 : j]),
                    mark.group(1) if mark else None,
                )
            )
            i = j + 1
    return out


def expected_outputs(all_blocks: list[Block]) -> dict[tuple[str, int], str]:
    """``{(file, line of a block): the output block that follows it}``."""
    out: dict[tuple[str, int], str] = {}
    for before, block in itertools.pairwise(all_blocks):
        if block[4] == "output":
            assert block[0] == before[0] and block[2] == "text", f"{block[0]}:{block[1]}: an output block is text"
            out[(before[0], before[1])] = block[3]
    return out


def output_matches(expected: str, out: str) -> bool:
    """Line by line, trailing blanks ignored; ``...`` matches any text, across lines too."""
    pattern = ".*?".join(re.escape(part) for part in expected.strip().split("..."))
    got = "\n".join(line.rstrip() for line in out.strip().splitlines())
    return re.fullmatch(pattern, got, re.DOTALL) is not None


ALL = blocks()
SHELL = [b for b in ALL if b[2] in ("sh", "bash", "shell")]
RUN = [b for b in ALL if (b in SHELL and b[4] in (None, "run")) or (b[2] == "python" and b[4] == "run")]
OUTPUTS = expected_outputs(ALL)


def test_the_docs_have_shell_blocks_and_each_is_run_or_says_why_not() -> None:
    assert len(SHELL) >= 5
    for file, line, _lang, _code, mark in SHELL:
        if mark is not None:
            assert mark == "run" or re.match(r"not run \(.{10,}\)", mark), f"{file}:{line}: give a reason"
    assert len(RUN) >= 2, "no doc block is run at all"


def test_a_run_block_that_prints_has_its_output_written_under_it() -> None:
    run = {(b[0], b[1]) for b in RUN}
    assert set(OUTPUTS) <= run, f"output blocks under blocks that are not run: {sorted(set(OUTPUTS) - run)}"
    unchecked = [
        f"{f}:{n}" for f, n, lang, code, _ in RUN if lang == "python" and "print(" in code and (f, n) not in OUTPUTS
    ]
    assert not unchecked, f"these blocks print, but what they print is not written under them: {unchecked}"
    first = next(b for b in ALL if b[0] == "docs/index.md")
    assert (first[0], first[1]) in OUTPUTS, "the home page's first snippet: what it prints is written under it"


@pytest.mark.parametrize(
    ("expected", "out", "ok"),
    [
        ("/chat {'text': 'hello'}", "/chat {'text': 'hello'}\n", True),
        ("/chat {'text': 'hello'}", "", False),  # the home page's snippet, when the bus closed first
        ("id ... of ...", "id 3 of 4", True),
        ("a\n...\nz", "a\nb\nc\nz", True),
        ("a", "a\nb", False),
    ],
)
def test_output_matching(expected: str, out: str, ok: bool) -> None:
    assert output_matches(expected, out) is ok


@pytest.mark.parametrize("block", RUN, ids=[f"{b[0]}:{b[1]}" for b in RUN])
def test_a_doc_block_runs_as_written(block: tuple[str, int, str, str, str | None], bus_name: str) -> None:
    file, line, lang, code, _ = block
    expected = OUTPUTS.get((file, line))
    for name in BUS_NAMES:
        code = re.sub(rf"\b{name}\b", bus_name, code)
        expected = expected and re.sub(rf"\b{name}\b", bus_name, expected)
    venv_bin = REPO_ROOT / ".venv" / "bin"
    env = dict(os.environ, PATH=f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}", SHMBUS_NAME=bus_name)
    argv = [sys.executable, "-c", code] if lang == "python" else ["bash", "-euo", "pipefail", "-c", code]
    proc = subprocess.Popen(
        argv,
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, f"{file}:{line} failed ({proc.returncode}):\n{code}\n{out}"
        if expected is not None:
            assert output_matches(expected, out), f"{file}:{line} printed:\n{out}\ninstead of:\n{expected}"
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{file}:{line} did not finish in 120 s (mark it 'not run' with a reason?)") from None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever the block started goes with it
        proc.wait()
        for leftover in files_for_bus(bus_name):
            os.unlink(f"/dev/shm/{leftover}")
