"""``shmbus listen URL CHANNEL[=ID]...``: print what a message_bus server sends, like ``tail -f`` for a remote bus.

Lives with the client (httpx is imported only for this command); ``shmbus.cli`` adds it to the subcommands.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import queue
import sys
import time
from typing import Any

from shmbus.cli_args import count as _count  # the command line's own validators
from shmbus.cli_args import seconds as _seconds

__all__ = ["add_arguments", "parse_channel", "run"]


def parse_channel(value: str) -> tuple[str, int]:
    """argparse type: ``/chat`` (from now), ``/chat=0`` (the backlog too), ``/chat=12``, ``/chat=-3``."""
    channel, sep, last = value.rpartition("=")
    if not sep or not last.lstrip("-").isdigit():
        channel, last = value, "-1"
    if not channel.startswith("/"):
        raise argparse.ArgumentTypeError(f"{value!r}: a channel starts with '/' (e.g. /chat or /chat=0)")
    return channel, int(last)


def _header(value: str) -> tuple[str, str]:
    name, sep, val = value.partition(":")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"{value!r}: a header is 'Name: value'")
    return name.strip(), val.strip()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", help="the server's base URL (where message-bus/ is mounted), e.g. https://example.com")
    p.add_argument(
        "channels",
        nargs="+",
        type=parse_channel,
        metavar="CHANNEL[=ID]",
        help="channel to follow, from now, or after message ID (0: the backlog too; -N: the last N-1 too)",
    )
    p.add_argument("--json", action="store_true", help="one JSON object per message")
    p.add_argument("--count", type=_count, default=0, help="exit after N messages (default: never)")
    p.add_argument("--timeout", type=_seconds, default=0, help="exit after SECONDS (default: never)")
    p.add_argument("-H", "--header", action="append", type=_header, default=[], help="'Name: value' (repeatable)")
    p.add_argument("--poll", action="store_true", help="short polls (?dlp=t) instead of long polls")


def _line(msg: Any, as_json: bool) -> str:
    if as_json:
        fields = {"channel": msg.channel, "message_id": msg.message_id, "global_id": msg.global_id, "data": msg.data}
        return json.dumps(fields)
    ts = _dt.datetime.now().strftime("%H:%M:%S.%f")[:-3]
    return f"{ts} {msg.channel} #{msg.message_id} (g{msg.global_id}) {json.dumps(msg.data)}"


def run(args: argparse.Namespace) -> int:
    try:
        from shmbus.client import MessageBusClient
    except ImportError as exc:
        sys.exit(f"shmbus: 'listen' needs the client extra: pip install 'shmbus[client]' ({exc})")
    options: dict[str, Any] = {"headers": dict(args.header)}
    if args.poll:
        options.update(long_polling=False, background_callback_interval=1.0)
    try:
        client = MessageBusClient(args.url, **options)
    except ValueError as exc:
        sys.exit(f"shmbus: {exc}")
    arrived: queue.SimpleQueue[Any] = queue.SimpleQueue()
    for channel, last_id in args.channels:
        client.subscribe(channel, arrived.put, last_id)
    deadline = time.monotonic() + args.timeout if args.timeout else None
    shown = 0
    try:
        client.start()
        while not args.count or shown < args.count:
            wait = None if deadline is None else deadline - time.monotonic()
            if wait is not None and wait <= 0:
                break
            try:
                msg = arrived.get(timeout=wait)
            except queue.Empty:
                break
            print(_line(msg, args.json), flush=True)
            shown += 1
    except KeyboardInterrupt:
        pass
    finally:
        client.stop()
    return 0
