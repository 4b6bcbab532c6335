"""Web and engine adapters for shmbus (imported as ``shmbus.adapters.*``; each needs its own extra).

Web: ``http`` (the sans-IO message_bus protocol core), ``wsgi``/``asgi`` (``MessageBusMiddleware``),
``asgi_support`` (the ASGI types and small helpers every ASGI app here shares), ``looptap`` (per-event-loop bus
taps), ``integrations`` (``falcon``, ``flask``, ``starlette``, ``django``; ``gunicorn``, a config module with hooks;
``uwsgi``), ``server`` (a lean asyncio HTTP server and gunicorn worker class for many held polls, and
``server.uvicorn_worker``: gunicorn's uvicorn worker with request-head and body deadlines).
Beyond the gem: ``transports`` (``sse``, Server-Sent Events with resume; ``websocket``, a guble-style JSON
protocol; ``rest``, guble's REST publish), ``guble`` (guble's own protocol and CLI), ``push`` (Web Push).
Operations: ``metrics`` (Prometheus text), ``admin`` (a live admin page).
Engines and data: ``bridge`` (the kit the bridges share), ``redis`` (multi-host through Redis, the gem's key
layout), ``postgres`` (multi-host through PostgreSQL), ``spark`` (PySpark source and sink).
"""
