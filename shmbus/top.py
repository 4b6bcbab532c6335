"""``shmbus top``: the host's figures of a bus, live in the terminal (refreshed every second).

Rates are differences between two snapshots (:func:`shmbus.metrics.read_snapshot`) divided by the time between
them, so the first frame shows totals and rates start with the second. With ``rich`` installed (the ``[cli]``
extra) the frame is drawn with it; otherwise as plain text, redrawn with ANSI escapes (or, when stdout is not a
terminal, printed one frame after another).
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from .metrics import Snapshot, read_snapshot
from .segment import Segment

__all__ = ["frame_lines", "run"]


def _rate(now: Snapshot, before: Snapshot | None, get: Any) -> float | None:
    if before is None:
        return None
    dt = now.time - before.time
    return max(get(now) - get(before), 0) / dt if dt > 0 else None


def _fmt_rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}/s"


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def frame_lines(now: Snapshot, before: Snapshot | None) -> list[str]:
    """One frame as lines of text (what ``top`` shows; also the plain-text output)."""
    pub = _rate(now, before, lambda s: s.total("publishes"))
    dlv = _rate(now, before, lambda s: s.total("deliveries"))
    used = 100 * now.ring_used / now.ring_size if now.ring_size else 0.0
    lines = [
        f"shmbus top - bus {now.bus}  epoch {now.epoch}  {time.strftime('%H:%M:%S', time.localtime(now.time))}",
        f"publishes {_fmt_rate(pub)} (total {now.total('publishes'):,})   "
        f"deliveries {_fmt_rate(dlv)} (total {now.total('deliveries'):,})   lost {now.total('lost'):,}",
        f"ring {used:.1f}% of {_size(now.ring_size)}, {now.history_seconds:.1f} s of history   "
        f"global ids {now.oldest_global_id:,}..{now.global_id:,}   channels {now.channels:,} of {now.max_channels:,}"
        + ("   (sparse ids)" if now.sparse_ids else ""),
    ]
    relay = now.relay
    if relay is not None:
        lines.append(f"relay pid {relay.pid} {relay.relay_state}, lag {now.relay_lag:,} messages")
    elif any(p.relay_state for p in now.processes if p.alive):
        lines.append("relay: NONE (a bridge engine is attached but no process relays)")
    if not now.has_metrics:
        lines.append("(this segment predates metrics: per-process figures need the bus re-created)")
    lines.append("")
    lines.append(f"{'PID':>8} {'PUB/s':>9} {'DELIV/s':>9} {'PARKED':>7} {'STREAMS':>7} {'LAG':>7} {'LOST':>6}  RELAY")
    old = {p.pid: p for p in before.processes} if before is not None else {}
    dt = now.time - before.time if before is not None else 0.0
    for p in sorted(now.processes, key=lambda p: p.pid):
        if not p.alive:
            continue
        prev = old.get(p.pid)
        prate = (p.publishes - prev.publishes) / dt if prev is not None and dt > 0 else None
        drate = (p.deliveries - prev.deliveries) / dt if prev is not None and dt > 0 else None
        lag = max(now.global_id - p.listener_gid, 0) if p.listener_gid else 0
        lines.append(
            f"{p.pid:>8} {_fmt_rate(prate):>9} {_fmt_rate(drate):>9} {p.parked:>7} {p.streams:>7} {lag:>7} "
            f"{p.lost:>6}  {p.relay_state if p.relay else ''}"
        )
    gone = [p for p in now.processes if not p.alive]
    if gone:
        lines.append(f"{'':>8} ({len(gone)} exited process(es) still counted in the totals)")
    busiest = now.busiest(before, 5)
    if busiest:
        lines.append("")
        lines.append("busiest channels: " + "   ".join(f"{name} {rate:,.0f}/s" for name, rate in busiest))
    return lines


def _plain(lines: list[str], out: TextIO, redraw: bool) -> None:
    if redraw:
        out.write("\x1b[H\x1b[2J")
    out.write("\n".join(lines) + "\n")
    if not redraw:
        out.write("\n")
    out.flush()


def run(seg: Segment, interval: float = 1.0, count: int = 0, out: TextIO | None = None) -> int:
    """Draw frames every ``interval`` seconds until Ctrl-C (or ``count`` frames)."""
    out = out or sys.stdout
    tty = out.isatty()
    before: Snapshot | None = None
    frames = 0
    live: Any = None
    text: Any = None
    if tty:
        try:
            from rich.console import Console
            from rich.live import Live
            from rich.text import Text
        except ImportError:  # the [cli] extra is not installed: plain text
            pass
        else:
            live, text = Live(console=Console(file=out), auto_refresh=False, screen=False), Text
            live.start()
    try:
        while True:
            now = read_snapshot(seg, exclude_self=True)
            lines = frame_lines(now, before)
            if live is not None:
                live.update(text("\n".join(lines)), refresh=True)
            else:
                _plain(lines, out, tty)
            before = now
            frames += 1
            if count and frames >= count:
                return 0
            time.sleep(interval)
    except KeyboardInterrupt:
        return 0
    finally:
        if live is not None:
            live.stop()
