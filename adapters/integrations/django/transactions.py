"""``publish_on_commit``: publish when the surrounding database transaction commits, never for a rolled-back one.

A browser told about a row before the row's transaction commits asks for it and gets a 404 (or stale data);
told about a row whose transaction then rolls back, it shows something that never existed. Publishing from
``transaction.on_commit`` avoids both. The message is checked and encoded at the call, inside the view: a bad
channel, target or value raises there (a typed error, before anything is committed), and changes made to
``data`` afterwards do not alter what is published.
"""

from __future__ import annotations

from typing import Any

from shmbus.bus import Bus
from shmbus.bus.publishing import PublishOptions
from shmbus.bus.validation import check_count, check_seconds, check_targets
from shmbus.channels import check_channel, check_site
from shmbus.errors import InvalidMessage

__all__ = ["publish_on_commit"]


def publish_on_commit(
    channel: str,
    data: Any,
    *,
    using: str | None = None,
    robust: bool = False,
    bus: Bus | None = None,
    **options: Any,
) -> None:
    """Publish ``data`` on ``channel`` once the transaction of database ``using`` commits.

    ``options`` are :meth:`shmbus.Bus.publish`'s (``user_ids``, ``group_ids``, ``client_ids``, ``site_id``,
    ``max_backlog_size``, ``max_backlog_age``, ``engine``). Outside a transaction (autocommit) Django runs the
    callback at once, so this publishes at once. ``robust=True`` logs a failed publish instead of raising it
    from the commit (Django's ``on_commit(robust=...)``; the transaction is committed either way). ``bus``
    defaults to the bus of ``settings.SHMBUS``. Raises what ``publish`` would for bad input, at the call.
    """
    from django.db import transaction

    from .runtime import get_bus

    target = bus if bus is not None else get_bus()
    check_channel(channel)
    unknown = sorted(set(options) - set(PublishOptions.__annotations__))
    if unknown:
        raise TypeError(f"unknown publish option(s) {unknown}; known: {sorted(PublishOptions.__annotations__)}")
    for name in ("client_ids", "user_ids", "group_ids"):
        check_targets(name, options.get(name))
    if options.get("site_id") is not None:
        check_site(options["site_id"])
    if options.get("max_backlog_size") is not None:
        check_count("max_backlog_size", options["max_backlog_size"], error=InvalidMessage)
    if options.get("max_backlog_age") is not None:
        check_seconds("max_backlog_age", options["max_backlog_age"], error=InvalidMessage)
    try:
        payload = target.codec.encode(data)
    except (TypeError, ValueError, OverflowError) as exc:
        raise TypeError(
            f"cannot encode data published on {channel!r} with the {target.codec.name} codec: {exc}"
        ) from None

    def publish() -> None:
        target.publish_encoded(channel, payload, **options)

    transaction.on_commit(publish, using=using, robust=robust)
