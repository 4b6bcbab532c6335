"""``shmbus listen URL CHANNEL[=ID]...``: print what a message_bus server sends, like ``tail -f`` for a remote bus.

Lives with the client (httpx is imported only for this command); ``shmbus.cli`` adds it to the subcommands.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import queue
import select
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from shmbus.cli_args import count as _count  # the command line's own validators
from shmbus.cli_args import seconds as _seconds
from shmbus.threads import interruptible_get, start_without_signals

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


#: put in the message queue by the stdout watcher: the reader of our output is gone
_STDOUT_CLOSED = object()


def watch_stdout(on_closed: Callable[[], None]) -> threading.Thread | None:
    """Call ``on_closed`` once stdout's reader goes: a pipe whose reader exited (``| head -2``) reports POLLERR
    on its write end, a hung-up terminal or a closed socket POLLHUP. Without it a quiet channel kept ``listen``
    (and the server's long poll) alive until the next message's write failed, minutes later.

    A thread blocked in ``poll`` on no event at all (only errors and hang-ups are reported): no timer, no CPU.
    None when stdout has no descriptor (a test's capture); a regular file never reports, so nothing ends early.
    """
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return None
    poller = select.poll()
    poller.register(fd, 0)

    def watch() -> None:
        while not poller.poll():  # an empty answer cannot come without a timeout; kept for safety
            pass
        on_closed()

    thread = threading.Thread(target=watch, name="shmbus-listen-stdout", daemon=True)
    start_without_signals(thread)  # Ctrl-C goes to the main thread, which acts on it
    return thread


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
    watch_stdout(lambda: arrived.put(_STDOUT_CLOSED))
    try:
        client.start()
        while not args.count or shown < args.count:
            wait = None if deadline is None else deadline - time.monotonic()
            if wait is not None and wait <= 0:
                break
            try:
                msg = interruptible_get(arrived, wait)  # Ctrl-C ends it, whenever it lands
            except queue.Empty:
                break
            if msg is _STDOUT_CLOSED:  # shmbus.cli.main ends quietly, as for a failed write
                raise BrokenPipeError("stdout's reader is gone")
            print(_line(msg, args.json), flush=True)
            shown += 1
    except KeyboardInterrupt:
        pass
    finally:
        client.stop()
    return 0
