"""``shmbus`` command line: inspect and poke a bus from a shell (stats, tail, publish, list, destroy), and follow
a remote one over HTTP (listen).

Every subcommand attaches to an existing bus only (``publish --create`` may create one), and never counts
itself among the bus's processes.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import sys
import time
from typing import Any

from .bus import Bus
from .buses import bus_names, describe, not_found_message, removal_problem
from .channels import check_bus_name, split_backend_name
from .errors import EngineError
from .segment import Segment, segment_path


def _bus_name(args: argparse.Namespace) -> str:
    return args.bus or os.environ.get("SHMBUS_NAME", "default")


def _open_existing(args: argparse.Namespace) -> Segment:
    try:
        return Segment.open(_bus_name(args), create=False, path=args.path)
    except FileNotFoundError:
        sys.exit(_no_such_bus(args))


def _no_such_bus(args: argparse.Namespace) -> str:
    return "shmbus: " + not_found_message(_bus_name(args), args.path)


def _others(pids: list[int]) -> list[int]:
    """The attached processes other than this command itself."""
    me = os.getpid()
    return [p for p in pids if p != me]


def cmd_stats(args: argparse.Namespace) -> int:
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
    from .top import run

    if args.interval <= 0:
        sys.exit("shmbus: --interval must be positive")
    seg = _open_existing(args)
    try:
        return run(seg, interval=args.interval, count=args.count)
    finally:
        seg.close()


def _stats_once(args: argparse.Namespace) -> int:
    seg = _open_existing(args)
    try:
        st = seg.stats()
        st.processes = _others(st.processes)
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
        f"  segment          {_size(out['segment_bytes'])}, ring {_size(out['ring_bytes'])} "
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
    """How this host's segment stands against the Redis it is bridged to (for the bridge's health). The lag is a
    difference of ids only when both hold the same history (Redis's history key is the one the segment recorded):
    after a FLUSHDB or a restart without persistence the ids are not comparable, and the view says so."""
    try:
        import redis

        from shmbus.adapters.redis import redact_url, relay_active
        from shmbus.adapters.redis.layout import GLOBAL_ID_KEY, HISTORY_KEY
    except ImportError as exc:
        return {"url": url, "error": f"the redis extra is not installed ({exc})"}
    view: dict[str, Any] = {"url": redact_url(url), "relay_active": relay_active(seg_path)}
    try:
        r = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        gid = int(r.get(GLOBAL_ID_KEY) or 0)
        history = int(r.get(HISTORY_KEY) or 0)
        view.update(role=r.execute_command("ROLE")[0].decode(), global_id=gid, history=history)
        r.close()
    except Exception as exc:
        view["error"] = str(exc)
        return view
    if seg_history and history != seg_history:
        view.update(lag=None, standing="another history: Redis was flushed or restarted; the relay resets the bus")
    elif gid < seg_global_id:
        view.update(lag=None, standing=f"the segment is AHEAD of Redis by {seg_global_id - gid}: not this Redis?")
    else:
        view.update(lag=gid - seg_global_id, standing=f"segment lags by {gid - seg_global_id}")
    return view


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n:.1f} TiB"


def _fmt(msg: Any, as_json: bool) -> str:
    if as_json:
        return json.dumps(
            {
                "global_id": msg.global_id,
                "message_id": msg.message_id,
                "channel": msg.channel,
                "site_id": msg.site_id,
                "timestamp": msg.timestamp,
                "data": msg.data,
            },
            default=repr,
        )
    ts = _dt.datetime.fromtimestamp(msg.timestamp).strftime("%H:%M:%S.%f")[:-3]
    site = f" [{msg.site_id}]" if msg.site_id else ""
    return f"{ts} {msg.channel}{site} #{msg.message_id} (g{msg.global_id}) {json.dumps(msg.data, default=repr)}"


def cmd_tail(args: argparse.Namespace) -> int:
    _open_existing(args).close()
    bus = Bus(_bus_name(args), path=args.path, codec=args.codec, keepalive_interval=0)
    done = {"n": 0}

    def show(msg: Any) -> None:
        print(_fmt(msg, args.json), flush=True)
        done["n"] += 1

    start = None if args.last == 0 else -(args.last + 1)
    bus.subscribe(args.channel, show, start, pattern=args.pattern or False, site_id=args.site)
    try:
        deadline = time.monotonic() + args.timeout if args.timeout else None
        while deadline is None or time.monotonic() < deadline:
            if args.count and done["n"] >= args.count:
                break
            time.sleep(0.05)
    except KeyboardInterrupt:
        pass
    finally:
        bus.close()
    return 0


def cmd_publish(args: argparse.Namespace) -> int:
    data: Any = args.data
    if args.json_data:
        try:
            data = json.loads(args.data)
        except ValueError as exc:
            sys.exit(f"shmbus: DATA is not valid JSON: {exc}")
    try:  # create=False raises here: a mistyped name must not silently create a new bus
        bus = Bus(_bus_name(args), path=args.path, codec=args.codec, keepalive_interval=0, create=args.create)
        _ = bus.segment  # (or in the moment between the check and the attach)
    except FileNotFoundError:
        sys.exit(_no_such_bus(args) + " (pass --create to create it)")
    try:
        try:  # a bridged bus publishes through its engine (SHMBUS_ENGINE_URL or the segment's record)
            mid = bus.publish(
                args.channel,
                data,
                site_id=args.site,
                user_ids=args.user_id or None,
                group_ids=args.group_id or None,
                client_ids=args.client_id or None,
            )
        except EngineError as exc:  # BusBridged among them: it says what to configure
            sys.exit(f"shmbus: {exc}")
    finally:
        bus.close()
    print(json.dumps({"channel": args.channel, "message_id": mid}) if args.json else f"published #{mid}")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    infos = [describe(name, exclude_pid=os.getpid()) for name in bus_names()]
    if args.json:
        print(json.dumps([i.as_dict() for i in infos]))
        return 0
    if not infos:
        print("no bus on this host")
        return 0
    rows = [
        (
            ascii(i.bus)[1:-1],  # a name made by hand may hold a newline: one bus, one line
            _size(i.size_bytes),
            str(len(i.processes)) if i.problem is None else "-",
            _age(i.age_seconds) if i.problem is None else f"unreadable: {i.problem}",
        )
        for i in infos
    ]
    head = ("bus", "size", "processes", "age")
    widths = [max(len(r[c]) for r in [head, *rows]) for c in range(3)]
    for r in [head, *rows]:
        print(f"{r[0].ljust(widths[0])}  {r[1].rjust(widths[1])}  {r[2].rjust(widths[2])}  {r[3]}")
    return 0


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"


def cmd_destroy(args: argparse.Namespace) -> int:
    name = _bus_name(args)
    path = args.path or segment_path(check_bus_name(name))
    problem = removal_problem(path, args.force, exclude_pid=os.getpid())
    if problem:
        sys.exit(f"shmbus: {problem}")
    gone = os.path.lexists(path)
    if gone:
        try:
            os.unlink(path)  # unlink never follows a link (and removal_problem refused one)
        except FileNotFoundError:
            gone = False
        except OSError as exc:  # a directory with --force, a read-only mount: said, not a traceback
            sys.exit(f"shmbus: cannot remove {path!r}: {exc}")
    print(
        json.dumps({"bus": name, "destroyed": gone})
        if args.json
        else (f"destroyed {name}" if gone else f"no bus named {name!r}")
    )
    return 0 if gone else 1


def _seconds(value: str) -> float:
    """argparse type: a positive, finite number of seconds (``--watch -1`` or ``nan`` is refused up front)."""
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise argparse.ArgumentTypeError(f"{value!r}: must be a positive number of seconds")
    return seconds


def _count(value: str) -> int:
    """argparse type: a count of 0 or more (0: no limit)."""
    try:
        count = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if count < 0:
        raise argparse.ArgumentTypeError(f"{value!r}: must be 0 (no limit) or more")
    return count


def _ids(value: str) -> int | str:
    return int(value) if value.lstrip("-").isdigit() else value


def _guble_cli() -> Any:
    """The guble client lives with the guble adapter; imported only for that command (the core stays light)."""
    from shmbus.adapters.guble import cli

    return cli


def _client_cli() -> Any:
    """The HTTP client's command lives with the client (httpx is imported only for it)."""
    from shmbus.client import cli

    return cli


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="shmbus",
        description="Inspect and use a shmbus bus from the shell.",
        epilog="Run 'shmbus COMMAND --help' for a command's options. Bus names come from --bus, else $SHMBUS_NAME, "
        "else 'default'.",
    )
    out = argparse.ArgumentParser(add_help=False)
    out.add_argument("--json", action="store_true", help="machine-readable output (one JSON document)")
    common = argparse.ArgumentParser(add_help=False, parents=[out])
    common.add_argument("--bus", help="bus name (default: $SHMBUS_NAME, else 'default')")
    common.add_argument("--path", help="the file of a file-backed bus (Bus(path=...)) instead of /dev/shm")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def add(name: str, summary: str, description: str, parents: list[argparse.ArgumentParser]) -> Any:
        return sub.add_parser(name, parents=parents, help=summary, description=description)

    s = add(
        "stats",
        "segment, ids, channels, history, processes",
        "Show a bus: its segment and ring, global ids, how many seconds of history the ring holds, the "
        "attached processes (this command excluded) and every channel with its ids.",
        [common],
    )
    s.add_argument(
        "--redis", help="Redis URL of a bridged bus: show Redis's role, ids and the relay (default: $SHMBUS_REDIS_URL)"
    )
    s.add_argument(
        "--watch",
        nargs="?",
        const=1.0,
        type=_seconds,
        metavar="SECONDS",
        help="redraw every SECONDS (default 1) until Ctrl-C",
    )
    s.add_argument("--count", type=_count, default=0, help="with --watch: stop after N refreshes")
    s.set_defaults(fn=cmd_stats)
    tp = add(
        "top",
        "live figures: rates per worker, parked clients, ring, lag, relay",
        "Show the host's figures of a bus live (refreshed every second): publishes and deliveries per second "
        "per worker and in total, parked polls and open streams, the ring's fill and history, listener lag, "
        "messages lost, the relay's state and lag, and the busiest channels. Stop with Ctrl-C.",
        [common],
    )
    tp.add_argument("--interval", type=_seconds, default=1.0, help="seconds between refreshes (default 1)")
    tp.add_argument("--count", type=_count, default=0, help="stop after N refreshes (default: never)")
    tp.set_defaults(fn=cmd_top)
    t = add(
        "tail",
        "print messages as they are published",
        "Print messages of a channel (or of all channels) as they are published, optionally after the last "
        "N retained ones. Stop with Ctrl-C, --count or --timeout.",
        [common],
    )
    t.add_argument("channel", nargs="?", default=None, help="channel (or pattern with --pattern); all if omitted")
    t.add_argument("--pattern", choices=["glob", "prefix"], help="treat CHANNEL as a glob or a prefix")
    t.add_argument("--last", type=int, default=0, help="first show the last N retained messages (default 0)")
    t.add_argument("--count", type=int, default=0, help="exit after N messages (default: never)")
    t.add_argument("--timeout", type=float, default=0, help="exit after SECONDS (default: never)")
    t.add_argument("--site", default=None, help="only messages of this site id (multisite buses)")
    t.add_argument("--codec", default="json", help="the bus's codec: json or msgpack (default json)")
    t.set_defaults(fn=cmd_tail)
    pb = add(
        "publish",
        "publish one message",
        "Publish DATA on CHANNEL and print its message id. The bus must exist unless --create is given. On a "
        "bridged bus the message goes through the bus's engine: SHMBUS_ENGINE_URL, or the backend URL the segment "
        "records when it needs no password (else it stops and says what to set).",
        [common],
    )
    pb.add_argument("channel", help="the channel, e.g. /chat")
    pb.add_argument("data", help="the message (a string, or JSON with --json-data)")
    pb.add_argument("--json-data", action="store_true", help="parse DATA as JSON")
    pb.add_argument("--create", action="store_true", help="create the bus if it does not exist (default: refuse)")
    pb.add_argument("--site", default=None, help="the site id (multisite buses)")
    pb.add_argument("--user-id", action="append", type=_ids, help="deliver only to this user (repeatable)")
    pb.add_argument("--group-id", action="append", type=_ids, help="deliver only to this group (repeatable)")
    pb.add_argument("--client-id", action="append", help="deliver only to this client id (repeatable)")
    pb.add_argument("--codec", default="json", help="the bus's codec: json or msgpack (default json)")
    pb.set_defaults(fn=cmd_publish)
    ls = add(
        "list",
        "list the buses on this host",
        "List the shared-memory buses in /dev/shm: name, size, attached processes (this command excluded) and age.",
        [out],
    )
    ls.set_defaults(fn=cmd_list)
    d = add(
        "destroy",
        "remove a bus segment (all its history)",
        "Remove a bus's segment and all its history. Refused while other processes are attached (they would "
        "keep serving a segment nobody else can attach), and for a file that is not a shmbus segment, unless "
        "--force is given. A symbolic link is never followed nor removed.",
        [common],
    )
    d.add_argument(
        "--force", action="store_true", help="remove it even while processes are attached, or if it is not a segment"
    )
    d.set_defaults(fn=cmd_destroy)
    g = add(
        "guble",
        "a guble protocol client (like guble-cli)",
        "Connect to a guble WebSocket endpoint (shmbus.adapters.guble.GubleApp, or guble itself), send guble "
        "commands ('+ /foo 0', '- /foo', 'replay -1 /foo', '> /foo' then the body) and print what the server "
        "sends. Without --exit, commands are read from stdin, one per line ('?' for help).",
        [],
    )
    _guble_cli().add_arguments(g)
    g.set_defaults(fn=lambda args: _guble_cli().run(args))
    li = add(
        "listen",
        "follow channels of a message_bus server over HTTP",
        "Subscribe to channels of a message_bus server (shmbus's HTTP adapter, or the gem's) with the Python client "
        "(shmbus.client) and print each message as it arrives. Stop with Ctrl-C, --count or --timeout.",
        [],
    )
    _client_cli().add_arguments(li)
    li.set_defaults(fn=lambda args: _client_cli().run(args))
    args = p.parse_args(argv)
    from .errors import ShmbusError

    try:
        return int(args.fn(args))
    except ShmbusError as exc:
        sys.exit(f"shmbus: {exc}")
    except BrokenPipeError:  # `shmbus stats --json | head`: the reader left; that is not an error
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
