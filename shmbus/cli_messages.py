"""``shmbus tail`` and ``shmbus publish``: messages from and to a bus on this host."""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
import time
from typing import Any

from .bus import Bus
from .cli_args import bus_name, ids, no_such_bus, open_existing
from .errors import EngineError

__all__ = ["add_publish_arguments", "add_tail_arguments", "cmd_publish", "cmd_tail"]


def add_tail_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("channel", nargs="?", default=None, help="channel (or pattern with --pattern); all if omitted")
    p.add_argument("--pattern", choices=["glob", "prefix"], help="treat CHANNEL as a glob or a prefix")
    p.add_argument("--last", type=int, default=0, help="first show the last N retained messages (default 0)")
    p.add_argument("--count", type=int, default=0, help="exit after N messages (default: never)")
    p.add_argument("--timeout", type=float, default=0, help="exit after SECONDS (default: never)")
    p.add_argument("--site", default=None, help="only messages of this site id (multisite buses)")
    p.add_argument("--codec", default="json", help="the bus's codec: json or msgpack (default json)")


def add_publish_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("channel", help="the channel, e.g. /chat")
    p.add_argument("data", help="the message (a string, or JSON with --json-data)")
    p.add_argument("--json-data", action="store_true", help="parse DATA as JSON")
    p.add_argument("--create", action="store_true", help="create the bus if it does not exist (default: refuse)")
    p.add_argument("--site", default=None, help="the site id (multisite buses)")
    p.add_argument("--user-id", action="append", type=ids, help="deliver only to this user (repeatable)")
    p.add_argument("--group-id", action="append", type=ids, help="deliver only to this group (repeatable)")
    p.add_argument("--client-id", action="append", help="deliver only to this client id (repeatable)")
    p.add_argument("--codec", default="json", help="the bus's codec: json or msgpack (default json)")


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
    """print messages as they are published

    Print messages of a channel (or of all channels) as they are published, optionally after the last N retained
    ones. Stop with Ctrl-C, --count or --timeout.
    """
    open_existing(args).close()
    bus = Bus(bus_name(args), path=args.path, codec=args.codec, keepalive_interval=0)
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
    """publish one message

    Publish DATA on CHANNEL and print its message id. The bus must exist unless --create is given. On a bridged
    bus the message goes through the bus's engine: SHMBUS_ENGINE_URL, or the backend URL the segment records
    when it needs no password (else it stops and says what to set).
    """
    data: Any = args.data
    if args.json_data:
        try:
            data = json.loads(args.data)
        except ValueError as exc:
            sys.exit(f"shmbus: DATA is not valid JSON: {exc}")
    try:  # create=False raises here: a mistyped name must not silently create a new bus
        bus = Bus(bus_name(args), path=args.path, codec=args.codec, keepalive_interval=0, create=args.create)
        _ = bus.segment  # (or in the moment between the check and the attach)
    except FileNotFoundError:
        sys.exit(no_such_bus(args) + " (pass --create to create it)")
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
