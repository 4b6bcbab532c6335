"""``shmbus`` command line: inspect and poke a bus from a shell (stats, tail, publish, list, destroy), follow
a remote one over HTTP (listen), talk guble's protocol (guble), run the development push service (push-dev).

Every subcommand attaches to an existing bus only (``publish --create`` may create one), and never counts
itself among the bus's processes.
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
from collections.abc import Callable
from typing import Any

from .cli_buses import add_destroy_arguments, cmd_destroy, cmd_list
from .cli_messages import add_publish_arguments, add_tail_arguments, cmd_publish, cmd_tail
from .cli_stats import add_stats_arguments, add_top_arguments, cmd_stats, cmd_top
from .errors import ShmbusError
from .providers import TOOLS, provider


def _guble_cli() -> Any:
    """The guble client lives with the guble adapter: its module is the ``guble`` tool the installed package
    provides (:mod:`shmbus.providers`), imported for that command only (the core imports no adapter, and stays
    light)."""
    return provider(TOOLS, "guble")


def _client_cli() -> Any:
    """The HTTP client's command lives with the client (httpx is imported only for it)."""
    from shmbus.client import cli

    return cli


def cmd_guble(args: argparse.Namespace) -> int:
    """a guble protocol client (like guble-cli)

    Connect to a guble WebSocket endpoint (shmbus.adapters.guble.GubleApp, or guble itself), send guble commands
    ('+ /foo 0', '- /foo', 'replay -1 /foo', '> /foo' then the body) and print what the server sends. Without
    --exit, commands are read from stdin, one per line ('?' for help).
    """
    return int(_guble_cli().run(args))


def cmd_listen(args: argparse.Namespace) -> int:
    """follow channels of a message_bus server over HTTP

    Subscribe to channels of a message_bus server (shmbus's HTTP adapter, or the gem's) with the Python client
    (shmbus.client) and print each message as it arrives. Stop with Ctrl-C, --count or --timeout.
    """
    return int(_client_cli().run(args))


def _push_dev_cli() -> Any:
    """The development push service lives with the push adapter (and needs its extra): its module is the
    ``push-dev`` tool the installed package provides (:mod:`shmbus.providers`)."""
    try:
        return provider(TOOLS, "push-dev")
    except ImportError as exc:
        sys.exit(f"shmbus push-dev: needs the push extra (pip install 'shmbus[push]'): {exc}")


def cmd_push_dev(args: argparse.Namespace) -> int:
    """run a development push service (local Web Push stand-in; not for production)

    A local stand-in for the browsers' push services, for development and tests only: it hands out push
    subscriptions (POST /subscriptions), takes Web Push requests to them as a real push service would (RFC 8030,
    VAPID, aes128gcm), decrypts them with the subscriptions' keys and shows them (GET /, GET /deliveries). It
    prints its URL first. Point an app at it as docs/push.md says ('The development push service'); the demo:
    scripts/demo --push-dev URL. 'shmbus push-dev --help' for its options.
    """
    return int(_push_dev_cli().main(args.rest, prog="shmbus push-dev"))


Run = Callable[[argparse.Namespace], int]
Arguments = Callable[[argparse.ArgumentParser], None]

#: Every command: how it runs (its docstring is its summary, a blank line, its description), its own arguments,
#: and which shared ones it takes ("common": --bus, --path and --json; "out": --json only; "": none).
COMMANDS: list[tuple[Run, Arguments | None, str]] = [
    (cmd_stats, add_stats_arguments, "common"),
    (cmd_top, add_top_arguments, "common"),
    (cmd_tail, add_tail_arguments, "common"),
    (cmd_publish, add_publish_arguments, "common"),
    (cmd_list, None, "out"),
    (cmd_destroy, add_destroy_arguments, "common"),
    (cmd_guble, lambda p: _guble_cli().add_arguments(p), ""),
    (cmd_listen, lambda p: _client_cli().add_arguments(p), ""),
    (cmd_push_dev, None, ""),  # its options are the push adapter's own: main() hands them over unparsed
]


def parser() -> argparse.ArgumentParser:
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
    shared = {"common": [common], "out": [out], "": []}
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    for run, arguments, parents in COMMANDS:
        summary, _, description = (inspect.getdoc(run) or "").partition("\n\n")
        name = run.__name__.removeprefix("cmd_").replace("_", "-")
        cmd = sub.add_parser(name, parents=shared[parents], help=summary, description=" ".join(description.split()))
        if arguments is not None:
            arguments(cmd)
        cmd.set_defaults(fn=run)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["push-dev"]:  # parsed where they are defined (the push extra is imported for it alone)
        return cmd_push_dev(argparse.Namespace(rest=argv[1:]))
    args = parser().parse_args(argv)
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
