"""Web Push (RFC 8030, 8291, 8292) for a shmbus bus: guble's push connector on today's browser standard.

``PushConnector`` (in every worker; one sender is elected across workers and hosts) pushes each message on a
pushing channel to the devices it is meant for; ``PushApp``/``PushWSGIApp`` let a signed-in browser register its
``PushSubscription``; ``VapidKeys`` is the server's identity; ``publish_push`` publishes with TTL, Urgency and
Topic. Needs the ``[push]`` extra. See docs/push.md.
"""

from .addresses import DEFAULT_PORTS, public_address
from .app import PushApp, PushWSGIApp
from .connector import PushConnector
from .election import Elector, FileElector
from .options import MAX_PLAINTEXT, PushOptions, publish_push
from .state import SenderState, StaleSender, Store
from .stores import FileStore, store_for
from .subscriptions import Registration, default_endpoint_allowed
from .vapid import VapidKeys

__all__ = [
    "DEFAULT_PORTS",
    "MAX_PLAINTEXT",
    "Elector",
    "FileElector",
    "FileStore",
    "PushApp",
    "PushConnector",
    "PushOptions",
    "PushWSGIApp",
    "Registration",
    "SenderState",
    "StaleSender",
    "Store",
    "VapidKeys",
    "default_endpoint_allowed",
    "public_address",
    "publish_push",
    "store_for",
]
