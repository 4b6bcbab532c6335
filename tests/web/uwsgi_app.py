"""The smoke-test WSGI app under uWSGI: the same app as webapps.py plus the uWSGI postfork glue."""

import shmbus.adapters.integrations.uwsgi  # noqa: F401  (registers the postfork hook)
from tests.web.webapps import wsgi_app

application = wsgi_app
