"""Every command on a disaggregated experiment: run, validate, sweep (over the
prefill:decode split), compare, plot, report and capacity (issue 25)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from conftest import LINEAR
from lmsim.cli import main
from lmsim.study.capacity import describe_reference, probe_config

PROFILE = {**LINEAR, "per_prefill_token_s": 0.0001, "kv_bytes_per_token": 1e5}


def experiment(tmp_path: Path, **extra) -> Path:
    raw = {
        "name": "pd-tiny",
        "workload": {"generator": {"name": "chatbot", "params": {"num_requests": 60, "max_output_tokens": 40}}, "rate": 4},
        "cluster": {
            "profile": PROFILE,
            "num_gpu_blocks": 4000,
            "pools": [
                {"name": "prefill", "role": "prefill", "num_instances": 1},
                {"name": "decode", "role": "decode", "num_instances": 2},
            ],
        },
        "router": {"policy": "pd", "params": {"prefill_policy": "lmetric"}},
        "output": {"figures": False},
        **extra,
    }
    path = tmp_path / "pd.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_run_writes_the_handoff_columns_with_stable_dtypes(tmp_path, capsys):
    exp = experiment(tmp_path)
    assert main(["run", str(exp), "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "kv transfers 60" in out and "busy prefill" in out
    schema = pq.read_schema(tmp_path / "run" / "requests.parquet")
    types = {name: str(schema.field(name).type) for name in schema.names}
    assert types["prefill_instance_id"] == types["kv_transfer_bytes"] == types["instance_id"] == "int64"
    assert types["prefill_done_at"] == types["kv_transfer_start_at"] == types["kv_transfer_s"] == "double"
    requests = pq.read_table(tmp_path / "run" / "requests.parquet").to_pandas()
    assert set(requests.prefill_instance_id) == {0} and set(requests.instance_id) <= {1, 2}
    assert (requests.kv_transfer_start_at >= requests.prefill_done_at).all()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["num_kv_transfers"] == 60 and summary["kv_transfer_s_mean"] > 0


def test_validate_names_the_pools(tmp_path, capsys):
    assert main(["validate", str(experiment(tmp_path))]) == 0
    assert "pools prefill 1 x linear (prefill), decode 2 x linear (decode)" in capsys.readouterr().out


def test_a_colocated_policy_on_prefill_and_decode_pools_is_one_line(tmp_path, capsys):
    exp = experiment(tmp_path, router={"policy": "vllm"})
    assert main(["validate", str(exp)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "router.policy: 'vllm' routes a colocated cluster, and this one has prefill and decode pools" in err


def test_sweep_over_the_split_then_compare_plot_and_report(tmp_path, capsys):
    exp = experiment(tmp_path, sweep={
        "cluster.pools.0.num_instances": [1, 2], "cluster.pools.1.num_instances": [2, 1],
    }, zip=[["cluster.pools.0.num_instances", "cluster.pools.1.num_instances"]])
    out = tmp_path / "split"
    assert main(["sweep", str(exp), "--out", str(out), "-j", "1", "--no-progress"]) == 0
    index = pd.read_parquet(out / "sweep.parquet")
    assert list(index["cluster.pools.0.num_instances"]) == [1, 2]
    assert main(["compare", str(out)]) == 0
    table = capsys.readouterr().out
    assert "pools.0.num_instances=1, pools.1.num_instances=2" in table and "KV transfer mean ms" in table
    assert main(["plot", str(out), "--format", "png", "--kind", "cdf,param",
                 "--param", "cluster.pools.0.num_instances"]) == 0
    assert {p.name for p in (out / "figures").iterdir()} == {"cdf.png", "param.png"}
    assert main(["report", str(out)]) == 0
    assert (out / "report.html").exists()


def test_capacity_of_a_disaggregated_cluster_is_measured_under_pd(tmp_path, capsys):
    exp = experiment(tmp_path)
    assert main(["capacity", str(exp), "--probe-requests", "60", "--no-cache"]) == 0
    out = capsys.readouterr().out
    assert "under pd (vllm on the prefill and on the decode instances)" in out


@pytest.fixture
def pd_config(tmp_path):
    from lmsim.config import load_experiment

    return load_experiment(experiment(tmp_path))[0]


def test_capacity_replays_pd_with_the_capacity_policy_on_both_sides(pd_config):
    probe = probe_config(pd_config)
    assert (probe.router.policy, probe.router.params) == ("pd", {"prefill_policy": "vllm", "decode_policy": "vllm"})
    assert describe_reference(pd_config) == "pd (vllm on the prefill and on the decode instances)"
    other = pd_config.model_copy(update={"capacity": pd_config.capacity.model_copy(update={"policy": "dynamo_disagg"})})
    assert probe_config(other).router.policy == "dynamo_disagg"
