"""Real processes on one segment: forked workers, a separately started process, SIGKILLed writers, and the
DistributedCache across workers. No mocks of the segment."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest

import shmbus
from shmbus import Bus
from tests.harness.wait import wait_for

FORK = mp.get_context("fork")


def _worker(name: str, index: int, workers: int, per_worker: int, go: Any, ready: Any, out: Any) -> None:
    """A forked worker: subscribe, publish its share, wait until it has seen everyone's, report."""
    bus = Bus(name, keepalive_interval=0, create=True)
    got: list[tuple[str, int, Any]] = []
    bus.subscribe("/shared", lambda m: got.append((m.channel, m.message_id, m.data)))
    bus.subscribe("/w/*", lambda m: got.append((m.channel, m.message_id, m.data)), pattern=True)
    ready.put(index)
    go.wait(30)
    for i in range(per_worker):
        bus.publish("/shared", [index, i])
        bus.publish(f"/w/{index}", [index, i])
    deadline = time.monotonic() + 60
    while len(got) < 2 * workers * per_worker and time.monotonic() < deadline:
        time.sleep(0.01)
    out.put((index, got))
    bus.close()


def test_forked_workers_each_receive_every_message_once_in_order(make_bus: Any, bus_name: str) -> None:
    parent = make_bus(ring_size=8 << 20)
    seen_by_parent: list[int] = []
    parent.subscribe("/shared", lambda m: seen_by_parent.append(m.message_id))  # listener running at fork
    workers, per_worker = 4, 150
    go, ready, out = FORK.Event(), FORK.Queue(), FORK.Queue()
    procs = [
        FORK.Process(target=_worker, args=(bus_name, i, workers, per_worker, go, ready, out)) for i in range(workers)
    ]
    for p in procs:
        p.start()
    try:
        for _ in procs:
            ready.get(timeout=30)
        go.set()
        results = dict(out.get(timeout=90) for _ in procs)
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    total = workers * per_worker
    for index, got in results.items():
        shared = [(mid, tuple(data)) for ch, mid, data in got if ch == "/shared"]
        assert [mid for mid, _ in shared] == list(range(1, total + 1)), f"worker {index}: shared ids"
        assert len(set(d for _, d in shared)) == total
        for w in range(workers):
            mine = [(mid, data) for ch, mid, data in got if ch == f"/w/{w}"]
            assert mine == [(i + 1, [w, i]) for i in range(per_worker)], f"worker {index} on /w/{w}"
    wait_for(lambda: len(seen_by_parent) == total, what="parent saw everything")
    assert seen_by_parent == list(range(1, total + 1))


CHILD = textwrap.dedent("""
    import json, sys, time
    import shmbus
    bus = shmbus.Bus(sys.argv[1], keepalive_interval=0, create=True)
    def echo(m):
        bus.publish("/from-child", {"echo": m.data, "id": m.message_id})
    bus.subscribe("/to-child", echo)
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() == "quit":
            break
    bus.close()
""")


def test_separately_started_process_attaches_by_name_both_directions(make_bus: Any, bus_name: str) -> None:
    bus = make_bus()
    echoes: list[Any] = []
    bus.subscribe("/from-child", lambda m: echoes.append(m.data))
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, bus_name], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        for i in range(20):
            bus.publish("/to-child", i)
        wait_for(lambda: len(echoes) == 20, what="20 echoes from the child")
        assert echoes == [{"echo": i, "id": i + 1} for i in range(20)]
        assert bus.last_id("/from-child") == 20
        assert child.pid in bus.stats().processes
    finally:
        if child.stdin:
            child.stdin.write("quit\n")
            child.stdin.close()
        child.wait(10)
    assert child.returncode == 0


def _publish_forever(name: str, started: Any, ack_fd: int = -1) -> None:
    """Publish round-robin on three channels until killed; report each acknowledged (channel, id) on ``ack_fd``."""
    bus = Bus(name, keepalive_interval=0, max_backlog_size=1_000_000, create=True)
    channels = ["/k/a", "/k/b", "/k/c"]
    counters = {ch: bus.last_id(ch) for ch in channels}  # so that data n == message_id - 1
    started.set()
    i = 0
    while True:
        ch = channels[i % 3]
        mid = bus.publish(ch, {"n": counters[ch], "pad": "p" * (i % 50)})
        if ack_fd >= 0:
            os.write(ack_fd, b"%d %d\n" % (i % 3, mid))
        counters[ch] += 1
        i += 1


