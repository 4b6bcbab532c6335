"""The chat's user id lookup: the user name, so that the room's presence list reads as names."""

from __future__ import annotations

from typing import Any


def username(request: Any) -> str | None:
    """The signed-in user's name (``request.user`` is set from the session cookie by the integration)."""
    user = getattr(request, "user", None)
    return user.get_username() if user is not None and user.is_authenticated else None
