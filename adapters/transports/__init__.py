"""Transports beyond the gem's polling: ``sse`` (Server-Sent Events with resume), ``websocket`` (a guble-style JSON
protocol) and ``rest`` (guble's REST publish), on one per-loop ``hub`` of subscriptions."""
