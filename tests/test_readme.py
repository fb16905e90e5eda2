"""The README's examples run as written (issue 24), and so do the manual's (docs/): every
```bash and ```python block of a page, in the order a reader meets them, in one empty folder
per page, the way a new user would type them.

A block preceded by `<!-- not tested: reason -->` is skipped (installing the package,
running this very suite); a block preceded by `<!-- file: NAME -->` is not run but saved
as NAME, for the commands after it (a policy plug-in). `lmsim` resolves to this checkout;
the capacity cache is an empty one, so an example that would search a capacity shows up
as slow here rather than fast on a warm machine."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# The manual's hand-written pages; the generated reference holds help text, not examples.
MANUAL_PAGES = sorted(p for p in (ROOT / "docs").rglob("*.md") if "generated" not in p.parts)
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
SKIP = re.compile(r"<!-- not tested: (.+?) -->")
FILE = re.compile(r"<!-- file: (\S+) -->")


@dataclass(frozen=True)
class Block:
    line: int
    lang: str
    body: str
    skip: str | None  # the reason, when not tested
    file: str | None  # saved under this name instead of run


def readme_blocks(text: str) -> list[Block]:
    blocks = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip().splitlines()
        marker = before[-1].strip() if before else ""
        skip, file = SKIP.fullmatch(marker), FILE.fullmatch(marker)
        blocks.append(Block(text.count("\n", 0, match.start()) + 1, match.group(1), match.group(2),
                            skip.group(1) if skip else None, file.group(1) if file else None))  # fmt: skip
    return blocks


def _environment(tmp_path: Path) -> dict[str, str]:
    shims = tmp_path / "bin"
    shims.mkdir()
    shim = shims / "lmsim"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m lmsim "$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    return {
        **os.environ,
        "PATH": f"{shims}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "COLUMNS": "100",
    }


def test_the_blocks_are_found_and_skips_stay_rare() -> None:
    blocks = readme_blocks(README.read_text())
    runnable = [b for b in blocks if b.lang in ("bash", "python")]
    assert len([b for b in runnable if b.lang == "bash" and not b.skip]) >= 2
    assert any(b.lang == "python" and "lmsim.load_run" in b.body and not b.file for b in runnable)
    skipped = [b for b in runnable if b.skip]
    assert len(skipped) <= 2, [(b.line, b.skip) for b in skipped]
    # a marker names the block right below it: an orphan marker would skip nothing
    markers = [line for line in README.read_text().splitlines() if SKIP.fullmatch(line.strip())]
    assert len(markers) == len(skipped)


def test_readme_examples_run_as_written(tmp_path: Path) -> None:
    _run_page(README, tmp_path)


@pytest.mark.parametrize("page", MANUAL_PAGES, ids=lambda p: str(p.relative_to(ROOT / "docs")))
def test_manual_examples_run_as_written(page: Path, tmp_path: Path) -> None:
    _run_page(page, tmp_path)


def _run_page(page: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    env = _environment(tmp_path)
    name = page.relative_to(ROOT)
    for block in readme_blocks(page.read_text()):
        if block.lang not in ("bash", "python") or block.skip:
            continue
        if block.file:
            (work / block.file).write_text(block.body)
            continue
        argv = ["bash", "-e", "-o", "pipefail", "-c", block.body] if block.lang == "bash" else [
            sys.executable, "-c", block.body]  # fmt: skip
        proc = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, (
            f"{name} line {block.line} ({block.lang} block) failed with exit {proc.returncode}:\n"
            f"{block.body}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
        )
        assert "Traceback" not in proc.stderr, f"{name} line {block.line}:\n{proc.stderr[-3000:]}"
