"""``shmbus stats`` and ``shmbus top``: what a bus holds and who uses it, once or live."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from .channels import split_backend_name
from .cli_args import count, human_size, open_existing, others, seconds
from .providers import TOOLS, provider

__all__ = ["add_stats_arguments", "add_top_arguments", "cmd_stats", "cmd_top"]


def add_stats_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--redis", help="Redis URL of a bridged bus: show Redis's role, ids and the relay (default: $SHMBUS_REDIS_URL)"
    )
    p.add_argument(
        "--watch",
        nargs="?",
        const=1.0,
        type=seconds,
        metavar="SECONDS",
        help="redraw every SECONDS (default 1) until Ctrl-C",
    )
    p.add_argument("--count", type=count, default=0, help="with --watch: stop after N refreshes")


def add_top_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--interval", type=seconds, default=1.0, help="seconds between refreshes (default 1)")
    p.add_argument("--count", type=count, default=0, help="stop after N refreshes (default: never)")


def cmd_stats(args: argparse.Namespace) -> int:
    """segment, ids, channels, history, processes

    Show a bus: its segment and ring, global ids, how many seconds of history the ring holds, the attached
    processes (this command excluded) and every channel with its ids.
    """
    watch = getattr(args, "watch", None)
    if not watch:
        return _stats_once(args)
    shown = 0
    try:
        while True:
            if sys.stdout.isatty():
                sys.stdout.write("\x1b[H\x1b[2J")
            _stats_once(args)
            sys.stdout.flush()
            shown += 1
            if args.count and shown >= args.count:
                return 0
            time.sleep(watch)
    except KeyboardInterrupt:
        return 0


def cmd_top(args: argparse.Namespace) -> int:
    """live figures: rates per worker, parked clients, ring, lag, relay

    Show the host's figures of a bus live (refreshed every second): publishes and deliveries per second per
    worker and in total, parked polls and open streams, the ring's fill and history, listener lag, messages
    lost, the relay's state and lag, and the busiest channels. Stop with Ctrl-C.
    """
    from .top import run

    if args.interval <= 0:
        sys.exit("shmbus: --interval must be positive")
    seg = open_existing(args)
    try:
        return run(seg, interval=args.interval, count=args.count)
    finally:
        seg.close()


def _stats_once(args: argparse.Namespace) -> int:
    seg = open_existing(args)
    try:
        st = seg.stats()
        st.processes = others(st.processes)
        channels: list[dict[str, Any]] = []
        for info in seg.iter_channels():
            channel, site = split_backend_name(info.key.decode(errors="replace"))
            channels.append(
                {
                    "channel": channel,
                    "site_id": site,
                    "last_id": info.last_id,
                    "oldest_id": info.oldest_id if info.last_id else 0,
                    "retained": max(info.last_id - info.oldest_id + 1, 0) if info.last_id else 0,
                    "expired": info.expired,
                }
            )
        channels.sort(key=lambda c: (c["channel"], c["site_id"] or ""))
        out: dict[str, Any] = {
            "bus": st.name,
            "path": st.path,
            "epoch": st.epoch,
            "segment_bytes": st.size,
            "ring_bytes": st.ring_size,
            "ring_used_bytes": st.ring_used,
            "global_id": st.global_id,
            "oldest_global_id": st.oldest_global_id,
            "published": st.published,
            "overwritten": st.overwritten,
            "repairs": st.repairs,
            "history_seconds": round(st.history_seconds, 3),
            "max_channels": st.max_channels,
            "channel_count": st.channels,
            "processes": st.processes,
            "sleeping_listeners": st.sleepers,
            "channels": channels,
        }
        rec = seg.bridge()
        if rec is not None:
            out["bridge"] = {"kind": rec.kind, "url": rec.url, "history": seg.history_id()}
        redis_url = args.redis or os.environ.get("SHMBUS_REDIS_URL")
        if redis_url:
            out["redis"] = _redis_view(redis_url, seg.path, st.global_id, seg.history_id())
    finally:
        seg.close()
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"bus {out['bus']}  ({out['path']})")
    print(f"  epoch            {out['epoch']}")
    print(
        f"  segment          {human_size(out['segment_bytes'])}, ring {human_size(out['ring_bytes'])} "
        f"({100 * out['ring_used_bytes'] / out['ring_bytes']:.1f}% used)"
    )
    print(
        f"  global ids       {out['oldest_global_id']}..{out['global_id']}  "
        f"(published {out['published']}, overwritten {out['overwritten']}, repairs {out['repairs']})"
    )
    print(f"  history          {out['history_seconds']:.1f} s held in the ring")
    print(f"  processes        {len(out['processes'])} attached: {' '.join(map(str, out['processes']))}")
    print(f"  channels         {out['channel_count']} of {out['max_channels']}")
    if "bridge" in out:
        print(f"  bridged          {out['bridge']['kind']} {out['bridge']['url']}")
    if "redis" in out:
        rv = out["redis"]
        if "error" in rv:
            print(f"  redis            UNREACHABLE {rv['url']}: {rv['error']}")
        else:
            print(
                f"  redis            {rv['url']} role={rv['role']} global_id={rv['global_id']} "
                f"({rv['standing']}), relay {'active' if rv['relay_active'] else 'NOT RUNNING'}"
            )
    if channels:
        width = max(len(c["channel"]) for c in channels)
        print(f"    {'channel'.ljust(width)}  {'site':10} {'last_id':>9} {'oldest':>9} {'retained':>9}")
        for c in channels:
            print(
                f"    {c['channel'].ljust(width)}  {(c['site_id'] or '-'):10} {c['last_id']:>9} "
                f"{c['oldest_id']:>9} {c['retained']:>9}{'  (expired)' if c['expired'] else ''}"
            )
    return 0


def _redis_view(url: str, seg_path: str, seg_global_id: int, seg_history: int) -> dict[str, Any]:
    """The ``redis-view`` tool's ``segment_view`` (the Redis package provides it: :mod:`shmbus.providers`; the core
    imports no adapter), or why it cannot run."""
    try:
        view = provider(TOOLS, "redis-view")
    except ImportError as exc:
        return {"url": url, "error": f"the redis extra is not installed ({exc})"}
    except LookupError as exc:
        return {"url": url, "error": str(exc)}
    return dict(view.segment_view(url, seg_path, seg_global_id, seg_history))
