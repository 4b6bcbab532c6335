"""Web and engine adapters for shmbus (imported as ``shmbus.adapters.*``; each needs its own extra).

Web: ``protocol`` (the sans-IO message_bus protocol core), ``wsgi``/``asgi`` (``MessageBusMiddleware``),
``falcon``, ``flask``, ``starlette`` (framework glue), ``gunicorn`` (config module with hooks), ``uwsgi``,
``server`` (a lean asyncio HTTP server and gunicorn worker class for many held polls), ``uvicorn_worker``
(gunicorn's uvicorn worker with request-head and body deadlines).
Beyond the gem: ``sse`` (Server-Sent Events with resume), ``websocket`` (guble-style JSON protocol), ``rest``
(guble's REST publish).
Engines and data: ``redis_bridge`` (multi-host through Redis, the gem's key layout), ``spark`` (PySpark source and
sink).
"""
