"""KV tier results on disk and in the study tools (issue 26): the request columns' dtypes in
requests.parquet, the summary, `lmsim compare`'s tier columns and `lmsim plot --kind tiers`,
on tiny linear-cost runs whose small GPU pools evict."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from test_sweep import tiny_experiment, write_experiment

from lmsim.cli import main
from lmsim.study.execute import run_sweep
from lmsim.study.rundir import load_run
from lmsim.viz.compare import compare_table
from lmsim.viz.figures import make_figures, supported_kinds
from lmsim.viz.runs import RunSet

TIERS = {"host": {"capacity_blocks": 2000}, "kv_bytes_per_token": 1000}
TIER_COLUMNS = ["kv_hit_tokens_host", "kv_hit_tokens_disk", "kv_load_bytes", "kv_load_s"]


def tiered(**extra):
    raw = tiny_experiment(**extra)
    raw["cluster"] = {**raw["cluster"], "num_gpu_blocks": 150, "kv_tiers": TIERS}
    return raw


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("tiers")
    exp = write_experiment(root / "exp.yaml", tiered())
    assert main(["run", str(exp), "--out", str(root / "tiers"), "--no-figure"]) == 0
    plain = tiny_experiment()
    plain["cluster"] = {**plain["cluster"], "num_gpu_blocks": 150}
    exp = write_experiment(root / "plain.yaml", plain)
    assert main(["run", str(exp), "--out", str(root / "plain"), "--no-figure"]) == 0
    return root / "tiers", root / "plain"


def test_requests_parquet_has_the_tier_columns_with_stable_types(runs: tuple[Path, Path]) -> None:
    tiers, plain = runs
    schema = pq.read_schema(tiers / "requests.parquet")
    assert [str(schema.field(c).type) for c in TIER_COLUMNS] == ["int64", "int64", "int64", "double"]
    assert not set(TIER_COLUMNS) & set(pq.read_schema(plain / "requests.parquet").names)
    r = load_run(tiers)
    admitted = r.requests.cached_tokens.notna()
    assert (r.requests.kv_hit_tokens_host.notna() == admitted).all()  # null exactly when never admitted
    assert r.requests.kv_hit_tokens_host.dtype == "Int64" and r.requests.kv_load_s.dtype == "float64"
    loaded = r.requests[r.requests.kv_load_bytes > 0]
    assert len(loaded) and (loaded.kv_load_s > 0).all()
    # every load reads host blocks (no disk): bytes = host tokens x 1,000 B when loaded at first admission
    first = loaded[loaded.kv_hit_tokens_host > 0]
    assert (first.kv_load_bytes >= first.kv_hit_tokens_host * 1000).all()
    s = r.summary
    # every byte a request read is in the summary: host-to-GPU copies plus disk reads (none)
    assert int(r.requests.kv_load_bytes.sum()) == s["kv_h2d_bytes"] + s["kv_load_bytes_disk"]
    assert s["kv_num_loads"] >= len(loaded) > 0
    assert s["prefix_hit_ratio_first_admission_host"] > 0
    assert s["kv_offload_bytes_disk"] is None  # no disk tier


def test_the_run_prints_the_tier_line(runs: tuple[Path, Path], tmp_path: Path, capsys) -> None:
    exp = write_experiment(tmp_path / "exp.yaml", tiered())
    assert main(["run", str(exp), "--out", str(tmp_path / "r"), "--no-figure"]) == 0
    assert "KV tiers on 2 instances: hit at first admission GPU" in capsys.readouterr().out


def test_compare_shows_tier_columns_when_a_run_has_tiers(runs: tuple[Path, Path]) -> None:
    tiers, plain = runs
    table, _ = compare_table(RunSet([tiers, plain]))
    assert {"GPU hit 1st", "host hit 1st", "loaded GB", "offloaded GB"} <= set(table.columns)
    host = table["host hit 1st"].tolist()
    assert host[0] > 0 and host[1] != host[1]  # NaN: the plain run has no tier
    plain_only, _ = compare_table(RunSet([plain]))
    assert "host hit 1st" not in plain_only.columns


def test_plot_tiers_draws_a_capacity_sweep(tmp_path: Path) -> None:
    raw = tiered(sweep={"router.policy": ["vllm", "lmetric"], "cluster.kv_tiers.host.capacity_blocks": [0, 500, 2000]})
    exp = write_experiment(tmp_path / "exp.yaml", raw)
    assert run_sweep(exp, out=tmp_path / "sweep", jobs=1, progress=False).exit_code == 0
    data = RunSet(tmp_path / "sweep")
    assert "tiers" in supported_kinds(data)
    written = make_figures(tmp_path / "sweep", ["tiers"], formats=("png",), out=tmp_path / "figs")
    assert [p.name for p in written] == ["tiers.png"]
    index = data.index
    zero = index[index["cluster.kv_tiers.host.capacity_blocks"] == 0]
    assert "kv_tiers_instances" not in zero or zero["kv_tiers_instances"].isna().all()  # 0 blocks: no tier
