"""``shmbus listen``: what it prints, and that it ends quietly on --count, --timeout, Ctrl-C and a closed pipe."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.harness.procs import blocked_signals

from .servers import Target

pytestmark = pytest.mark.slow
NewTarget = Callable[..., Target]


def ctrl_c_as_at_a_terminal() -> None:
    """In the child before exec: SIGINT back to its default. A suite started as a background job of a
    non-interactive shell (``nohup scripts/test &``) inherits SIGINT *ignored*, which Python then keeps ignoring,
    and every Ctrl-C test would hang (load runs 2-4 did)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def listen(procs: Any, *args: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-X", "faulthandler", "-m", "shmbus", "listen", *args]
    return procs.spawn(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=ctrl_c_as_at_a_terminal
    )


def ended(proc: subprocess.Popen[str], timeout: float = 60) -> tuple[str, str]:
    """Its output once it exits; a process still alive after ``timeout`` fails the test with its threads' stacks
    (faulthandler prints them on SIGABRT), so a hang says where it hangs."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        _, err = proc.communicate(timeout=30)
        pytest.fail(f"listen still running {timeout} s later; its stacks:\n{err}")


@pytest.fixture
def target(new_target: NewTarget) -> Target:
    return new_target("lean")


def test_listen_prints_the_backlog_and_live_messages_as_json(procs: Any, target: Target) -> None:
    ids = [target.publish("/a", {"n": 1}), target.publish("/a", "two")]
    proc = listen(procs, target.url, "/a=0", "/b", "--json", "--count", "3", "--timeout", "30")
    lines = [proc.stdout.readline(), proc.stdout.readline()]  # type: ignore[union-attr]
    later = target.publish("/b", [3])
    lines.append(proc.stdout.readline())  # type: ignore[union-attr]
    assert proc.wait(timeout=30) == 0, proc.stderr.read()  # type: ignore[union-attr]
    got = [json.loads(x) for x in lines]
    assert [(m["channel"], m["message_id"], m["data"]) for m in got] == [
        ("/a", ids[0], {"n": 1}),
        ("/a", ids[1], "two"),
        ("/b", later, [3]),
    ]


def test_listen_ends_at_its_timeout(procs: Any, target: Target) -> None:
    proc = listen(procs, target.url, "/quiet", "--timeout", "1")
    out, err = ended(proc)  # without its --timeout, listen on a quiet channel never ends
    assert proc.returncode == 0 and out == "" and err == ""


def test_listen_ends_quietly_on_ctrl_c(procs: Any, target: Target) -> None:
    target.publish("/c", "first")
    proc = listen(procs, target.url, "/c=0")
    assert "/c #1" in proc.stdout.readline()  # type: ignore[union-attr]
    proc.send_signal(signal.SIGINT)
    _, err = ended(proc)
    assert proc.returncode == 0, err
    assert err == ""


def test_listens_threads_leave_ctrl_c_to_the_main_thread(procs: Any, target: Target) -> None:
    """Linux gives a signal sent to the process to any thread not blocking it, and CPython acts on it only in the
    main thread: a SIGINT landing in the loop or stdout thread left ``listen`` blocked in its queue for good. Every
    thread but the main one blocks it, so the main thread is the one that gets it."""
    target.publish("/s", "first")
    proc = listen(procs, target.url, "/s=0")
    assert "first" in proc.stdout.readline()  # type: ignore[union-attr]
    others = [int(t) for t in os.listdir(f"/proc/{proc.pid}/task") if int(t) != proc.pid]
    assert len(others) >= 2, others  # the client's loop thread and the stdout watcher at least
    for tid in others:
        blocked = blocked_signals(proc.pid, tid)
        assert {signal.SIGINT, signal.SIGTERM} <= blocked, (tid, sorted(blocked))
    assert signal.SIGINT not in blocked_signals(proc.pid, proc.pid)
    proc.send_signal(signal.SIGINT)
    _, err = ended(proc)
    assert proc.returncode == 0, err


def test_listen_ends_quietly_on_a_closed_pipe(procs: Any, target: Target) -> None:
    target.publish("/p", "first")
    proc = listen(procs, target.url, "/p=0")
    assert "first" in proc.stdout.readline()  # type: ignore[union-attr]
    proc.stdout.close()  # type: ignore[union-attr]  # like `| head -1`
    for i in range(20):
        target.publish("/p", f"more {i}")
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    assert proc.wait(timeout=60) == 0
    err = proc.stderr.read()  # type: ignore[union-attr]
    assert "Traceback" not in err and "Error" not in err, err


def test_listen_piped_to_head_ends_when_head_does_on_a_quiet_channel(
    procs: Any, target: Target, tmp_path: Path
) -> None:
    """Issue 34: ``shmbus listen ... | head -2`` lingered until the next message after ``head`` exited (a write
    was its only way to learn the pipe had closed). The channel stays quiet after the two lines, so only the
    watch on stdout can end it; the deadline is generous (a long poll is 25 s), not a measure of speed."""
    target.publish("/h", "one")
    target.publish("/h", "two")
    script = (
        "set -o pipefail; "
        f"{shlex.quote(sys.executable)} -m shmbus listen {shlex.quote(target.url)} /h=0 2>listen.err | head -2; "
        "echo listen-exit=$?; cat listen.err"
    )
    proc = procs.spawn(["bash", "-c", script], cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    try:
        out, _ = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        raise AssertionError("shmbus listen was still running 90 s after head -2 exited") from None
    lines = out.splitlines()
    assert ["one" in lines[0], "two" in lines[1]] == [True, True], out
    assert lines[2] == "listen-exit=0" and len(lines) == 3, out  # ends quietly: no traceback, no error


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["chat"], "starts with '/'"),
        (["/chat", "--count", "-1"], "0 (no limit) or more"),
        (["/chat", "--timeout", "nan"], "positive number of seconds"),
    ],
)
def test_listen_refuses_bad_arguments(procs: Any, args: list[str], says: str) -> None:
    proc = listen(procs, "http://127.0.0.1:9", *args)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2 and says in err
