"""``shmbus guble``: a command-line guble client, like guble-cli, for trying a guble endpoint by hand.

Commands are guble's (``+ /foo 0``, ``- /foo``, ``replay -1 /foo``); a send is ``> /foo [id]`` followed by the
body on the next line (interactively) or as the next argument. Everything the server sends is printed as is.
Needs the ``websockets`` package (the ``web`` extra).
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["add_arguments", "run"]

DEFAULT_URL = "ws://127.0.0.1:8000/stream/"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("commands", nargs="*", help="commands to send first (a '> /path' command takes the next as body)")
    p.add_argument("--url", default=DEFAULT_URL, help=f"the guble WebSocket URL (default {DEFAULT_URL})")
    p.add_argument("--user", help="connect as guble-cli does, to <url>user/<USER> (the server's lookups decide)")
    p.add_argument("--header", action="append", default=[], metavar="NAME:VALUE", help="extra handshake header")
    p.add_argument("-x", "--exit", action="store_true", help="exit after the commands (and --wait of quiet)")
    p.add_argument("--wait", type=float, default=1.0, help="with --exit: seconds of quiet before exiting (1)")


def _commands(items: list[str]) -> Iterator[str]:
    """Positional arguments as frames: ``> /path`` takes the next argument as its body."""
    it = iter(items)
    for item in it:
        if item.startswith(">") and "\n" not in item:
            yield f"{item}\n\n{next(it, '')}"
        else:
            yield item


def _interactive() -> Iterator[str]:
    for line in sys.stdin:
        line = line.rstrip("\n")
        if not line.strip():
            continue
        if line.strip() == "?":
            print(__doc__, file=sys.stderr)
            continue
        if line.startswith(">"):
            body = sys.stdin.readline().rstrip("\n")
            yield f"{line}\n\n{body}"
        else:
            yield line


def run(args: argparse.Namespace) -> int:
    try:
        from websockets.exceptions import ConnectionClosed
        from websockets.sync.client import connect
    except ImportError:
        sys.exit("shmbus guble: needs the websockets package (pip install 'shmbus[web]')")
    url = args.url
    if args.user:
        url = url.rstrip("/") + "/user/" + args.user
    headers: dict[str, str] = {}
    for h in args.header:
        name, sep, value = h.partition(":")
        if not sep or not name.strip():
            sys.exit(f"shmbus guble: --header needs NAME:VALUE, got {h!r}")
        headers[name.strip()] = value.strip()
    try:
        conn: Any = connect(url, additional_headers=headers, open_timeout=10, proxy=None)
    except (OSError, ValueError) as exc:
        sys.exit(f"shmbus guble: cannot connect to {url}: {exc}")
    done = threading.Event()
    quiet = threading.Event()

    def reader() -> None:
        try:
            while True:
                try:
                    frame = conn.recv(timeout=args.wait if args.exit else None)
                except TimeoutError:
                    quiet.set()
                    continue
                quiet.clear()
                text = frame if isinstance(frame, str) else frame.decode("utf-8", "replace")
                print(text, flush=True)
        except ConnectionClosed:
            pass
        finally:
            done.set()

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    try:
        for command in _commands(args.commands):
            conn.send(command)
        if args.exit:
            quiet.clear()
            while not done.is_set() and not quiet.wait(0.05):
                pass
        else:
            for command in _interactive():
                conn.send(command)
    except KeyboardInterrupt:
        pass
    finally:
        conn.close()
        thread.join(2)
    return 0
