"""guble's wire protocol on a shmbus bus: ``from shmbus.adapters.guble import GubleApp`` (docs/transports.md)."""

from .app import GubleApp, GubleRestPublish, user_topic_owner
from .protocol import BadRequest, format_message, notification, parse_command

__all__ = [
    "BadRequest",
    "GubleApp",
    "GubleRestPublish",
    "format_message",
    "notification",
    "parse_command",
    "user_topic_owner",
]
