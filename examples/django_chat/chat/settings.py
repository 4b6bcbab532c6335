"""Settings of the example: SQLite next to this file (or ``CHAT_SQLITE``), PostgreSQL when ``DATABASE_URL``
is given; the bus name from ``CHAT_BUS`` (run.py sets it)."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import unquote, urlsplit

HERE = Path(__file__).resolve().parent
SECRET_KEY = os.environ.get("CHAT_SECRET_KEY", "example-only-not-secret")
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
# Django sets the process's TZ to TIME_ZONE (default America/Chicago) when a worker loads the settings, which
# gunicorn's master never does: both take TZ from the environment (run.py passes UTC unless TZ is set), so every
# log line of master and workers reads in one zone
TIME_ZONE = os.environ.get("TZ") or "UTC"
ROOT_URLCONF = "chat.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
WSGI_APPLICATION = "chat.wsgi.application"
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "shmbus.adapters.integrations.django",
    "chat",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        # the room page greets {{ request.user }}: without these it read "You are ."
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
            ]
        },
    }
]
SHMBUS = {
    "BUS": os.environ.get("CHAT_BUS", "django_chat"),
    # who is in the room: presence of the /chat pollers, each listed under its user name (docs/presence.md)
    "MIDDLEWARE": {"presence": ["/chat"]},
    "USER_ID_LOOKUP": "chat.lookups.username",
}


def _database() -> dict[str, object]:
    url = os.environ.get("DATABASE_URL")
    if url:
        parts = urlsplit(url)
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": parts.path.lstrip("/"),
            "USER": unquote(parts.username or ""),
            "PASSWORD": unquote(parts.password or ""),
            "HOST": parts.hostname or "",
            "PORT": str(parts.port or ""),
        }
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("CHAT_SQLITE", str(HERE.parent / "db.sqlite3")),
    }


DATABASES = {"default": {**_database(), "ATOMIC_REQUESTS": True}}  # a view's work commits when it returns
