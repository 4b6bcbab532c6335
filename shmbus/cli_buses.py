"""``shmbus list`` and ``shmbus destroy``: the buses of this host."""

from __future__ import annotations

import argparse
import json
import os
import sys

from .buses import bus_names, describe, not_found_message, removal_problem
from .channels import check_bus_name
from .cli_args import bus_name, human_size
from .segment import segment_path

__all__ = ["add_destroy_arguments", "cmd_destroy", "cmd_list"]


def add_destroy_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--force", action="store_true", help="remove it even while processes are attached, or if it is not a segment"
    )


def cmd_list(args: argparse.Namespace) -> int:
    """list the buses on this host

    List the shared-memory buses in /dev/shm: name, size, attached processes (this command excluded) and age.
    """
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
            human_size(i.size_bytes),
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
    """remove a bus segment (all its history)

    Remove a bus's segment and all its history. Refused while other processes are attached (they would keep
    serving a segment nobody else can attach), and for a file that is not a shmbus segment, unless --force is
    given. A symbolic link is never followed nor removed.
    """
    name = bus_name(args)
    path = args.path or segment_path(check_bus_name(name))
    named = None if args.path and not args.bus else name  # --path alone: the file, whatever bus it holds
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
    print(json.dumps({"bus": named, "path": path, "destroyed": gone}) if args.json else _said(named, path, gone))
    return 0 if gone else 1


def _said(named: str | None, path: str, gone: bool) -> str:
    """What destroy did, naming what it removed: the bus and its segment's path, or the path alone when only
    ``--path`` chose it (the name is then the default one, not this file's: ``destroyed default`` misled)."""
    if named is None:
        return f"destroyed the bus at {path}" if gone else f"no bus at {path}"
    return f"destroyed bus {named!r} ({path})" if gone else not_found_message(named, path)
