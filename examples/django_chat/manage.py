#!/usr/bin/env python
"""``python examples/django_chat/manage.py migrate|shmbus stats|...`` for the example project."""

import os
import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chat.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
