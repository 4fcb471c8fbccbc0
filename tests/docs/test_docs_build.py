"""The documentation site builds with mkdocs in strict mode, and strict mode really fails
on a broken link or a missing anchor (a page left out of the navigation is only reported);
the config examples on the deploy pages are valid configs."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hotseat_common.config import load_config

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]


def build(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(root / "site")],
        cwd=root, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A copy of mkdocs.yml and docs/ to break."""
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    return tmp_path


def test_docs_build_strict(site: Path):
    """make docs: every page builds, every link and anchor resolves."""
    done = build(site)
    assert done.returncode == 0, done.stderr
    assert (site / "site" / "getting-started" / "index.html").is_file()
    assert (site / "site" / "adr" / "0001-pool-controller" / "index.html").is_file()


@pytest.mark.parametrize(
    ("page", "old", "new", "complaint"),
    [
        ("runbooks.md", "(metrics.md#alerts-worth-having)", "(metric.md)", "metric.md"),
        ("runbooks.md", "(metrics.md#alerts-worth-having)", "(metrics.md#alerts)", "#alerts"),
        ("index.md", "(getting-started.md)", "(../README.md)", "README.md"),
    ],
)
def test_a_broken_link_fails_the_build(site: Path, page: str, old: str, new: str, complaint: str):
    """A link to a missing page, a missing anchor or a file outside docs/ aborts the build."""
    path = site / "docs" / page
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    done = build(site)
    assert done.returncode != 0
    assert complaint in done.stderr


def test_a_page_missing_from_the_navigation_still_builds(site: Path):
    """A new page not yet in the nav is reported, never a reason for a failed build."""
    (site / "docs" / "orphan.md").write_text("# Orphan\n\n[Home](index.md)\n")
    done = build(site)
    assert done.returncode == 0, done.stderr
    assert "orphan.md" in done.stderr
    assert (site / "site" / "orphan" / "index.html").is_file()


HOTSEAT_BLOCK = re.compile(
    r"^```yaml\n(# Hotseat\n.*?|backends:\n.*?)^```", re.MULTILINE | re.DOTALL
)


@pytest.mark.parametrize("page", ["migrating.md", "kubernetes.md"])
def test_config_examples_on_the_page_are_valid(page: str, tmp_path: Path):
    """Every complete config example (one that declares backends) passes check-config."""
    blocks = HOTSEAT_BLOCK.findall((ROOT / "docs" / page).read_text())
    assert blocks
    for index, block in enumerate(blocks):
        path = tmp_path / f"example-{index}.yaml"
        path.write_text(block)
        config = load_config(path)
        assert config.pools
