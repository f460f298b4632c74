"""The documentation: README.md and the site under docs/ (docs/contributing.md, "The documentation").

* the site builds with ``mkdocs build --strict``: a broken link, anchor or API reference fails;
* README.md stays short, keeps the quick start's two commands, and its links point at files that exist.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def build_site(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of the docs under ``root`` into ``site``, as ``./dev.sh docs`` runs it."""
    environment = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)]
    return subprocess.run(command, cwd=root, env=environment, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="session")
def built_site(tmp_path_factory) -> Path:
    """The site, built once per session (the browser test opens the same build)."""
    site = tmp_path_factory.mktemp("site")
    result = build_site(ROOT, site)
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}{result.stderr}"
    return site


def test_the_site_builds_strictly_with_every_page_and_the_api_reference(built_site: Path):
    for page in ROOT.joinpath("docs").rglob("*.md"):
        relative = page.relative_to(ROOT / "docs").with_suffix("")
        folder = relative.parent if relative.name == "index" else relative
        assert (built_site / folder / "index.html").is_file(), f"{page} was not built"
    reference = (built_site / "reference" / "chatformat" / "index.html").read_text(encoding="utf-8")
    for member in ("from_pretrained", "render", "encode", "parse", "stream_parser"):
        assert f'id="turnkit.ChatFormat.{member}"' in reference, member
    for page in built_site.joinpath("reference").rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        assert ":class:" not in text and "``" not in text, f"{page}: a reST role or literal was left unconverted"
    for page in built_site.rglob("*.html"):
        assert "fonts.googleapis" not in page.read_text(encoding="utf-8"), f"{page} fetches web fonts"


def test_readme_is_short_and_keeps_the_quick_start():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) < 200
    quick_start = text[text.index("## Quick start") :]
    assert "\n./dev.sh serve " in quick_start and "\n./dev.sh test " in quick_start


def test_readme_links_point_at_files_that_exist():
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text(encoding="utf-8"))
    local = [link for link in links if "://" not in link]
    assert local, "README.md links into the docs"
    for link in local:
        assert (ROOT / link).exists(), f"README.md links to {link}, which does not exist"
