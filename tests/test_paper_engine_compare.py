"""lmsim.analysis.paper_engine_compare: Figure 23's runs again on another engine at the very
arrival times the default runs replayed, and the claims' numbers under both."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from test_paper_verdicts import paper_script
from test_sweep import tiny_experiment, write_experiment

from lmsim.config import validate
from lmsim.study.capacity import Capacity, CapacitySearch, cache_key, remember_capacities
from lmsim.study.execute import run_sweep
from lmsim.study.experiment import capacity_seed_config, generated_trace, workload_identity
from lmsim.study.index import read_index
from lmsim.workload.scaling import mean_rate

CAPACITY = 7.0  # req/s: given, not searched (a search would take longer than the runs)


def _module():
    return paper_script("engine_compare")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A miniature Figure 23 at loads 0.5 and 0.8 with `workload.limit` (so the replayed
    prefix's own rate is not the whole workload's), then its load-0.8 points prepared and run
    with `cluster.admission: full_sequence` instead of the default rule."""
    root = tmp_path_factory.mktemp("paper")
    raw = tiny_experiment(
        sweep={"router.policy": ["vllm", "llmd", "llmd", "lmetric", "lmetric"],
               "router.params.noise_rel": [None, 0.0, 0.12, None, None],
               "seed": [0, 0, 1, 0, 1],
               "workload.load": [0.5, 0.8]},
        zip=[["router.policy", "router.params.noise_rel", "seed"]],
    )  # fmt: skip
    raw["workload"]["generator"]["params"].update({"duration_s": 30, "warmup_s": 0})
    raw["workload"]["limit"] = 40
    config = validate({**raw, "sweep": None, "zip": None, "workload": {**raw["workload"], "load": 0.5}}, where="t")
    key = cache_key(workload_identity(capacity_seed_config(config)), config, CapacitySearch())
    remember_capacities({key: Capacity(CAPACITY, "test", key)})
    exp = write_experiment(root / "fig23.yaml", raw)
    assert run_sweep(exp, out=root / "runs" / "fig23", jobs=2, progress=False).exit_code == 0
    module = _module()
    out = root / "same"
    written = module.prepare(root / "runs", out, {"cluster.admission": "full_sequence"}, [0.8], None, ("fig23",))
    assert written == [out / "fig23.yaml"]
    assert run_sweep(written[0], out=out / "fig23", jobs=2, progress=False).exit_code == 0
    return root / "runs", out


def test_every_point_replays_its_default_runs_arrivals(runs: tuple[Path, Path]) -> None:
    root, out = runs
    raw_params = yaml.safe_load((root / "fig23" / "sweep.yaml").read_text())["config"]["workload"]["generator"]["params"]
    pairs = json.loads((out / "pairs.json").read_text())["pairs"]["fig23"]
    saved = yaml.safe_load((out / "fig23" / "sweep.yaml").read_text())
    assert len(saved["points"]) == len(pairs) == 5  # the load-0.8 half
    for point in saved["points"]:
        new = out / "fig23" / point["name"]
        old = root / "fig23" / pairs[json.dumps(point["params"], sort_keys=True, default=repr)]
        assert yaml.safe_load((new / "config.yaml").read_text())["cluster"]["admission"] == "full_sequence"
        arrived = [pd.read_parquet(d / "requests.parquet").sort_values("request_id")["arrived_at"].to_numpy()
                   for d in (old, new)]  # fmt: skip
        assert len(arrived[0]) == 40 and (arrived[0] == arrived[1]).all()
        # load x capacity = 0.8 x 7 = 5.6 req/s for the whole workload of the point's seed:
        # the factor is 5.6 over the whole draw's own rate, not the prefix's (a
        # `workload.rate: 5.6` would stretch the 40-request prefix to 5.6 by itself)
        whole = generated_trace("chatbot", raw_params, point["params"]["seed"])
        assert point["params"]["workload.time_scale"] == 0.8 * CAPACITY / mean_rate(whole)


def test_compare_reads_each_engine_through_the_same_verdicts(runs: tuple[Path, Path], capsys) -> None:
    root, out = runs
    module = _module()
    lines, default, other = module.compare(root, out, ("default", "full_sequence"))
    new = read_index(out / "fig23").set_index("router.policy")
    old = read_index(root / "fig23")
    old = old[old["workload.load"] == 0.8].set_index("router.policy")
    key = "fig23/chatbot/load=0.8/vllm/ttft_mean_ms"
    assert other[key] == pytest.approx(1000 * new.loc["vllm", "ttft_s_mean"])
    assert default[key] == pytest.approx(1000 * old.loc["vllm", "ttft_s_mean"])
    assert "fig23/chatbot/load=0.5/vllm/ttft_mean_ms" not in default  # only the paired runs
    text = "\n".join(lines)
    assert "## Verdicts that differ, default -> full_sequence" in text and f"| {key} |" in text
    assert module.main(["compare", str(root), str(out / "nothing")]) == 2
    assert capsys.readouterr().err.count("\n") == 1
