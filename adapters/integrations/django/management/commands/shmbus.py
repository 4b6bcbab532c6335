"""``manage.py shmbus stats|tail|publish|top [options]``: the ``shmbus`` command line on the bus of
``settings.SHMBUS`` (its name, its ``path`` if file-backed, and for ``stats`` its Redis bridge's URL)."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

SUBCOMMANDS = ("stats", "tail", "publish", "top")


class Command(BaseCommand):  # type: ignore[misc]  # Django ships no type hints
    help = (
        "Run the shmbus command line (stats, tail, publish, top) on the bus of settings.SHMBUS. "
        "Options after the subcommand are shmbus's: 'manage.py shmbus tail /chat --last 10', "
        "'manage.py shmbus publish /chat \"hi\"'; 'manage.py shmbus stats -- --help' lists them."
    )
    requires_system_checks: list[str] = []  # a broken setting is reported by the CLI's own error, not hidden

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("subcommand", choices=SUBCOMMANDS, help="the shmbus command to run")
        parser.add_argument("cli_args", nargs=argparse.REMAINDER, help="its arguments (see shmbus COMMAND --help)")

    def handle(self, *args: Any, **options: Any) -> None:
        from shmbus.cli import main

        from ...runtime import bus_settings

        conf = bus_settings()
        argv = [options["subcommand"], *[a for a in options["cli_args"] if a != "--"]]
        if "--bus" not in argv and "--path" not in argv:
            argv += ["--bus", conf.bus]
            if conf.bus_options.get("path"):
                argv += ["--path", str(conf.bus_options["path"])]
        if argv[0] == "stats" and conf.engine_scheme in ("redis", "rediss") and "--redis" not in argv:
            argv += ["--redis", str(conf.engine)]
        codec = conf.bus_options.get("codec")
        if argv[0] in ("tail", "publish") and isinstance(codec, str) and "--codec" not in argv:
            argv += ["--codec", codec]
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse and the CLI's refusals exit; a management command raises
            if exc.code in (0, None):
                return
            raise CommandError(str(exc.code) if isinstance(exc.code, str) else f"shmbus {argv[0]} failed") from None
        if code:
            raise CommandError(f"shmbus {argv[0]} exited with {code}")
