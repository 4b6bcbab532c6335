import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "djtest.settings")

from shmbus.adapters.integrations.django import get_wsgi_application

application = get_wsgi_application()
