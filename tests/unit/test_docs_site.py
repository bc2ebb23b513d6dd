"""The docs site builds with ``mkdocs build --strict``, offline, and the README's links land.

A broken link or anchor between pages fails the strict build, and so does a README
section a page includes (``--8<-- "README.md:tour"``) whose markers went missing. The
build must fetch nothing: every request it could make is sent to a closed port, and
the pages it writes load no script, stylesheet or font from another host.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from html import unescape
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

#: Any request the build makes goes here and fails at once: nothing listens on port 9.
_NO_NETWORK = {
    "HTTP_PROXY": "http://127.0.0.1:9",
    "HTTPS_PROXY": "http://127.0.0.1:9",
    "http_proxy": "http://127.0.0.1:9",
    "https_proxy": "http://127.0.0.1:9",
    "NO_PROXY": "",
    "no_proxy": "",
}


def build(project: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **_NO_NETWORK, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def copy_project(dest: Path) -> Path:
    shutil.copytree(ROOT / "docs", dest / "docs")
    shutil.copy(ROOT / "mkdocs.yml", dest / "mkdocs.yml")
    shutil.copy(README, dest / "README.md")
    return dest


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("docs") / "site"
    done = build(ROOT, out)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def nav_pages() -> list[str]:
    text = (ROOT / "mkdocs.yml").read_text()
    nav = text.split("\nnav:\n", 1)[1]
    return re.findall(r":\s*([\w-]+\.md)\s*$", nav, re.MULTILINE)


def page_html(site: Path, page: str) -> str:
    name = page.removesuffix(".md")
    path = site / "index.html" if name == "index" else site / name / "index.html"
    return path.read_text()


def text_of(html: str) -> str:
    """What a reader sees: tags dropped (code is highlighted token by token), entities read."""
    return unescape(re.sub(r"<[^>]+>", "", html))


def test_every_page_of_the_nav_is_built(site: Path) -> None:
    pages = nav_pages()
    assert len(pages) >= 20
    on_disk = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert sorted(pages) == on_disk, "every page in the nav, and only pages that exist"
    for page in pages:
        assert "<h1" in page_html(site, page), page


def test_the_readme_sections_the_pages_include_are_there(site: Path) -> None:
    start = text_of(page_html(site, "getting-started.md"))
    assert "make dev     # creates .venv" in start
    assert "make test    # creates .venv" in start
    assert "Kill a worker and watch the resume" in start
    assert "toolfleet.invoke.requested ──► policy" in text_of(page_html(site, "architecture.md"))
    assert "--8<--" not in start


def test_the_pages_load_nothing_from_another_host(site: Path) -> None:
    for page in site.rglob("*.html"):
        html = page.read_text()
        assert "fonts.googleapis" not in html, page
        assert "fonts.gstatic" not in html, page
        external = re.findall(r'<(?:script|link)\b[^>]*(?:src|href)="(?:https?:)?//', html)
        assert not external, (page, external)


def test_a_broken_anchor_fails_the_build(tmp_path: Path) -> None:
    project = copy_project(tmp_path / "project")
    page = project / "docs" / "console.md"
    page.write_text(page.read_text() + "\nSee [the egress rules](security.md#no-such-part).\n")
    done = build(project, tmp_path / "site")
    assert done.returncode != 0
    assert "security.md#no-such-part" in done.stdout + done.stderr


def test_a_missing_readme_section_fails_the_build(tmp_path: Path) -> None:
    project = copy_project(tmp_path / "project")
    readme = project / "README.md"
    readme.write_text(readme.read_text().replace("[start:tour]", "[start:elsewhere]"))
    done = build(project, tmp_path / "site")
    assert done.returncode != 0
    assert "tour" in done.stdout + done.stderr


def test_the_readme_links_land_on_pages_and_anchors_that_exist(site: Path) -> None:
    links = re.findall(r"\]\(([^)\s]+)\)", README.read_text())
    local = [link for link in links if not re.match(r"[a-z]+:", link)]
    assert any(link.startswith("docs/") for link in local)
    for link in local:
        path, _, anchor = link.partition("#")
        assert (ROOT / path).exists(), link
        if anchor and path.startswith("docs/"):
            html = page_html(site, path.removeprefix("docs/"))
            assert f'id="{anchor}"' in html, link


def test_the_readme_stays_short() -> None:
    assert len(README.read_text().splitlines()) <= 400
