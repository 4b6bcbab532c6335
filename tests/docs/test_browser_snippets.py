"""The README and the tutorial each show the browser side: an ``html`` block loading the two scripts the middleware
serves (``shmbus.adapters.http.assets.NPM_CLIENT``, under ``/message-bus/assets/``), in that order, then subscribing.

A page made of just those two scripts receiving a message in Chromium is tests/e2e/test_assets.py; this checks
that the snippets a newcomer copies are that page's (the README once showed only the server side).
"""

from __future__ import annotations

import re

import pytest

from shmbus.adapters.http.assets import NPM_CLIENT
from tests.harness import REPO_ROOT

HTML = re.compile(r"^```html\n(.*?)^```", re.S | re.M)
SCRIPT_SRC = re.compile(r'<script src="([^"]+)"></script>')


@pytest.mark.parametrize("page", ["README.md", "docs/getting-started.md", "docs/browser.md"])
def test_the_browser_snippet_loads_the_served_assets_and_subscribes(page: str) -> None:
    blocks = HTML.findall((REPO_ROOT / page).read_text())
    assert blocks, f"{page} shows no html snippet for the browser"
    want = [f"/message-bus/assets/{name}" for name in NPM_CLIENT]
    good = [b for b in blocks if SCRIPT_SRC.findall(b) == want and "MessageBus.subscribe(" in b]
    assert good, f"no snippet of {page} loads {list(NPM_CLIENT)} from /message-bus/assets/ and subscribes: {blocks}"
