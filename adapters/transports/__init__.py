"""Transports beyond the gem's polling: ``sse`` (Server-Sent Events with resume; ``sse_wsgi`` for WSGI apps),
``websocket`` (a guble-style JSON protocol) and ``rest`` (guble's REST publish).

What they share, one idea a module: ``validation`` (what a client may send), ``identity`` (who a connection is,
from the middleware's lookups), ``replay`` (what a client missed since an id, and gaps), ``hub`` (the live
fan-out: one bus tap per process, a sink per connection), ``connection`` (the object an app's hooks see) and
``app`` (the options and hooks the SSE and WebSocket apps have in common)."""
