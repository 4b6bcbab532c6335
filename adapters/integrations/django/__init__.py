"""Django, as a first-class integration: an app, one setting, the WSGI and ASGI entry points, and
``publish_on_commit``.

``settings.py``::

    INSTALLED_APPS = [..., "shmbus.adapters.integrations.django"]
    SHMBUS = {"BUS": "myapp"}      # the keys: shmbus.adapters.integrations.django.conf

``wsgi.py`` / ``asgi.py``::

    from shmbus.adapters.integrations.django import get_wsgi_application   # or get_asgi_application
    application = get_wsgi_application()

In a view::

    from shmbus.adapters.integrations.django import publish_on_commit
    publish_on_commit(f"/rooms/{room.pk}", {"text": msg.text})   # sent when the transaction commits

``get_bus()`` is the process's bus for anything else (``subscribe``, ``backlog``, ``DistributedCache``);
``manage.py shmbus stats|tail|publish|top`` runs the CLI on it. The whole story: docs/django.md.
"""

from __future__ import annotations

from .runtime import get_bus
from .serving import get_asgi_application, get_wsgi_application
from .transactions import publish_on_commit

__all__ = ["get_asgi_application", "get_bus", "get_wsgi_application", "publish_on_commit"]