def _check_consistent(bus: Bus, after: dict[str, int] | None = None) -> dict[str, int]:
    """Ids contiguous, data matching ids, global ids contiguous; ``after`` limits the per-channel read."""
    lasts = {}
    for ch in ("/k/a", "/k/b", "/k/c"):
        start = (after or {}).get(ch, 0)
        bl = bus.backlog(ch, start)
        ids = [m.message_id for m in bl]
        first = start + 1 if bus.stats().overwritten == 0 else max(bl.first_available, start + 1)
        assert not bl.gap or bus.stats().overwritten, f"{ch}: a gap although nothing was overwritten"
        assert ids == list(range(first, bl.last_id + 1)), f"{ch}: ids not contiguous from {first}"
        assert all(m.data["n"] == m.message_id - 1 for m in bl), f"{ch}: data does not match its id"
        lasts[ch] = bl.last_id
    gids = [m.global_id for m in bus.segment.global_backlog(max(bus.segment.global_id() - 5000, 0))]
    assert gids == list(range(gids[0], gids[0] + len(gids))), "global ids not contiguous"
    assert bus.segment.global_id() == gids[-1]
    return lasts


@pytest.mark.slow
def test_sigkill_of_publishers_at_random_points_leaves_the_bus_consistent(make_bus: Any, bus_name: str) -> None:
    """120 publishers SIGKILLed at random moments: every acknowledged message stays, with its id; no id is issued
    twice; the next publish continues the ids and reaches a live subscriber."""
    bus = make_bus(ring_size=64 << 20, max_backlog_size=1_000_000)
    live: list[int] = []
    bus.subscribe("/k/live", lambda m: live.append(m.data))
    rng = random.Random(1234)
    channels = ["/k/a", "/k/b", "/k/c"]
    lasts = {ch: 0 for ch in channels}
    kills = 120
    for round_no in range(kills):
        started = FORK.Event()
        r, w = os.pipe()
        p = FORK.Process(target=_publish_forever, args=(bus_name, started, w))
        p.start()
        os.close(w)
        acked: dict[str, list[int]] = {ch: [] for ch in channels}
        buf = b""
        assert started.wait(30)
        deadline = time.monotonic() + rng.uniform(0.002, 0.03)
        os.set_blocking(r, False)
        while time.monotonic() < deadline:
            try:
                buf += os.read(r, 1 << 16)
            except BlockingIOError:
                time.sleep(0.001)
        os.kill(p.pid, signal.SIGKILL)
        p.join(10)
        os.set_blocking(r, True)
        while chunk := os.read(r, 1 << 16):
            buf += chunk
        os.close(r)
        for line in buf.split(b"\n"):
            if line:
                idx, mid = line.split()
                acked[channels[int(idx)]].append(int(mid))
        before = dict(lasts)
        lasts = _check_consistent(bus, before)
        for ch in channels:
            ids = acked[ch]
            assert ids == list(range(before[ch] + 1, before[ch] + 1 + len(ids))), f"{ch}: acknowledged ids"
            assert not ids or lasts[ch] >= ids[-1], f"{ch}: acknowledged id {ids[-1]} lost (last_id {lasts[ch]})"
            assert lasts[ch] <= (ids[-1] if ids else before[ch]) + 1, f"{ch}: more stored than was published"
        # the next publish from another process succeeds, continues the ids and reaches a live subscriber
        assert bus.publish("/k/a", {"n": lasts["/k/a"]}) == lasts["/k/a"] + 1
        lasts["/k/a"] += 1
        bus.publish("/k/live", round_no)
        wait_for(lambda round_no=round_no: round_no in live, what=f"live delivery after kill {round_no}")
    _check_consistent(bus)
    assert live == list(range(kills))
    assert bus.stats().repairs >= 10, "kills rarely landed inside the critical section: the repair path was not run"


