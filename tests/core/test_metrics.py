"""Host-wide metrics in the segment: exact under concurrent publishers in several processes, kept across exits
and kills, readable by any process, and `shmbus top` / `stats --watch` drawing them."""

from __future__ import annotations

import multiprocessing
import os
import pty
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

import shmbus
from shmbus.engines import RelayFigures
from shmbus.metrics import read_snapshot
from shmbus.segment import Segment

CTX = multiprocessing.get_context("spawn")  # a fresh interpreter: nothing inherited from the test process


def _publisher(name: str, count: int, start: multiprocessing.synchronize.Event, attached: Any = None) -> None:
    bus = shmbus.Bus(name, ring_size=1 << 20, keepalive_interval=0, create=False)
    assert bus.segment is not None  # attach (and take a slot) before the race starts
    if attached is not None:
        attached.put(os.getpid())
    start.wait(30)
    for i in range(count):
        bus.publish(f"/m/{i % 3}", i)
    bus.close()


def _publish_forever(name: str, ready: multiprocessing.synchronize.Event) -> None:
    bus = shmbus.Bus(name, ring_size=1 << 20, keepalive_interval=0, create=False)
    ready.set()
    i = 0
    while True:
        bus.publish("/forever", i)
        i += 1


def test_counters_are_exact_under_concurrent_publishers_in_several_processes(
    make_bus: Callable[..., shmbus.Bus],
) -> None:
    bus = make_bus()
    bus.publish("/m/0", "from the test")
    start = CTX.Event()
    attached = CTX.Queue()
    workers = [CTX.Process(target=_publisher, args=(bus.name, 2000, start, attached)) for _ in range(4)]
    for w in workers:
        w.start()
    assert sorted(attached.get(timeout=60) for _ in workers) == sorted(w.pid for w in workers)  # all in, then race
    start.set()
    for w in workers:
        w.join(60)
        assert w.exitcode == 0
    snap = read_snapshot(bus)
    by_pid = {p.pid: p for p in snap.processes}
    for w in workers:
        assert by_pid[w.pid].publishes == 2000, f"process {w.pid}: {by_pid[w.pid]}"
        assert not by_pid[w.pid].alive
    assert by_pid[os.getpid()].publishes == 1
    assert snap.total("publishes") == 8001 == snap.global_id


def test_totals_survive_exits_slot_reuse_and_kill_9(make_bus: Callable[..., shmbus.Bus]) -> None:
    bus = make_bus()
    bus.publish("/m/0", "creates the segment")
    start = CTX.Event()
    start.set()
    for _ in range(6):  # one after another: each exit frees its table entry and the next process reuses it
        p = CTX.Process(target=_publisher, args=(bus.name, 150, start))
        p.start()
        p.join(60)
        assert p.exitcode == 0
    ready = CTX.Event()
    victim = CTX.Process(target=_publish_forever, args=(bus.name, ready))
    victim.start()
    assert ready.wait(30)
    time.sleep(0.3)
    os.kill(victim.pid, signal.SIGKILL)  # mid-publish: the count is taken under the same lock as the append
    victim.join(10)
    for _ in range(3):  # reap the killed process and reuse slots again
        p = CTX.Process(target=_publisher, args=(bus.name, 10, start))
        p.start()
        p.join(60)
    snap = read_snapshot(bus)
    assert snap.global_id > 6 * 150 + 30
    # Nothing counted twice, nothing lost, whoever left how — except that SIGKILL may land between an append's
    # commit and its count (the next store): a process killed inside an append is one short, never one over.
    assert snap.global_id - 1 <= snap.total("publishes") <= snap.global_id
    assert sum(snap.retired.values()) > 0, "slots were reused, so some counts must have been retired"


def _churn(name: str, rounds: int) -> None:
    """Forks ``rounds`` short-lived processes one after another: each attaches (claiming the slot the previous
    one left, which retires its counters), publishes once and detaches."""
    for _ in range(rounds):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                seg = Segment.open(name, create=False)
                seg.append(b"/churn", b"", b"1")
                seg.close()
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0


