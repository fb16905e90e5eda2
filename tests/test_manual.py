"""The manual (docs/, built with MkDocs) and the first page: the generated reference agrees
with the code and the shipped data, every link resolves, the site builds in strict mode, the
README stays a first page, and no shipped file names a build machine's path."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lmsim.cli import manual

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_generated_pages_match_the_code_and_the_shipped_data() -> None:
    """Capacities, profile check counts, CLI options, schema and policies are generated: a
    change to any of them without `python -m lmsim.cli.manual` fails here."""
    stale = []
    for name, make in manual.PAGES.items():
        path = ROOT / manual.GENERATED / name
        if not path.is_file() or path.read_text() != make():
            stale.append(name)
    assert not stale, f"regenerate with `python -m lmsim.cli.manual`: {stale}"


def test_the_capacity_page_quotes_the_shipped_entry() -> None:
    """Pinned by hand against lmsim/data/experiments/capacity.json: ChatBot on 16 H20 under
    vllm was measured at 54.22 req/s (after this round's engine changes)."""
    page = (ROOT / manual.GENERATED / "capacities.md").read_text()
    assert "| `traces/chatbot` | chatbot | h20/qwen3-30b-a3b | 16 | 54.22 |" in page


def _links(page: Path) -> list[str]:
    return [t for t in LINK.findall(page.read_text()) if "://" not in t and not t.startswith("mailto:")]


@pytest.mark.parametrize("page", [README, *sorted(DOCS.rglob("*.md"))], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    missing = [t for t in _links(page) if not (page.parent / t).exists()]
    assert not missing, f"{page.relative_to(ROOT)} links to missing files: {missing}"


def test_readme_links_the_manual_and_stays_a_first_page() -> None:
    text = README.read_text()
    assert len(text.splitlines()) < 300
    assert any(t.startswith("docs/") for t in _links(README))
    # no dated measurement and no history of past rounds on the first page
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text)
    assert not re.search(r"\b(this|last|previous) round\b|\bissue \d+", text, re.I)


def test_every_manual_page_is_in_the_navigation() -> None:
    import yaml

    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]

    def pages(entry: object) -> list[str]:
        if isinstance(entry, str):
            return [entry]
        if isinstance(entry, list):
            return [p for e in entry for p in pages(e)]
        if isinstance(entry, dict):
            return [p for v in entry.values() for p in pages(v)]
        return []

    listed = set(pages(nav))
    on_disk = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert on_disk == listed, (on_disk - listed, listed - on_disk)


@pytest.mark.skipif(shutil.which("mkdocs") is None and not shutil.which(Path(sys.executable).parent / "mkdocs"),
                    reason="the docs extra (mkdocs-material) is not installed")
def test_the_manual_builds_strictly(tmp_path: Path) -> None:
    mkdocs = shutil.which(Path(sys.executable).parent / "mkdocs") or shutil.which("mkdocs")
    proc = subprocess.run([mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, env={"NO_MKDOCS_2_WARNING": "1", "PATH": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]


# A build machine's home or work folder baked into a shipped file breaks every other machine.
MACHINE_PATH = re.compile(r"(?<![\w.])/(?:work|root|home|Users)/[\w.-]+")
SHIPPED = ("lmsim", "docs", "benchmarks", "README.md", "pyproject.toml", "mkdocs.yml")
BINARY = {".png", ".pdf", ".parquet", ".gz", ".svg", ".pyc"}


def test_no_shipped_file_names_a_machine_path() -> None:
    found = []
    for top in SHIPPED:
        base = ROOT / top
        for path in [base] if base.is_file() else sorted(base.rglob("*")):
            if not path.is_file() or path.suffix in BINARY or "__pycache__" in path.parts:
                continue
            try:
                text = path.read_text()
            except UnicodeDecodeError:
                continue
            for n, line in enumerate(text.splitlines(), 1):
                if MACHINE_PATH.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert not found, "\n".join(found)
