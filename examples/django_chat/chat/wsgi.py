"""gunicorn's entry point: Django behind the message_bus routes (``SHMBUS`` in settings.py)."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chat.settings")

from shmbus.adapters.integrations.django import get_wsgi_application

application = get_wsgi_application()
