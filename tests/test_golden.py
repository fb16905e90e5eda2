"""Every pinned golden case (tests/golden.py) gives exactly its pinned digests: a change that
moves any per-request record, instance sample, router event or summary value fails here and
names the case and the table. Re-pin only for a change that is meant to move results."""

from __future__ import annotations

import pytest
from golden import CASES, compute, pinned


@pytest.mark.parametrize("name", [case["name"] for case in CASES])
def test_golden_case_is_unchanged(name: str) -> None:
    want = pinned()[name]
    got = compute([name])[name]
    moved = [table for table in want if got[table] != want[table]]
    assert not moved, f"golden case {name} moved in {', '.join(moved)} (tests/golden.py --update if meant)"
