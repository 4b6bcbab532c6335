"""Loaded by every Python process a benchmark starts (``perf/run`` puts this folder on ``PYTHONPATH``).

It records each log record at ERROR or above, and each exception that escapes a thread, in the file named by
``SHMBUS_PERF_ERRORS`` (one line each, appended by every process), so that ``perf/run`` can fail a benchmark whose
workers logged an error, as a test would, while its figures still print. It changes no logging configuration:
it wraps ``Logger.handle`` instead of adding a handler, so the benchmarks' own ``basicConfig`` still works.
"""

from __future__ import annotations

import logging
import os
import threading

_PATH = os.environ.get("SHMBUS_PERF_ERRORS")


def _note(text: str) -> None:
    if not _PATH:
        return
    try:
        with open(_PATH, "a", encoding="utf-8") as f:
            f.write(f"pid {os.getpid()}: {text.replace(chr(10), ' | ')[:2000]}\n")
    except OSError:
        pass


if _PATH:
    _handle = logging.Logger.handle

    def _handle_and_note(self: logging.Logger, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR:
            try:
                message = record.getMessage()
            except Exception:  # a record whose arguments do not format: note what there is
                message = str(record.msg)
            _note(
                f"{record.levelname} {record.name}: {message}"
                + (
                    f" ({record.exc_info[0].__name__}: {record.exc_info[1]})"
                    if record.exc_info and record.exc_info[0]
                    else ""
                )
            )
        _handle(self, record)

    logging.Logger.handle = _handle_and_note  # type: ignore[method-assign]

    _thread_hook = threading.excepthook

    def _thread_hook_and_note(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is not SystemExit:
            _note(f"uncaught {args.exc_type.__name__} in thread {getattr(args.thread, 'name', '?')}: {args.exc_value}")
        _thread_hook(args)

    threading.excepthook = _thread_hook_and_note