def test_host_totals_never_go_down_while_slots_are_reclaimed(make_bus: Callable[..., shmbus.Bus]) -> None:
    """A reader (no lock) looping while processes exit and others reclaim their slots never sees a total dip: a
    claim moves a slot's counters to the retired totals, and a read is never half before and half after it."""
    bus = make_bus()
    bus.publish("/c", 0)
    seg = bus.segment
    churner = CTX.Process(target=_churn, args=(bus.name, 300))
    churner.start()
    last = reads = 0
    while churner.is_alive() or not reads:
        area = seg.read_metrics()
        assert area is not None
        retired, slots = area
        total = retired["publishes"] + sum(int(row["publishes"]) for row in slots)
        assert total >= last, f"host publishes went from {last} down to {total} (read {reads})"
        last, reads = total, reads + 1
    churner.join(60)
    assert churner.exitcode == 0
    snap = read_snapshot(bus)
    assert snap.total("publishes") == snap.global_id == 301


def test_forked_child_counts_in_its_own_slot(make_bus: Callable[..., shmbus.Bus]) -> None:
    bus = make_bus()
    bus.publish("/f", 0)
    pid = os.fork()
    if pid == 0:  # the child: after-fork reconnect gives it its own slot
        code = 1
        try:
            for i in range(25):
                bus.publish("/f", i)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    by_pid = {p.pid: p for p in read_snapshot(bus).processes}
    assert by_pid[pid].publishes == 25
    assert by_pid[os.getpid()].publishes == 1


def test_forked_child_starts_its_counts_at_zero(make_bus: Callable[..., shmbus.Bus]) -> None:
    """What the parent delivered or lost is counted in the parent's slot: a child's slot starts from 0 (else
    the host's totals count the parent's figures twice)."""
    bus = make_bus()
    bus.publish("/f", 0)
    bus.listener.lost = 7  # as the parent's listener counted them
    bus.metrics.deliveries = 5
    figures = RelayFigures(relaying=False, state="", backend_newest=0, lost=4)  # the engine contract's report
    bus.engines.default.relay_figures = lambda: figures  # type: ignore[method-assign]  # a bridge's counters survive fork
    bus.metrics.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            bus.publish("/f", 1)
            code = 0 if bus.metrics.flush() else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    snap = read_snapshot(bus)
    by_pid = {p.pid: p for p in snap.processes}
    assert (by_pid[pid].lost, by_pid[pid].deliveries, by_pid[pid].relay_lost, by_pid[pid].publishes) == (0, 0, 0, 1)
    assert (by_pid[os.getpid()].lost, by_pid[os.getpid()].deliveries, by_pid[os.getpid()].relay_lost) == (7, 5, 4)
    assert snap.total("lost") == 7 and snap.total("deliveries") == 5 and snap.total("relay_lost") == 4


def test_listener_position_deliveries_and_gauges(make_bus: Callable[..., shmbus.Bus]) -> None:
    bus = make_bus()

    class Source:
        def metrics_gauges(self) -> dict[str, int]:
            return {"parked": 3, "streams": 2}

    source = Source()
    bus.metrics.add_source(source)
    got: list[int] = []
    bus.subscribe("/l", lambda m: got.append(m.data))
    for i in range(10):
        bus.publish("/l", i)
    deadline = time.monotonic() + 10
    while len(got) < 10 and time.monotonic() < deadline:
        time.sleep(0.01)
    bus.metrics.deliveries += 10
    snap = read_snapshot(bus)
    me = next(p for p in snap.processes if p.pid == os.getpid())
    assert me.listener_gid == snap.global_id == 10
    assert (me.deliveries, me.parked, me.streams) == (10, 3, 2)
    assert snap.channel_last_ids == {"/l": 10}
    del source  # a gauge source held weakly goes away with its owner
    assert bus.metrics.gauges() == {"parked": 0, "streams": 0}


def test_a_segment_without_a_metrics_area_is_still_served(bus_name: str, tmp_path: object) -> None:
    """Segments made before metrics existed have no area: they attach and work; the figures say so."""
    bus = shmbus.Bus(bus_name, ring_size=1 << 20, keepalive_interval=0, create=True)
    try:
        bus.publish("/x", 1)
        seg = bus.segment
        seg.metrics_off = -1  # as such a segment reads
        seg._metrics_base = -1
        assert seg.read_metrics() is None
        snap = read_snapshot(bus)
        assert not snap.has_metrics and snap.processes == [] and snap.global_id == 1
    finally:
        bus.destroy()


