import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "djtest.settings")

from shmbus.adapters.integrations.django import get_asgi_application

application = get_asgi_application()
