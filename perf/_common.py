"""Helpers shared by the ``perf/bench_*.py`` scripts: argument parsing, timing, percentiles, a Redis baseline,
and a report that prints absolute figures *and* ratios against a baseline measured in the same run.

Why ratios: the machine is a shared 2-vCPU VM where absolute figures move by 2x with the neighbours' load; a
baseline measured in the same run (interleaved with the subject) moves with them, so its ratio is the figure
that can be compared between runs and machines. Benchmarks never fail on a slow figure: a missed target is
printed as ``MISS`` and the script still exits 0 (exit 1 only when the benchmark itself broke).

Conventions every script follows (see perf/README.md): ``--quick`` (CI: seconds, not minutes), ``--json``
(one JSON document on stdout; the human table then goes to stderr), exit 0 = ran, 77 = skipped (a missing
optional dependency), anything else = error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:  # run as `python perf/bench_x.py` from anywhere
    sys.path.insert(0, REPO)

EXIT_SKIP = 77

__all__ = [
    "EXIT_SKIP",
    "REPO",
    "Measurement",
    "RedisBaseline",
    "Report",
    "machine_info",
    "parse_args",
    "percentile",
    "rate",
    "redis_baseline",
    "skip",
    "unique_name",
]


# ---------------------------------------------------------------------------------------------- arguments
def parse_args(
    description: str,
    argv: Sequence[str] | None = None,
    extra: Callable[[argparse.ArgumentParser], None] | None = None,
) -> argparse.Namespace:
    """The flags every benchmark accepts; ``extra`` may add the script's own."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="small sizes, one or few repeats (CI smoke run)")
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout (table to stderr)")
    p.add_argument("--repeats", type=int, default=None, help="override the number of repeats")
    if extra is not None:
        extra(p)
    return p.parse_args(argv)


def split_option(p: argparse.ArgumentParser) -> None:
    """The bridge benchmarks' ``--split-relays``."""
    p.add_argument(
        "--split-relays",
        action="store_true",
        help="relay host A and host B in two processes (as on two machines), not both in one helper",
    )


