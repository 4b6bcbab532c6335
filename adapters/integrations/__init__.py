"""Glue for frameworks and servers: ``falcon``, ``flask``, ``starlette`` (mount the middleware on an app),
``django`` (an app for ``INSTALLED_APPS``) and ``gunicorn``, ``uwsgi`` (fork hooks and worker facts). Import the
one you use; each needs its framework."""
