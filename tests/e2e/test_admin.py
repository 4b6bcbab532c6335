"""The admin page and the metrics endpoint on a running 2-worker app under load (gunicorn, uvicorn workers).

Chromium opens the page as an admin and reports what its plots hold after several samples; the load (streaming
and long-polling clients of the message-bus protocol, publishes through both workers) must show up as non-zero
series of both workers. A non-admin gets 403 on every admin route. The Prometheus text parses with
``prometheus_client`` and any worker answers with the same host totals.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from shmbus import Bus
from tests.harness import require_module
from tests.harness.browser import E2E_DIR, run_page
from tests.harness.wait import wait_for

pytestmark = pytest.mark.e2e

GUNICORN_CONFIG = "python:shmbus.adapters.integrations.gunicorn"


@pytest.fixture
def admin_server(procs: Any, bus_name: str) -> Iterator[Any]:
    require_module("uvicorn")
    bus = Bus(bus_name, keepalive_interval=0, create=True)
    bus.segment  # noqa: B018 - made here, so the test can remove it (the workers only attach)
    yield procs.gunicorn_server(
        "admin_app:asgi_app",
        workers=2,
        worker_class="uvicorn.workers.UvicornWorker",
        config=GUNICORN_CONFIG,
        env={"SHMBUS_TEST_BUS": bus_name},
        app_dir=E2E_DIR,
        health_path="/health",
    )
    bus.destroy()


class Load:
    """Streaming clients (held open) and long polls (re-made after each answer) plus publishes through both
    workers, until stopped."""

    def __init__(self, url: str, streams: int = 10, polls: int = 4) -> None:
        self.url = url
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self._stream, daemon=True) for _ in range(streams)]
        self.threads += [threading.Thread(target=self._poll, daemon=True) for _ in range(polls)]
        self.threads.append(threading.Thread(target=self._publish, daemon=True))

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(40)

    def _stream(self) -> None:
        cid = uuid.uuid4().hex
        while not self.stop.is_set():
            try:
                with httpx.stream(
                    "POST", f"{self.url}/message-bus/{cid}/poll", data={"/load": "-1"}, timeout=40, trust_env=False
                ) as r:
                    for _ in r.iter_bytes():
                        if self.stop.is_set():
                            break
            except httpx.HTTPError as exc:
                if not self.stop.is_set():
                    self.errors.append(repr(exc))
                    time.sleep(0.2)

    def _poll(self) -> None:
        cid = uuid.uuid4().hex
        while not self.stop.is_set():
            try:
                httpx.post(
                    f"{self.url}/message-bus/{cid}/poll",
                    data={"/load": "-1"},
                    headers={"Dont-Chunk": "true"},
                    timeout=40,
                    trust_env=False,
                )
            except httpx.HTTPError as exc:
                if not self.stop.is_set():
                    self.errors.append(repr(exc))
                    time.sleep(0.2)

    def _publish(self) -> None:
        while not self.stop.is_set():
            try:
                httpx.post(f"{self.url}/publish?n=5", timeout=10, trust_env=False)
            except httpx.HTTPError as exc:
                self.errors.append(repr(exc))
            time.sleep(0.05)


def scrape(url: str, cookie: bool = False) -> dict[str, list[Any]]:
    from prometheus_client.parser import text_string_to_metric_families

    r = httpx.get(f"{url}/metrics", timeout=10, trust_env=False)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {f.name: f.samples for f in text_string_to_metric_families(r.text)}


def pids_with_clients(url: str) -> set[str]:
    fams = scrape(url)
    busy = {s.labels["pid"] for s in fams["shmbus_open_streams"] if s.value > 0}
    return busy


@pytest.fixture
def loaded(admin_server: Any) -> Iterator[tuple[Any, Load]]:
    with Load(admin_server.url) as load:
        wait_for(
            lambda: len(pids_with_clients(admin_server.url)) == 2,
            timeout=60,  # streams re-connect every long-polling interval (25 s): a lopsided start evens out
            what="open streams in both workers (per /metrics)",
            interval=0.3,
        )
        yield admin_server, load


def test_admin_page_plots_both_workers_under_load_and_refuses_non_admins(
    loaded: tuple[Any, Load], tmp_path: Path
) -> None:
    server, load = loaded
    shot = tmp_path / "admin-page.png"
    run = run_page(f"{server.url}/login?report=6", timeout=60, screenshot=str(shot))
    assert run.done, f"the page did not report: {run.messages} {run.stderr[-3000:]}\n{server.log()[-3000:]}"
    report = run.messages[-1]
    print(f"admin page screenshot: {shot}")
    assert shot.exists() and shot.stat().st_size > 10_000, "no screenshot of the page"
    assert report["transport"] == "sse", "the page should be fed over the bus's SSE transport under uvicorn"
    charts = report["charts"]
    assert set(charts) == {"rates", "clients", "deliveries", "ring", "lag"}, charts
    for name in ("clients", "deliveries"):
        workers = [s for s in charts[name] if s["max"] > 0]
        assert len(workers) >= 2, f"{name}: the plot should draw non-zero series of both workers: {charts[name]}"
    rates = {s["label"]: s for s in charts["rates"]}
    assert rates["publishes/s"]["max"] > 0 and rates["deliveries/s"]["max"] > 0, rates
    assert rates["publishes/s"]["points"] >= 5
    ring = {s["label"]: s for s in charts["ring"]}
    assert ring["fill %"]["max"] > 0
    assert_every_plot_has_its_axes(shot, report)
    tail = " ".join(report["tail"])
    assert '"pid"' in tail, "the live tail of /load shows no payloads"
    assert "targeted message: payload not shown" in tail
    assert "for user 7" not in tail, "a targeted payload leaked into the admin tail"
    assert not load.errors[:1] or len(load.errors) < 5, load.errors

    # a non-admin (no cookie): 403 on every admin route, whichever worker answers
    for path in ("/admin", "/admin/", "/admin/snapshot.json", "/admin/events", "/admin/static/admin.js"):
        for _ in range(2):
            r = httpx.get(server.url + path, timeout=10, trust_env=False)
            assert r.status_code == 403, (path, r.status_code, r.text)
            assert "admin" in r.text


Y_UNITS = {
    "rates": ["messages / s"],
    "clients": ["clients held"],
    "deliveries": ["deliveries / s"],
    "ring": ["ring fill (%)", "history (s)"],
    "lag": ["messages"],
}


def _ink(img: Any, x0: float, x1: float, y0: float, y1: float) -> int:
    """Dark pixels (text, tick labels) in a region of the screenshot."""
    n = 0
    for y in range(max(int(y0), 0), min(int(y1), img.height)):
        for x in range(max(int(x0), 0), min(int(x1), img.width)):
            if min(img.pixel(x, y)[:3]) < 120:
                n += 1
    return n


def assert_every_plot_has_its_axes(shot: Path, report: dict[str, Any]) -> None:
    """Measured on the screenshot: every plot has a y axis with tick labels left of its plotting area (the ring's
    seconds a second one on the right) and time labels below it; and each axis says its unit, each series is
    drawn against the axis of its unit (the ring's fill % against 0-100 %, not against the seconds)."""
    from tests.harness.png import read_png

    axes = report["axes"]
    dpr = report["dpr"]
    img = read_png(shot, max_rows=int(max(a["canvas"]["bottom"] for a in axes.values()) * dpr) + 2)
    for name, units in Y_UNITS.items():
        a = axes[name]
        c, p = ({k: v * dpr for k, v in r.items()} for r in (a["canvas"], a["plot"]))
        y_axes = [ax for ax in a["axes"] if ax["scale"] != "x"]
        assert [ax["label"] for ax in y_axes] == units, (name, y_axes)
        assert all(len(ax["ticks"]) >= 2 for ax in a["axes"]), (name, a["axes"])
        left = _ink(img, c["left"], p["left"] - 2, p["top"], p["bottom"])
        below = _ink(img, p["left"], p["right"], p["bottom"] + 2, c["bottom"])
        assert left > 150, f"{name}: no y axis drawn left of the plot ({left} dark pixels)"
        assert below > 150, f"{name}: no time axis drawn below the plot ({below} dark pixels)"
        right = _ink(img, p["right"] + 2, c["right"], p["top"], p["bottom"])
        if len(units) == 2:
            assert right > 150, f"{name}: no second y axis on the right ({right} dark pixels)"
        else:
            assert right < 20, f"{name}: something drawn right of the plot ({right} dark pixels)"
    ring = {s["label"]: s["scale"] for s in report["charts"]["ring"]}
    assert ring == {"fill %": "%", "history s": "s"}, ring
    assert axes["ring"]["ranges"]["%"] == [0, 100]
    assert all(0 <= float(t) <= 100 for t in axes["ring"]["axes"][1]["ticks"]), axes["ring"]["axes"][1]
    for name in ("clients", "lag"):  # counts: whole ticks only
        assert all(float(t).is_integer() for t in axes[name]["axes"][1]["ticks"]), (name, axes[name]["axes"][1])


def test_metrics_endpoint_parses_and_every_worker_answers_the_same(loaded: tuple[Any, Load]) -> None:
    server, load = loaded
    fams = scrape(server.url)
    for name in (
        "shmbus_published_messages",
        "shmbus_delivered_messages",
        "shmbus_parked_polls",
        "shmbus_open_streams",
        "shmbus_ring_used_bytes",
        "shmbus_ring_history_seconds",
        "shmbus_listener_lag_messages",
        "shmbus_relay_up",
    ):
        assert name in fams, f"{name} missing from /metrics"
    workers = {s.labels["pid"] for s in fams["shmbus_open_streams"]} - {str(os.getpid())}  # the test attached too
    assert len(workers) == 2, workers
    deadline = time.monotonic() + 30  # the kernel may hand one worker the first publishes: wait for both
    while True:
        per_pid = {s.labels["pid"]: s.value for s in fams["shmbus_process_published_messages"]}
        if sum(1 for pid in workers if per_pid.get(pid, 0) > 0) == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
        fams = scrape(server.url)
    assert sum(1 for pid in workers if per_pid.get(pid, 0) > 0) == 2, f"publishes in both workers: {per_pid}"
    load.__exit__()  # stop the load: the totals stand still
    time.sleep(1.5)
    totals = set()
    answered = set()
    for _ in range(12):  # new connections: both workers answer
        fams = scrape(server.url)
        totals.add(fams["shmbus_published_messages"][0].value)
        answered.add(fams["shmbus_global_id"][0].value)
    assert len(totals) == 1 and len(answered) == 1, (totals, answered)
    assert totals == answered, "every publish is counted once: host total == newest global id"


def test_vendored_uplot_is_the_npm_package() -> None:
    """The admin page's vendored uPlot is byte-identical to the npm package the browser tests install."""
    package = E2E_DIR / "node_modules" / "uplot"
    if not (package / "package.json").exists():
        from tests import harness

        harness.skip_or_fail(f"uplot not installed in {E2E_DIR} (run scripts/test, or npm ci there)")
    static = E2E_DIR.parent.parent / "adapters" / "admin" / "static"
    version = json.loads((package / "package.json").read_text())["version"]
    for name in ("uPlot.iife.min.js", "uPlot.min.css"):
        assert (static / name).read_bytes() == (package / "dist" / name).read_bytes(), f"{name} differs from {version}"
    assert (static / "LICENSE.uPlot").read_bytes() == (package / "LICENSE").read_bytes()
    assert version in (static / "README.md").read_text()


@pytest.mark.parametrize(("worker_class", "transport"), [("gthread", "sse"), ("sync", "poll")])
def test_admin_page_under_wsgi_workers(procs: Any, bus_name: str, worker_class: str, transport: str) -> None:
    """The WSGI shell in a browser: gthread workers feed the page over the bus's WSGI SSE transport; a sync
    worker refuses the stream (it would hold the worker) and the page polls snapshot.json instead."""
    bus = Bus(bus_name, keepalive_interval=0, create=True)
    try:
        server = procs.gunicorn_server(
            "admin_app:wsgi_app",
            workers=2,
            worker_class=worker_class,
            config=GUNICORN_CONFIG,
            env={"SHMBUS_TEST_BUS": bus_name},
            app_dir=E2E_DIR,
            health_path="/health",
            # the shmbus gunicorn config sets 32 threads, which turns "sync" into gthread: 1 keeps it sync
            extra_args=["--threads", "8" if worker_class == "gthread" else "1"],
        )
        for _ in range(3):
            httpx.post(f"{server.url}/publish?n=3", timeout=10, trust_env=False)
        run = run_page(f"{server.url}/login?report=3", timeout=60)
        assert run.done, f"the page did not report: {run.messages} {run.stderr[-3000:]}\n{server.log()[-3000:]}"
        report = run.messages[-1]
        assert report["transport"] == transport
        rates = {s["label"]: s for s in report["charts"]["rates"]}
        assert rates["publishes/s"]["points"] >= 2
        tail = " ".join(report["tail"])
        assert '"pid"' in tail and "targeted message: payload not shown" in tail and "for user 7" not in tail
    finally:
        bus.destroy()
