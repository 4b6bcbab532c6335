"""Stopping a streaming query between micro-batches, so that a normal stop is not reported as a failure.

``query.stop()`` interrupts whatever the query is doing. When that is a micro-batch writing to a DataSource V2
sink (ours, Kafka's, ``noop``), Spark aborts the write and logs two ERROR lines ("... is aborting", "...
aborted") although nothing went wrong. Spark has no graceful stop for Structured Streaming, so
:func:`stop_gracefully` builds one with the shmbus source's help:

1. it drops a *hold token* into a directory named after the driver JVM's pid;
2. every shmbus stream source planned by that JVM (its planner process is a child of the JVM, so it finds the
   directory through ``os.getppid()``) then reports no new data, so Spark starts no new batch with rows;
3. once the query is between triggers, the batch that was running when the token appeared has committed, and
   ``query.stop()`` interrupts nothing but an idle poll;
4. the token is removed and the sources see their data again.

The hold is per driver, not per query: other shmbus stream queries of the same application see no new data
for as long as the stop waits (at most one micro-batch; they lose nothing, their next batch is just later).
Queries started with ``Trigger.AvailableNow`` ignore holds: for them "no new data" would mean "finished".
A token carries its own deadline, so a driver that dies while stopping cannot hold sources for ever.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

__all__ = ["is_held", "stop_gracefully"]

log = logging.getLogger(__name__)

_POLL = 0.01


def _hold_dir(jvm_pid: int) -> Path:
    return Path(tempfile.gettempdir()) / f"shmbus-spark-hold-{jvm_pid}"


def is_held(jvm_pid: int | None = None, now: float | None = None) -> bool:
    """True when a :func:`stop_gracefully` of this driver is waiting (called by the source's planner).

    ``jvm_pid`` defaults to the parent process: Spark starts the planner process of a Python stream source
    directly from the driver JVM. Expired tokens (their deadline is in their name) are ignored.
    """
    hold = _hold_dir(os.getppid() if jvm_pid is None else jvm_pid)
    try:
        names = os.listdir(hold)
    except FileNotFoundError:
        return False
    now = time.time() if now is None else now
    for name in names:
        deadline, _, _ = name.partition("-")
        try:
            if float(deadline) > now:
                return True
        except ValueError:
            continue
    return False


def _jvm_pid() -> int | None:
    """The driver JVM's pid, asked of the JVM itself (None without a py4j gateway, e.g. Spark Connect)."""
    from pyspark import SparkContext

    jvm = SparkContext._jvm  # the gateway's view of the JVM: no public API asks the JVM for its pid
    if jvm is None:
        return None
    return int(jvm.java.lang.ProcessHandle.current().pid())


def stop_gracefully(query: Any, timeout: float = 30.0) -> bool:
    """Stop ``query`` between micro-batches; True if it stopped so, False if ``timeout`` ran out first.

    On ``False`` the query is stopped anyway (``query.stop()``), possibly in the middle of a batch: Spark then
    logs its abort ERROR lines and the sink's warning says what happened to the batch's rows. Queries that do
    not read from shmbus are not held and stop cleanly only if they happen to be idle within ``timeout``.
    """
    if not query.isActive:
        return True
    pid = _jvm_pid()
    token: Path | None = None
    if pid is not None:
        hold = _hold_dir(pid)
        hold.mkdir(exist_ok=True)
        token = hold / f"{time.time() + timeout + 5:.3f}-{uuid.uuid4().hex}"
        token.touch()
    try:
        return _stop_when_idle(query, time.monotonic() + timeout)
    finally:
        if token is not None:
            token.unlink(missing_ok=True)
            try:
                token.parent.rmdir()  # only when no other stop is waiting
            except OSError:
                pass


def _stop_when_idle(query: Any, deadline: float) -> bool:
    # Two idle readings in a row: the first may predate the trigger that was about to plan the held batch.
    idle_seen = 0
    while query.isActive and time.monotonic() < deadline:
        if query.status.get("isTriggerActive"):
            idle_seen = 0
        else:
            idle_seen += 1
            if idle_seen >= 2:
                query.stop()
                return True
        time.sleep(_POLL)
    if not query.isActive:
        return True
    log.warning("shmbus spark: query %s was still running a batch after the timeout; stopping it anyway", query.id)
    query.stop()
    return False