def _cache_worker(name: str, role: str, cmds: Any, out: Any) -> None:
    bus = Bus(name, keepalive_interval=0, create=True)
    cache = shmbus.DistributedCache("settings", bus=bus, snapshot_every=10, history=25)
    out.put(("ready", role))
    while True:
        cmd = cmds.get(timeout=60)
        if cmd[0] == "set":
            cache[cmd[1]] = cmd[2]
        elif cmd[0] == "delete":
            del cache[cmd[1]]
        elif cmd[0] == "clear":
            cache.clear()
        elif cmd[0] == "dump":
            out.put(("dump", role, dict(cache)))
        elif cmd[0] == "quit":
            break
    bus.close()


def test_distributed_cache_across_three_workers_including_a_late_one(make_bus: Any, bus_name: str) -> None:
    make_bus(ring_size=4 << 20)  # create the segment (and destroy it at the end)
    out = FORK.Queue()
    queues = {r: FORK.Queue() for r in ("a", "b", "late")}
    procs = {r: FORK.Process(target=_cache_worker, args=(bus_name, r, queues[r], out)) for r in ("a", "b")}
    for p in procs.values():
        p.start()
    try:
        assert {out.get(timeout=30)[1] for _ in range(2)} == {"a", "b"}

        def dumps(roles: tuple[str, ...]) -> dict[str, dict[str, Any]]:
            for r in roles:
                queues[r].put(("dump",))
            got = [out.get(timeout=30) for _ in roles]
            return {g[1]: g[2] for g in got}

        def converge(roles: tuple[str, ...], expected: dict[str, Any]) -> None:
            deadline = time.monotonic() + 20
            while True:
                d = dumps(roles)
                if all(v == expected for v in d.values()):
                    return
                if time.monotonic() > deadline:
                    pytest.fail(f"caches did not converge on {expected}: {d}")
                time.sleep(0.05)

        expected: dict[str, Any] = {}
        for i in range(70):  # more than history: a late starter must start from a snapshot
            role = "a" if i % 2 else "b"
            queues[role].put(("set", f"{role}{i % 7}", i))
            expected[f"{role}{i % 7}"] = i
        queues["a"].put(("set", "nested", {"x": [1, 2]}))
        queues["b"].put(("delete", "b0"))  # after b's own sets of b0 (one queue keeps order)
        expected["nested"] = {"x": [1, 2]}
        expected.pop("b0")
        converge(("a", "b"), expected)
        assert make_bus().backlog("/__shmbus_cache/settings", 0).first_available > 1  # history was trimmed
        procs["late"] = FORK.Process(target=_cache_worker, args=(bus_name, "late", queues["late"], out))
        procs["late"].start()
        assert out.get(timeout=30)[1] == "late"
        converge(("a", "b", "late"), expected)
        for role, value in (("a", 1), ("b", 2)):  # one key written from two workers in turn
            queues[role].put(("set", "shared", value))
            expected["shared"] = value
            converge(("a", "b", "late"), expected)
        queues["late"].put(("set", "from-late", True))
        expected["from-late"] = True
        converge(("a", "b", "late"), expected)
        queues["b"].put(("clear",))
        converge(("a", "b", "late"), {})
    finally:
        for r, q in queues.items():
            if r in procs:
                q.put(("quit",))
        for p in procs.values():
            p.join(10)
            if p.is_alive():
                p.kill()


def test_distributed_cache_app_version_scopes_and_values_must_encode(make_bus: Any) -> None:
    b1, b2 = make_bus(), make_bus()
    v1 = shmbus.DistributedCache("c", app_version="1", bus=b1)
    v1b = shmbus.DistributedCache("c", app_version="1", bus=b2)
    v2 = shmbus.DistributedCache("c", app_version="2", bus=b2)
    other = shmbus.DistributedCache("other", app_version="1", bus=b2)
    v1["k"] = "one"
    wait_for(lambda: v1b.get("k") == "one")
    time.sleep(0.05)
    assert "k" not in v2 and "k" not in other
    with pytest.raises(TypeError, match="__shmbus_cache"):
        v1["bad"] = object()
    assert "bad" not in v1  # nothing changed locally when the publish failed
    with pytest.raises(TypeError):
        v1[1] = "x"  # type: ignore[index]


