"""Settings of the Django project the tests serve: the bus name and database come from the environment.

``SHMBUS_TEST_BUS`` the bus; ``SHMBUS_TEST_SQLITE`` an SQLite file, or ``SHMBUS_TEST_PG`` a PostgreSQL URL.
"""

from __future__ import annotations

import os
from urllib.parse import unquote, urlsplit

SECRET_KEY = "tests-only"
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
ROOT_URLCONF = f"{__package__}.urls"  # djtest.urls in a served child, tests.django.djtest.urls in pytest
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "shmbus.adapters.integrations.django",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
]
TEMPLATES: list[dict[str, object]] = []
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # tests only: fast logins
SHMBUS = {
    "BUS": os.environ.get("SHMBUS_TEST_BUS", "djtest"),
    "BUS_OPTIONS": {"ring_size": 1 << 20, "max_channels": 256, "keepalive_interval": 0},
    "MIDDLEWARE": {"long_polling_interval": 5},
    "SUBSCRIBE_ALLOWED": f"{__package__}.permissions.may_subscribe",
}


def _database() -> dict[str, object]:
    pg = os.environ.get("SHMBUS_TEST_PG")
    if pg:
        url = urlsplit(pg)
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": url.path.lstrip("/"),
            "USER": unquote(url.username or ""),
            "PASSWORD": unquote(url.password or ""),
            "HOST": url.hostname or "",
            "PORT": str(url.port or ""),
        }
    return {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ.get("SHMBUS_TEST_SQLITE", ":memory:")}


DATABASES = {"default": _database()}
