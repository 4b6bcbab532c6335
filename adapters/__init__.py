"""Web and engine adapters for shmbus.

Web: ``protocol`` (sans-IO core), ``wsgi``/``asgi`` (MessageBusMiddleware), ``falcon``, ``flask``, ``starlette``,
``gunicorn`` (config module with hooks), ``uwsgi``.
"""
