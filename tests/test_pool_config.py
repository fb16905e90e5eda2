"""The cluster's pools, KV transfer and KV tiers sections (lmsim/config.py): resolution of
each pool's engine fields, the shape rules, and a single-pool config unchanged."""

from __future__ import annotations

import pytest

from lmsim.config import validate
from lmsim.errors import ConfigError

HOST = {"capacity_gb": 400, "read_bytes_s": 32e9, "write_bytes_s": 32e9}


def cluster(**fields):
    return validate({"workload": {"trace": "t.parquet"}, "cluster": fields}, where="exp.yaml").cluster


def test_pools_resolve_their_fields_from_the_cluster_and_number_instances_in_order():
    c = cluster(
        max_num_seqs=512,
        kv_tiers={"host": HOST},
        pools=[
            {"name": "p", "role": "prefill", "num_instances": 4, "max_num_batched_tokens": 16384},
            {"name": "d", "role": "decode", "num_instances": 12, "profile": "h20/qwen2-7b", "kv_tiers": None},
        ],
    )
    p, d = c.pool_specs()
    assert (p.first_instance, list(d.instance_ids)[:2], c.total_instances) == (0, [4, 5], 16)
    assert (p.engine["max_num_batched_tokens"], d.engine["max_num_batched_tokens"]) == (16384, 8192)
    assert (p.engine["max_num_seqs"], d.engine["profile"], p.engine["profile"]) == (512, "h20/qwen2-7b", "h20/qwen3-30b-a3b")
    assert p.kv_tiers is not None and p.kv_tiers.host.capacity_gb == 400
    assert c.is_disaggregated


def test_without_pools_one_pool_holds_the_flat_fields():
    (only,) = cluster(num_instances=3, max_num_seqs=7).pool_specs()
    assert (only.name, only.role, only.num_instances, only.engine["max_num_seqs"]) == ("default", "both", 3, 7)


def test_a_single_pool_config_serializes_as_before():
    raw = validate({"workload": {"trace": "t.parquet"}}, where="exp.yaml").to_dict()
    assert not {"pools", "kv_transfer", "kv_tiers"} & set(raw["cluster"])


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"pools": [{"name": "p", "role": "prefill", "num_instances": 2}]},
         "exp.yaml: cluster: pools: a prefill pool needs a decode pool to hand its requests to"),
        ({"pools": [{"name": "d", "role": "decode", "num_instances": 2}]},
         "exp.yaml: cluster: pools: a decode pool needs a prefill pool to receive requests from"),
        ({"num_instances": 3, "pools": [{"name": "a", "num_instances": 2}]},
         "exp.yaml: cluster: num_instances: set it per pool when cluster.pools is given"),
        ({"pools": [{"name": "a", "num_instances": 1}, {"name": "a", "num_instances": 2}]},
         "exp.yaml: cluster: pools: two pools are named 'a'"),
        ({"kv_transfer": {"latency_s": 0.001}},
         "exp.yaml: cluster: kv_transfer: only a cluster with prefill and decode pools transfers KV"),
        ({"kv_tiers": {"disk": HOST}},
         "exp.yaml: cluster.kv_tiers: a disk tier sits below a host tier: set kv_tiers.host too"),
        ({"kv_tiers": {"host": {"read_bytes_s": 1, "write_bytes_s": 1}}},
         "exp.yaml: cluster.kv_tiers.host: set exactly one of capacity_blocks and capacity_gb"),
        ({"pools": [{"name": "a", "num_instances": 1, "role": "router"}]},
         "exp.yaml: cluster.pools.0.role: Input should be 'both', 'prefill' or 'decode'"),
    ],
)
def test_bad_shapes_are_one_line_naming_the_field(fields, message):
    with pytest.raises(ConfigError) as err:
        cluster(**fields)
    assert str(err.value).startswith(message)
