"""The project's ``SUBSCRIBE_ALLOWED``: ``/staff/...`` channels are read by members of the ``staff`` group only."""

from __future__ import annotations

from typing import Any


def may_subscribe(info: Any, channel: str) -> bool:
    """``info.request`` is the Django request built for the poll (session and user set), ``info.user_id`` what
    ``USER_ID_LOOKUP`` returned for it."""
    if not channel.startswith("/staff/"):
        return True
    user = info.request.user
    return bool(info.user_id == user.pk and user.is_authenticated and user.groups.filter(name="staff").exists())
