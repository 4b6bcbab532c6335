"""The smoke-test WSGI app under uWSGI: the same app as webapps.py plus the uWSGI postfork glue."""

from webapps import wsgi_app

import shmbus.adapters.integrations.uwsgi  # noqa: F401  (registers the postfork hook)

application = wsgi_app
