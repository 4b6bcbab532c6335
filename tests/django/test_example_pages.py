"""``examples/django_chat``'s settings (issue 34): the room page names the user (its template reads
``{{ request.user }}``, which needs the request context processor: it read "You are ."), and the workers' zone is
the one the master logs in (Django set the workers' TZ to its default America/Chicago)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests import harness
from tests.harness import REPO_ROOT

EXAMPLE = REPO_ROOT / "examples" / "django_chat"

PROBE = """
import os, django
django.setup()
from django.conf import settings
from django.contrib.auth.models import User
from django.template.loader import render_to_string
from django.test import RequestFactory
request = RequestFactory().get("/")
request.user = User(username="alice")
html = render_to_string("chat/room.html", {"messages": [], "last_id": 0}, request=request)
print("GREETS", "You are <b>alice</b>" in html)
print("ZONE", settings.TIME_ZONE, os.environ.get("TZ"))
"""


def test_the_room_page_names_the_user_and_the_zone_is_the_masters() -> None:
    harness.require_module("django", "pip install -e '.[all,test]' (the django extra), or run scripts/test")
    env = {k: v for k, v in os.environ.items() if k != "TZ"}
    env.update(DJANGO_SETTINGS_MODULE="chat.settings", PYTHONPATH=os.pathsep.join([str(EXAMPLE), str(REPO_ROOT)]))
    proc = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "GREETS True" in proc.stdout, proc.stdout
    assert "ZONE UTC UTC" in proc.stdout, proc.stdout  # no TZ given: UTC, as run.py gives gunicorn's master
