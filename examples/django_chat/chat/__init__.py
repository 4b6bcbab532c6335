"""A small Django chat on shmbus: ``python examples/django_chat/run.py`` (see README.md)."""