def _pty_run(argv: list[str], timeout: float = 30) -> str:
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    out = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
        assert proc.wait(10) == 0, out.decode(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return out.decode(errors="replace")


@pytest.mark.parametrize("command", ["top", "stats"])
def test_top_and_stats_watch_refresh_under_a_terminal(make_bus: Callable[..., shmbus.Bus], command: str) -> None:
    bus = make_bus()
    bus.subscribe("/t", lambda m: None)
    for i in range(42):
        bus.publish("/t", i)
    argv = [sys.executable, "-m", "shmbus.cli", command, "--bus", bus.name, "--count", "2"]
    argv += ["--interval", "0.5"] if command == "top" else ["--watch", "0.5"]
    out = _pty_run(argv)
    if command == "top":
        assert out.count("shmbus top - bus") >= 2, out
        assert str(os.getpid()) in out and "PUB/s" in out
        assert "total 42" in out
    else:
        assert out.count(f"bus {bus.name}") == 2, out
        assert "\x1b[2J" in out  # redrawn, not scrolled


def test_cli_snapshot_leaves_out_the_cli_itself(make_bus: Callable[..., shmbus.Bus]) -> None:
    bus = make_bus()
    bus.publish("/c", 1)
    seg = Segment.open(bus.name, create=False)
    try:
        pids = {p.pid for p in read_snapshot(seg, exclude_self=True).processes}
        assert os.getpid() not in pids
        assert os.getpid() in {p.pid for p in read_snapshot(seg).processes}
    finally:
        seg.close()


def test_a_damaged_slot_reads_as_numbers(make_bus: Callable[..., shmbus.Bus]) -> None:
    """Garbage in a slot's time fields (NaN, infinity bits) never reaches JSON or Prometheus as NaN."""
    import json
    import math
    import struct

    from shmbus.adapters.metrics import render

    bus = make_bus()
    bus.publish("/d", 1)
    seg = bus.segment
    base = seg._metrics_base
    seg._u64[base + 1] = struct.unpack("<Q", struct.pack("<d", math.nan))[0]  # started
    seg._u64[base + 2] = struct.unpack("<Q", struct.pack("<d", math.inf))[0]  # updated
    area = seg.read_metrics()
    assert area is not None
    row = area[1][0]
    assert row["started"] == 0.0 and row["updated"] == 0.0
    json.dumps(row, allow_nan=False)
    assert "nan" not in render(bus).lower()


def _publish_big_forever(name: str, ready: multiprocessing.synchronize.Event) -> None:
    bus = shmbus.Bus(name, create=False, keepalive_interval=0)
    ready.set()
    blob = "x" * 6000  # a 64 KiB ring holds ~10: every publish overwrites the oldest record
    i = 0
    while True:
        bus.publish("/big", [i, blob])
        i += 1


def test_stats_find_the_oldest_record_on_a_full_ring_under_a_publisher(make_bus: Callable[..., shmbus.Bus]) -> None:
    """The record at the tail may be overwritten while stats() reads it: it reads on at the new tail, so the
    oldest id is never the newest + 1 (an empty ring) nor the history 0 on a full, busy ring."""
    bus = make_bus(ring_size=64 << 10)
    seg = bus.segment
    for i in range(40):
        bus.publish("/big", [i, "x" * 6000])
    assert seg.tail() > 0  # full: the ring has wrapped
    ready = CTX.Event()
    publisher = CTX.Process(target=_publish_big_forever, args=(bus.name, ready))
    publisher.start()
    try:
        assert ready.wait(30)
        start = seg.global_id()
        while seg.global_id() < start + 50:  # the publisher is running
            time.sleep(0.001)
        for i in range(2000):
            st = seg.stats()
            assert st.oldest_global_id <= st.global_id, f"stats {i}: oldest {st.oldest_global_id}, {st}"
            assert st.history_seconds > 0, f"stats {i}: {st}"
    finally:
        publisher.kill()
        publisher.join(10)


class _DescheduledReader:
    """The segment's words as ``stats()`` reads them, with the reader descheduled at its first read of the tail
    while the ring laps twice (a publisher in the same process runs meanwhile): a deterministic kill point for the
    window the test above hits once in thousands of reads."""

    def __init__(self, bus: shmbus.Bus) -> None:
        self.bus = bus
        self.real = bus.segment._u64

    def __getitem__(self, index: int) -> int:
        from shmbus.segment.layout import _Q_TAIL

        if index == _Q_TAIL and self.bus.segment._u64 is self:
            self.bus.segment._u64 = self.real  # the publisher writes the real words
            for i in range(25):
                self.bus.publish("/big", [i, "x" * 6000])
        return int(self.real[index])

    def __setitem__(self, index: int, value: int) -> None:
        self.real[index] = value


def _read_descheduled(make_bus: Callable[..., shmbus.Bus], read: Callable[[Segment], Any]) -> tuple[int, Any, Segment]:
    """``read(segment)`` on a full ring under the kill point above: (the newest id before, what it read, segment)."""
    bus = make_bus(ring_size=64 << 10)
    seg = bus.segment
    for i in range(40):
        bus.publish("/big", [i, "x" * 6000])
    before = seg.global_id()
    seg._u64 = _DescheduledReader(bus)  # type: ignore[assignment]
    try:
        got = read(seg)
    finally:
        seg._u64 = seg._u64.real if isinstance(seg._u64, _DescheduledReader) else seg._u64
    assert seg.global_id() == before + 25  # the ring lapped during the read
    return before, got, seg


def test_stats_of_a_reader_descheduled_while_the_ring_laps(make_bus: Callable[..., shmbus.Bus]) -> None:
    """Positions read one at a time while the ring laps: the stats still name an oldest record at or below the
    newest id (reading the head before the tail gave head < tail, an "empty" full ring, oldest = newest + 1)."""
    before, st, _ = _read_descheduled(make_bus, Segment.stats)
    assert st.oldest_global_id <= st.global_id, st
    assert st.oldest_global_id > before, st  # the oldest after the laps, not a record read before them
    assert 0 <= st.ring_used <= st.ring_size, st


def test_the_oldest_id_of_a_reader_descheduled_while_the_ring_laps(make_bus: Callable[..., shmbus.Bus]) -> None:
    """``Segment.oldest_global_id`` (the backlog's gap check) under the same kill point: a record the ring holds,
    not the newest id + 1 that says the ring is empty."""
    before, oldest, seg = _read_descheduled(make_bus, Segment.oldest_global_id)
    assert before < oldest <= seg.global_id()


def test_a_process_attached_twice_is_one_process(make_bus: Callable[..., shmbus.Bus]) -> None:
    """Two Bus objects of one name in one process, or a Bus closed and attached again through another entry of
    the process table: one process in the figures (no duplicate {bus,pid} series), counters added up, and the
    gauges of a detached slot (its last flush) no longer counted."""
    from prometheus_client.parser import text_string_to_metric_families

    from shmbus.adapters.metrics import render

    class Source:
        def __init__(self, parked: int) -> None:
            self.parked = parked

        def metrics_gauges(self) -> dict[str, int]:
            return {"parked": self.parked}

    first, second = make_bus(), make_bus()
    sources = [Source(3), Source(2)]
    first.metrics.add_source(sources[0])
    second.metrics.add_source(sources[1])
    first.publish("/p", 1)
    second.publish("/p", 2)
    first.metrics.flush()  # (read_snapshot flushes the bus it is given)
    snap = read_snapshot(second)
    mine = [p for p in snap.processes if p.pid == os.getpid()]
    assert len(mine) == 1 and mine[0].publishes == 2 and mine[0].parked == 5 and mine[0].alive

    helper = Segment.open(first.name, create=False)  # an entry below third's: third attaches there again
    third = make_bus()
    sources.append(Source(4))
    third.metrics.add_source(sources[2])
    third.publish("/p", 3)
    third.close()  # its slot keeps its last figures (parked 4) and this pid
    helper.close()
    third.on()
    sources[2].parked = 1
    third.publish("/p", 4)  # attaches again, through helper's entry
    first.metrics.flush()
    snap = read_snapshot(third)
    mine = [p for p in snap.processes if p.pid == os.getpid()]
    assert len(mine) == 1, mine
    assert mine[0].publishes == 4 and mine[0].parked == 3 + 2 + 1  # not the closed slot's 4
    text = render(third)
    series = [
        (s.name, s.labels.get("pid"))
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if "pid" in s.labels
    ]
    assert len(series) == len(set(series)), text
    parked = [
        s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "shmbus_parked_polls" and s.labels["pid"] == str(os.getpid())
    ]
    assert parked == [6]


def test_a_damaged_pid_word_is_a_dead_process(make_bus: Callable[..., shmbus.Bus]) -> None:
    """Pids no process can have (beyond what os.kill takes) in a metrics slot and in the process table: readers
    (figures, Prometheus, `shmbus top`) treat them as dead instead of crashing."""
    from shmbus.adapters.metrics import render
    from shmbus.segment.layout import _OFF_PROCS, _PROC_SIZE, MAX_PROCS, METRIC_SLOT, METRICS_HEADER

    bus = make_bus()
    bus.publish("/d", 1)
    seg = bus.segment
    for index, pid in ((MAX_PROCS - 1, 1 << 40), (MAX_PROCS - 2, 1 << 31), (MAX_PROCS - 3, (1 << 32) - 1)):
        seg._u64[(seg.metrics_off + METRICS_HEADER + index * METRIC_SLOT) >> 3] = pid
        seg._u64[(seg.metrics_off + METRICS_HEADER + index * METRIC_SLOT + 8 * 3) >> 3] = 5  # publishes
        if pid < 1 << 32:
            seg._u32[(_OFF_PROCS + index * _PROC_SIZE) >> 2] = pid
    snap = read_snapshot(bus)
    damaged = {p.pid: p for p in snap.processes if p.pid > 1 << 30}
    assert set(damaged) == {1 << 40, 1 << 31, (1 << 32) - 1}
    assert not any(p.alive for p in damaged.values())
    assert snap.total("publishes") == 1 + 15
    assert os.getpid() in seg.stats().processes
    assert f'pid="{1 << 40}"' in render(bus)
    out = _pty_run([sys.executable, "-m", "shmbus.cli", "top", "--bus", bus.name, "--count", "1"])
    assert "shmbus top - bus" in out and "Traceback" not in out, out


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["stats", "--watch", "-1"], "positive number of seconds"),
        (["stats", "--watch", "nan"], "positive number of seconds"),
        (["stats", "--watch", "inf"], "positive number of seconds"),
        (["stats", "--watch", "soon"], "not a number of seconds"),
        (["stats", "--watch", "1", "--count", "-2"], "0 (no limit) or more"),
        (["top", "--count", "-1"], "0 (no limit) or more"),
        (["top", "--interval", "nan"], "positive number of seconds"),
    ],
)
def test_cli_refuses_bad_intervals_and_counts(
    make_bus: Callable[..., shmbus.Bus], capsys: pytest.CaptureFixture[str], argv: list[str], why: str
) -> None:
    """A clear usage error (exit 2, argparse's), never a traceback or a loop that never sleeps."""
    from shmbus.cli import main

    bus = make_bus()
    bus.publish("/c", 1)
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--bus", bus.name])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert why in err and "Traceback" not in err, err


def test_a_process_beyond_the_process_table_still_counts_in_the_host_totals(
    make_bus: Callable[..., shmbus.Bus],
) -> None:
    """With every process-table entry taken, a process has no slot of its own: its publishes are still in the
    host totals (not per process)."""
    from shmbus.segment.layout import _OFF_PROCS, _PROC_SIZE, MAX_PROCS

    bus = make_bus()
    bus.publish("/full", 0)
    seg = bus.segment
    taken = []
    for i in range(MAX_PROCS):  # fill the table with a live pid (ours), so no reap frees an entry
        word = (_OFF_PROCS + i * _PROC_SIZE) >> 2
        if not seg._u32[word]:
            seg._u32[word] = os.getpid()
            taken.append(word)
    late = Segment.open(bus.name, create=False)
    try:
        assert late._proc_index == -1 and late._metrics_base == -1  # no slot
        for i in range(5):
            late.append(b"/full", b"", b"%d" % i)
        snap = read_snapshot(bus)
        assert snap.global_id == 6
        assert snap.total("publishes") == 6
        assert sum(p.publishes for p in snap.processes) == 1  # the 5 are not per process
    finally:
        late.close()
        for word in taken:
            seg._u32[word] = 0
