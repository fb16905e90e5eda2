"""`lmsim plan` on Dask: a LocalCluster of worker processes gives the local answer. Needs the
dask extra (`pip install 'lmsim[dask]'`); skips cleanly without it."""

from __future__ import annotations

import pytest
from test_plan import _plan_file

from lmsim.plan import run_plan

pytest.importorskip("distributed")


def test_dask_local_cluster_gives_the_hand_computed_answer(tmp_path):
    """The case of test_plan.test_hand_built_linear_case_gives_the_computed_count: 3 instances,
    found with the same four probes (1, 2, 4, 3)."""
    path = _plan_file(tmp_path, {"slo": {"ttft_p50_s": 0.6}})
    result = run_plan(path, out=tmp_path / "out", workers=2, dask="local", log=None)
    assert result.row(result.winner)["instances"] == 3
    assert result.stats["probes_run"] == 4
