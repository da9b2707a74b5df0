"""The README stays short and the documentation beside it builds: `make docs`'s two steps (the reference pages
generated from the code, then MkDocs with --strict, so that a broken link or a page left out of the navigation
fails), on a copy of docs/ so that the working tree is not written to."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README_MAX_LINES = 300
TIMEOUT = 300  # seconds; a bound on a hung build, never a measurement


def test_the_readme_is_short_and_its_links_lead_somewhere() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES
    for target in re.findall(r"\]\((?!https?://|#)([^)#]+)", readme):
        assert (REPO / target).exists(), f"the README links to {target}, which is not in the repository"
    # The two commands a fresh machine needs are on its first screen.
    assert readme.index("make demo") < 3000 and readme.index("make test") < 3000


def test_the_site_builds_strictly_with_the_generated_reference(tmp_path: Path) -> None:
    shutil.copy(REPO / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(REPO / "docs", tmp_path / "docs", ignore=shutil.ignore_patterns("reference", "__pycache__"))
    subprocess.run(
        [sys.executable, str(REPO / "docs" / "gen_reference.py"), str(tmp_path / "docs" / "reference")],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=TIMEOUT,
    )
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(tmp_path / "mkdocs.yml")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )
    assert built.returncode == 0, built.stderr[-3000:]
    site = tmp_path / "site"
    # Every generated reference page is in the site, with content drawn from the code.
    cli = (site / "reference" / "cli" / "index.html").read_text()
    assert "visioncap run" in cli and "visioncap cameras add" in cli
    settings = (site / "reference" / "settings" / "index.html").read_text()
    assert "VISIONCAP_DATABASE_URL" in settings and "VISIONCAP_API_KEYS" in settings
    api = (site / "reference" / "api" / "index.html").read_text()
    assert "/v1/captions" in api
    assert "/v1/chat/completions" in (site / "reference" / "gateway-api" / "index.html").read_text()
    assert "analyze_fps" in (site / "reference" / "pipeline-file" / "index.html").read_text()


def test_every_docs_page_is_in_the_navigation() -> None:
    nav = (REPO / "mkdocs.yml").read_text()
    pages = {path.relative_to(REPO / "docs").as_posix() for path in (REPO / "docs").rglob("*.md")}
    pages = {page for page in pages if not page.startswith("reference/")}  # generated, listed by name below
    assert pages and all(f": {page}" in nav for page in pages), sorted(page for page in pages if f": {page}" not in nav)