def start_helpers(
    script: str, argv: list[str], split: bool, only: tuple[str, ...] | None = None
) -> list[subprocess.Popen[str]]:
    """A bridge benchmark's relay processes, ``script`` run with ``argv`` and the hosts it relays: one for both
    hosts ("ab"), or with ``split`` one per host ("a", "b"), as on real hosts (the relays then do not take turns on
    one interpreter lock). The last one holds host B's subscriber and answers "dump" with its latencies. ``only``:
    these helpers (``("a",)``, say), whatever ``split`` says."""
    helpers = []
    try:
        for hosts in only or (("a", "b") if split else ("ab",)):
            helpers.append(
                subprocess.Popen(
                    [sys.executable, "-c", script, *argv, hosts],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
            out = helpers[-1].stdout
            if out is None or out.readline().strip() != "READY":
                raise RuntimeError("bench helper did not start")
    except BaseException:
        stop_helpers(helpers)
        raise
    return helpers


def stop_helpers(helpers: list[subprocess.Popen[str]], timeout: float = 10) -> None:
    """Close the helpers' stdin (their cue to end) and wait for them; kill one that does not end in ``timeout``."""
    for helper in helpers:
        with contextlib.suppress(OSError):
            if helper.stdin is not None:
                helper.stdin.close()
        try:
            helper.wait(timeout)
        except subprocess.TimeoutExpired:
            helper.kill()
            helper.wait()


def fork(fn: Any, *args: Any) -> int:
    """Run ``fn(*args)`` in a forked child that never returns into the parent's code (it exits 1 if ``fn`` returns
    or raises without calling ``os._exit`` itself); the child's pid."""
    pid = os.fork()
    if pid == 0:
        try:
            fn(*args)
        finally:
            os._exit(1)
    return pid


def skip(reason: str) -> None:
    """Exit with the 'skipped' code: perf/run reports it but does not count it as an error."""
    print(f"SKIP: {reason}", file=sys.stderr)
    sys.exit(EXIT_SKIP)


def unique_name(prefix: str) -> str:
    """A bus name no parallel test or benchmark uses."""
    return f"{prefix}-{os.getpid()}-{time.monotonic_ns() % 10**9}"


# ---------------------------------------------------------------------------------------------- timing
def rate(fn: Callable[[int], Any], n: int) -> float:
    """Operations per second of ``fn(n)`` (which performs ``n`` operations), by wall clock."""
    t0 = time.perf_counter()
    fn(n)
    return n / (time.perf_counter() - t0)


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of already sorted values (p in 0..100)."""
    if not sorted_values:
        return float("nan")
    k = max(0, min(len(sorted_values) - 1, round(p / 100.0 * len(sorted_values) + 0.5) - 1))
    return float(sorted_values[k])


# ---------------------------------------------------------------------------------------------- machine
def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _version(mod: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(mod)
    except Exception:
        return None


def machine_info() -> dict[str, Any]:
    """What a reader needs to judge the figures: CPUs, load, interpreter and library versions."""
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in _read("/proc/cpuinfo").splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "loadavg": _read("/proc/loadavg").split()[:3],
        "switchinterval": sys.getswitchinterval(),
        "versions": {m: _version(m) for m in ("orjson", "msgpack", "redis", "hiredis", "posix_ipc")},
    }


# ------------------------------------------------------------------------------------------ redis baseline
def _ping(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.settimeout(timeout)
            s.sendall(b"*1\r\n$4\r\nPING\r\n")
            return s.recv(64).startswith((b"+PONG", b"-NOAUTH"))
    except OSError:
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RedisBaseline:
    """Where the baseline Redis is and how it was found (``source``: env / local / started / missing)."""

    url: str | None
    source: str
    server_version: str | None = None
    problem: str | None = None


@contextlib.contextmanager
def redis_baseline() -> Iterator[RedisBaseline]:
    """Yield a Redis to compare against: ``REDIS_URL``, else 127.0.0.1:6379, else a private ``redis-server``
    from PATH on a free port (no persistence, temp dir) that is stopped on exit. ``url`` is None (with
    ``problem`` saying why) when none is available: benchmarks then print absolute figures only."""
    try:
        import redis
    except ImportError:
        yield RedisBaseline(None, "missing", problem="redis-py is not installed (pip install 'shmbus[redis]')")
        return
    env = os.environ.get("REDIS_URL")
    proc: subprocess.Popen[bytes] | None = None
    tmp: str | None = None
    try:
        if env:
            info = RedisBaseline(env, "env REDIS_URL")
        elif _ping("127.0.0.1", 6379):
            info = RedisBaseline("redis://127.0.0.1:6379/0", "local 127.0.0.1:6379")
        elif shutil.which("redis-server"):
            port = _free_port()
            tmp = tempfile.mkdtemp(prefix="shmbus-perf-redis-")
            proc = subprocess.Popen(
                [
                    "redis-server",
                    "--port",
                    str(port),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    tmp,
                    "--daemonize",
                    "no",
                    "--loglevel",
                    "warning",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            deadline = time.monotonic() + 10
            while not _ping("127.0.0.1", port, 0.2):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server on port {port} did not start")
                time.sleep(0.05)
            info = RedisBaseline(f"redis://127.0.0.1:{port}/0", f"started redis-server on port {port}")
        else:
            info = RedisBaseline(None, "missing", problem="no REDIS_URL, nothing on :6379, no redis-server in PATH")
        if info.url:
            import redis

            with contextlib.suppress(Exception):
                r = redis.Redis.from_url(info.url)
                info.server_version = str(r.info("server").get("redis_version"))
                r.close()
        yield info
    finally:
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------------------------------------- report
@dataclass
class Measurement:
    """One figure measured several times; ``higher_is_better`` decides which way a ratio points."""

    name: str
    unit: str
    values: list[float]
    higher_is_better: bool = True
    baselines: list[str] = field(default_factory=list)
    note: str = ""
    published: bool = False  # a constant from someone else's documentation, not measured here
    source: str = ""  # where a published figure is quoted from

    @property
    def median(self) -> float:
        return float(statistics.median(self.values)) if self.values else float("nan")

    @property
    def lo(self) -> float:
        return min(self.values) if self.values else float("nan")

    @property
    def hi(self) -> float:
        return max(self.values) if self.values else float("nan")

    def advantage(self, base: Measurement) -> float:
        """How many times better than ``base`` (>1 = better), on medians: faster rate or lower latency."""
        if not self.values or not base.values or not base.median or not self.median:
            return float("nan")
        return self.median / base.median if self.higher_is_better else base.median / self.median


def _fmt(v: float, unit: str) -> str:
    if v != v:  # nan
        return "-"
    if unit in ("msgs/s", "ops/s"):
        return f"{v / 1e3:,.1f}k" if v < 1e6 else f"{v / 1e6:,.2f}M"
    if unit == "%":
        return f"{v:.3f}"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:,.1f}"


class Report:
    """Collects figures, ratios and target checks; prints a table (stderr under --json) and JSON."""

    def __init__(self, bench: str, title: str, args: argparse.Namespace) -> None:
        self.bench = bench
        self.title = title
        self.quick = bool(args.quick)
        self.json = bool(args.json)
        self.rows: dict[str, Measurement] = {}
        self.targets: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.machine = machine_info()
        self.started = time.time()

    @property
    def out(self) -> TextIO:
        return sys.stderr if self.json else sys.stdout

    def log(self, msg: str) -> None:
        """Progress line (always stderr, so a --json stdout stays parseable)."""
        print(f"[{self.bench}] {msg}", file=sys.stderr, flush=True)

    def add(
        self,
        name: str,
        values: Sequence[float],
        unit: str,
        *,
        higher_is_better: bool = True,
        baselines: Sequence[str] = (),
        note: str = "",
    ) -> Measurement:
        m = Measurement(name, unit, [float(v) for v in values], higher_is_better, list(baselines), note)
        self.rows[name] = m
        return m

    def published(self, name: str, value: float, unit: str, source: str) -> Measurement:
        """A figure quoted from elsewhere, kept apart from what this run measured."""
        note = f"published figure, not measured here: {source}"
        m = Measurement(name, unit, [value], True, [], note, published=True, source=source)
        self.rows[name] = m
        return m

    def ratio(self, name: str, base: str) -> float:
        """How many times better ``name`` is than ``base``, both measured in this run (nan when either is missing).
        A figure quoted from elsewhere is refused: its ratio is :meth:`quoted_ratio`, printed apart."""
        return self._ratio(name, base, quoted=False)

    def quoted_ratio(self, name: str, base: str) -> float:
        """``name`` against a figure quoted from elsewhere (:meth:`published`): not a same-run comparison (the
        machines, loads and setups differ), so it is always printed marked "(quoted: source)"."""
        return self._ratio(name, base, quoted=True)

    def _ratio(self, name: str, base: str, *, quoted: bool) -> float:
        a, b = self.rows.get(name), self.rows.get(base)
        if b is not None and b.published != quoted:
            raise ValueError(
                f"{base!r} is {'not ' if quoted else ''}a quoted figure: use {'' if quoted else 'quoted_'}ratio"
            )
        return a.advantage(b) if a and b else float("nan")

    def ratio_text(self, name: str, base: str) -> str:
        """The one printed form of a ratio ("" when it cannot be computed): ``2.1x base`` for a baseline
        measured in this run, ``2.1x base (quoted: source)`` for a quoted figure, so the two never read alike."""
        b = self.rows.get(base)
        if b is not None and b.published:
            r = self.quoted_ratio(name, base)
            return f"{r:,.1f}x {base} (quoted: {b.source})" if r == r else ""
        r = self.ratio(name, base)
        return f"{r:,.1f}x {base}" if r == r else ""

    def _baselines(self, m: Measurement) -> tuple[list[str], list[str]]:
        """``m``'s baselines measured in this run, then the quoted ones."""
        quoted = [b for b in m.baselines if b in self.rows and self.rows[b].published]
        return [b for b in m.baselines if b not in quoted], quoted

    def target(self, what: str, value: float, goal: float, *, at_least: bool = True, unit: str = "") -> bool:
        """Record a target check (never an error: a miss is printed as MISS)."""
        ok = value == value and (value >= goal if at_least else value <= goal)
        self.targets.append(
            {"target": what, "value": value, "goal": goal, "at_least": at_least, "unit": unit, "met": ok}
        )
        return ok

    def note(self, text: str) -> None:
        self.notes.append(text)

    def render(self) -> str:
        head = f"{self.bench}: {self.title}" + ("  [--quick: small sample, indicative only]" if self.quick else "")
        lines = [head, "=" * len(head)]
        w = max([len(n) for n in self.rows] + [10]) + 2
        lines.append(
            f"{'measurement':<{w}}{'unit':<8}{'median':>10}  {'[min - max]':<22} n  ratios (x = times "
            "better than baseline, on medians)"
        )
        for m in self.rows.values():
            rng = f"[{_fmt(m.lo, m.unit)} - {_fmt(m.hi, m.unit)}]" if len(m.values) > 1 else ""
            measured, quoted = self._baselines(m)  # a quoted figure's ratio last, and marked
            tail = "; ".join(t for t in (self.ratio_text(m.name, b) for b in measured + quoted) if t)
            if m.note:
                tail = f"{tail}  ({m.note})" if tail else f"({m.note})"
            lines.append(f"{m.name:<{w}}{m.unit:<8}{_fmt(m.median, m.unit):>10}  {rng:<22}{len(m.values):>2}  {tail}")
        if self.targets:
            lines.append("targets:")
            for t in self.targets:
                op = ">=" if t["at_least"] else "<="
                v = t["value"]
                lines.append(
                    f"  {'ok  ' if t['met'] else 'MISS'} {t['target']}: {v:,.1f}{t['unit']} "
                    f"(goal {op} {t['goal']:,}{t['unit']})"
                )
        for n in self.notes:
            lines.append(f"note: {n}")
        mi = self.machine
        lines.append(
            f"machine: {mi['cpus']} CPU {mi['cpu_model']}, load {' '.join(mi['loadavg'])} at start, "
            f"{' '.join(_read('/proc/loadavg').split()[:3])} at end; Python {mi['python']}"
        )
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "bench": self.bench,
            "title": self.title,
            "quick": self.quick,
            "started": self.started,
            "seconds": round(time.time() - self.started, 2),
            "machine": self.machine,
            "loadavg_end": _read("/proc/loadavg").split()[:3],
            "results": [
                {
                    "name": m.name,
                    "unit": m.unit,
                    "median": m.median,
                    "min": m.lo,
                    "max": m.hi,
                    "values": m.values,
                    "higher_is_better": m.higher_is_better,
                    "published": m.published,
                    "note": m.note,
                    "ratios": {b: self.ratio(m.name, b) for b in self._baselines(m)[0]},  # same-run baselines
                    "quoted_ratios": {
                        b: {"ratio": self.quoted_ratio(m.name, b), "baseline": "quoted", "source": self.rows[b].source}
                        for b in self._baselines(m)[1]
                    },
                }
                for m in self.rows.values()
            ],
            "targets": self.targets,
            "notes": self.notes,
        }

    def emit(self) -> None:
        """Print the table, and the JSON document on stdout under --json."""
        print(self.render(), file=self.out, flush=True)
        if self.json:
            print(json.dumps(self.to_json(), default=str), flush=True)
