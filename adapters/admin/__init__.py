"""A live admin page for a bus: rates, parked clients per worker, the ring, lag, relay, busiest channels, a tail.

Mount :class:`AdminApp` (ASGI) or :class:`AdminWSGIApp` like the message-bus middleware, with the same
``is_admin_lookup``; anyone it refuses gets 403::

    app = AdminApp(app, bus=bus, is_admin_lookup=lambda scope: is_staff(scope))

Figures are host-wide (read from the segment), so whichever worker answers shows every worker. The page is fed
over the bus's own SSE transport (see :mod:`shmbus.adapters.admin.app`). The plots use uPlot (MIT), vendored in
``static/`` with its license.
"""

from .app import AdminApp, AdminWSGIApp
from .sampler import Sampler, read_tail

__all__ = ["AdminApp", "AdminWSGIApp", "Sampler", "read_tail"]
