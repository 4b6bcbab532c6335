"""The docs site builds with ``mkdocs build --strict``: every page in the nav, no broken link or anchor, every
``::: module.Name`` and ``[text][module.Name]`` reference found, no mkdocstrings warning.

The second test proves the build is strict where it matters: a copy of the docs with a broken link, and one with a
reference to a name that does not exist, must each fail, naming what is wrong.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import REPO_ROOT, require_module

CONFIG = REPO_ROOT / "mkdocs.yml"


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    require_module("mkdocs", "pip install -e '.[docs]', or run scripts/test")
    require_module("mkdocstrings_handlers.python", "pip install -e '.[docs]', or run scripts/test")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    argv = [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env, cwd=REPO_ROOT)


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    result = build(CONFIG, tmp_path / "site")
    assert result.returncode == 0, result.stderr[-5000:]
    site = tmp_path / "site"
    assert (site / "index.html").exists() and (site / "getting-started" / "index.html").exists()
    api = (site / "api" / "bus" / "index.html").read_text()
    for anchor in ("shmbus.Bus.publish", "shmbus.Bus.subscribe", "shmbus.Bus.backlog", "shmbus.DistributedCache"):
        assert f'id="{anchor}"' in api, f"the API reference lacks {anchor}"
    adapters = (site / "api" / "adapters" / "index.html").read_text()
    for name in integrations():
        assert f'id="shmbus.adapters.integrations.{name}"' in adapters, f"the API reference lacks {name}"
    assert 'id="shmbus.adapters.integrations.django.publish_on_commit"' in adapters
    assert "mode: int = 0o600" in re.sub(r"<[^>]+>", "", api), "a default as the source writes it, not 384"
    assert not external_resources(site), f"the site fetches from the internet: {external_resources(site)[:5]}"
    assert "stylesheets/extra.css" in (site / "index.html").read_text()
    assert "pre-wrap" in (site / "stylesheets" / "extra.css").read_text()  # long code lines wrap, not cut
    more = (site / "api" / "more" / "index.html").read_text()
    for anchor in (
        "shmbus.client.MessageBusClient",
        "shmbus.adapters.spark.register",
        "shmbus.adapters.push.PushConnector",
    ):
        assert f'id="{anchor}"' in more, f"the API reference lacks {anchor}"


RESOURCE = re.compile(r"<(?:link|script|img|iframe|source)\b[^>]*\b(?:href|src)=\"((?:https?:)?//[^\"]+)\"")
CSS_FETCH = re.compile(r"(?:@import\s+|url\()\s*[\"']?((?:https?:)?//[^\"')\s]+)")


def external_resources(site: Path) -> list[str]:
    """What a page of the built site would fetch from another host (web fonts, scripts, styles, images): the
    site must read offline. Links the reader follows are not fetched and not counted."""
    found = [m for page in site.rglob("*.html") for m in RESOURCE.findall(page.read_text())]
    return found + [m for css in site.rglob("*.css") for m in CSS_FETCH.findall(css.read_text())]


def integrations() -> list[str]:
    """The modules and packages of ``shmbus.adapters.integrations``."""
    root = REPO_ROOT / "adapters" / "integrations"
    return sorted(
        p.stem if p.is_file() else p.name
        for p in root.iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()
    )


def test_every_integration_has_its_page_in_the_nav_and_its_api_reference() -> None:
    """One page per integration, in the site's nav, and its module in the generated API reference."""
    nav = CONFIG.read_text().split("\nnav:", 1)[1]
    api = "".join(p.read_text() for p in sorted((REPO_ROOT / "docs" / "api").glob("*.md")))
    names = integrations()
    assert {"django", "falcon", "flask", "gunicorn", "starlette", "uwsgi"} <= set(names), names
    for name in names:
        assert f" {name}.md" in nav, f"docs/{name}.md is not in the nav of mkdocs.yml"
        assert (REPO_ROOT / "docs" / f"{name}.md").exists(), f"no docs/{name}.md"
        assert f"::: shmbus.adapters.integrations.{name}\n" in api, f"no API reference for the {name} integration"


@pytest.mark.parametrize(
    ("inject", "complaint"),
    [
        ("See [the missing page](no-such-page.md).", "no-such-page.md"),
        ("See [a missing name][shmbus.NoSuchThing].", "shmbus.NoSuchThing"),
    ],
)
def test_a_broken_link_or_reference_fails_the_build(tmp_path: Path, inject: str, complaint: str) -> None:
    docs = tmp_path / "docs"
    shutil.copytree(REPO_ROOT / "docs", docs)
    page = docs / "getting-started.md"
    page.write_text(page.read_text() + f"\n{inject}\n")
    # the same config, with the copied pages and the repository's hook and griffe extension
    text = CONFIG.read_text().replace("docs_dir: docs", f"docs_dir: {docs}")
    text = text.replace(" - scripts/", f" - {REPO_ROOT}/scripts/")
    config = tmp_path / "mkdocs.yml"
    config.write_text(text)
    result = build(config, tmp_path / "site")
    assert result.returncode != 0, f"a strict build accepted {inject!r}"
    assert complaint in result.stderr, result.stderr[-3000:]