def test_idle_listening_process_uses_no_cpu(bus_name: str, make_bus: Any) -> None:
    make_bus()
    code = textwrap.dedent("""
        import sys, time, shmbus
        bus = shmbus.Bus(sys.argv[1], keepalive_interval=0, create=True)
        bus.subscribe("/idle", print)
        time.sleep(0.3)
        t0 = time.process_time()
        time.sleep(2.0)
        print(time.process_time() - t0)
        bus.close()
    """)
    out = subprocess.run([sys.executable, "-c", code, bus_name], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert float(out.stdout.strip().splitlines()[-1]) < 0.05  # CPU seconds over 2 s of idling


def test_cli_stats_publish_tail(make_bus: Any, bus_name: str) -> None:
    bus = make_bus()
    bus.publish("/cli", {"a": 1}, site_id="s1")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "shmbus", *args, "--bus", bus_name], capture_output=True, text=True, timeout=60
        )

    r = run("publish", "/cli2", '{"x": 2}', "--json-data", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"channel": "/cli2", "message_id": 1}
    r = run("stats", "--json")
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert st["global_id"] == 2 and st["epoch"] == bus.epoch and os.getpid() in st["processes"]
    chans = {(c["channel"], c["site_id"]): c for c in st["channels"]}
    assert chans[("/cli", "s1")]["last_id"] == 1 and chans[("/cli2", None)]["retained"] == 1
    r = run("stats")
    assert "history" in r.stdout and "/cli2" in r.stdout
    r = run("tail", "/cli2", "--last", "1", "--count", "1", "--timeout", "20", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[0])["data"] == {"x": 2}
    r = subprocess.run(
        [sys.executable, "-m", "shmbus", "stats", "--bus", bus_name + "nope"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0 and "no bus named" in r.stderr


def test_cli_for_newcomers(make_bus: Any, bus_name: str) -> None:
    """publish never creates a bus by accident, stats never counts itself, destroy refuses a bus in use,
    list takes no --bus, a closed pipe is not a traceback, every option has help."""

    def run(*a: str, check: bool = False) -> subprocess.CompletedProcess[str]:
        r = subprocess.run([sys.executable, "-m", "shmbus", *a], capture_output=True, text=True, timeout=60)
        assert not check or r.returncode == 0, r.stderr
        return r

    r = run("publish", "/x", "1", "--bus", bus_name)
    assert r.returncode != 0 and "no bus named" in r.stderr and "--create" in r.stderr
    assert not os.path.exists(f"/dev/shm/shmbus.{bus_name}")  # a mistyped name creates nothing
    run("publish", "/x", "1", "--bus", bus_name, "--create", check=True)
    bus = make_bus()  # this test process attaches: stats must list it, and not the stats command itself
    bus.last_id("/x")
    st = json.loads(run("stats", "--bus", bus_name, "--json", check=True).stdout)
    assert st["processes"] == [os.getpid()]
    r = run("destroy", "--bus", bus_name)
    assert r.returncode != 0 and str(os.getpid()) in r.stderr and "--force" in r.stderr
    assert os.path.exists(f"/dev/shm/shmbus.{bus_name}")
    assert run("list", "--bus", bus_name).returncode == 2  # argparse: list has no --bus
    assert bus_name in run("list", check=True).stdout.split()
    for i in range(1500):  # enough channels that stats --json outgrows the pipe, so head really closes it early
        bus.publish(f"/many/{i}", i)
    pipe = subprocess.run(
        f"{sys.executable} -m shmbus stats --bus {bus_name} --json | head -1",
        shell=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Traceback" not in pipe.stderr and "BrokenPipe" not in pipe.stderr, pipe.stderr
    for cmd in ("stats", "tail", "publish", "list", "destroy"):
        text = run(cmd, "--help", check=True).stdout
        options = re.findall(r"^  (-[-\w]+(?:, --[-\w]+)?)(.*)$", text, re.M)
        assert options and all(rest.strip() for _, rest in options if _ != "-h, --help"), (cmd, text)
    bus.close()
    run("destroy", "--bus", bus_name, check=True)
