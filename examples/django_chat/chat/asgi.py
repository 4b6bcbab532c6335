"""The same under an ASGI server: ``gunicorn -k shmbus.adapters.server.uvicorn_worker.UvicornWorker chat.asgi:application``."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chat.settings")

from shmbus.adapters.integrations.django import get_asgi_application  # noqa: E402

application = get_asgi_application()
