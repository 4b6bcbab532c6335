"""The same project under an ASGI server::

gunicorn -k shmbus.adapters.server.uvicorn_worker.UvicornWorker -w 2 chat.asgi:application
"""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chat.settings")

from shmbus.adapters.integrations.django import get_asgi_application

application = get_asgi_application()
