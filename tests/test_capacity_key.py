"""The capacity cache key names what defines a measurement (workload identity, cluster,
profile identity, search, criterion, reference policy), never the generated numbers; and
only `run`/`sweep` search, saying so, while `validate` only looks up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from lmsim.cli import main
from lmsim.config import validate
from lmsim.study import capacity
from lmsim.study.capacity import CapacitySearch, cache_key, key_payload
from lmsim.study.experiment import workload_identity

SEARCH = CapacitySearch(probe_requests=60, rel_tol=0.2)
LINEAR = {"kind": "linear", "step_base_s": 0.01, "per_prefill_token_s": 1e-4, "per_decode_seq_s": 1e-3}


def raw_experiment(**workload) -> dict:
    return {
        "name": "cap",
        "seed": 0,
        "workload": {"generator": {"name": "agent", "params": {"num_requests": 60, "rate": 2.0}}, **workload},
        "cluster": {"num_instances": 1, "profile": dict(LINEAR), "num_gpu_blocks": 2000},
        "router": {"policy": "round_robin"},
    }


def key_of(raw: dict, policy: str = "vllm", search: CapacitySearch = SEARCH) -> str:
    config = validate({**raw, "capacity": {"policy": policy}}, where="test")
    return cache_key(workload_identity(config), config, search)


def test_key_is_the_workload_definition_not_its_numbers(monkeypatch) -> None:
    base = key_of(raw_experiment())
    assert key_of(raw_experiment()) == base
    # the router under test, a rescaling and a prefix cut do not change the capacity
    assert key_of({**raw_experiment(), "router": {"policy": "lmetric"}}) == base
    assert key_of(raw_experiment(limit=10)) == base
    # a queue cap does not either (the probe runs without one), nor an optional field at None
    assert key_of({**raw_experiment(), "cluster": {**raw_experiment()["cluster"], "max_waiting": 4}}) == base
    # everything that defines the measured workload or its service does
    other_seed = {**raw_experiment(), "seed": 1}
    other_params = raw_experiment()
    other_params["workload"]["generator"]["params"]["rate"] = 3.0
    other_cluster = {**raw_experiment(), "cluster": {**raw_experiment()["cluster"], "num_instances": 2}}
    windowed = raw_experiment(end_s=20.0)
    changed = {key_of(r) for r in (other_seed, other_params, other_cluster, windowed)}
    changed |= {key_of(raw_experiment(), policy="round_robin"),
                key_of(raw_experiment(), search=CapacitySearch(probe_requests=30))}
    assert base not in changed and len(changed) == 6
    # a generator version bump re-keys its workloads
    from lmsim.workload.generators import GENERATORS

    monkeypatch.setattr(GENERATORS.get("agent"), "version", 99)
    assert key_of(raw_experiment()) != base


def test_key_payload_records_profile_and_policy() -> None:
    config = validate(raw_experiment(), where="test")
    payload = key_payload(workload_identity(config), config, SEARCH)
    assert payload["policy"] == "vllm"
    assert payload["criterion"] == capacity.CRITERION_VERSION
    assert payload["profile"] == {"inline": dict(sorted(LINEAR.items()))}
    assert payload["workload"]["source"] == {
        "generator": "agent", "version": 3, "params": {"num_requests": 60, "rate": 2.0}, "seed": 0,
    }  # fmt: skip
    table = validate({**raw_experiment(), "cluster": {"profile": "h20/qwen3-30b-a3b"}}, where="t")
    ident = key_payload(workload_identity(table), table, SEARCH)["profile"]
    assert ident["name"] == "h20/qwen3-30b-a3b" and len(ident["sha256"]) == 16


def test_a_trace_file_is_keyed_by_its_content(tmp_path: Path) -> None:
    from lmsim.workload.generators import generate

    trace = generate("agent", {"num_requests": 30}, seed=0)
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    trace.save(a)
    trace.save(b)
    config_a = validate({**raw_experiment(), "workload": {"trace": str(a), "load": 0.5}}, where="t")
    config_b = validate({**raw_experiment(), "workload": {"trace": str(b), "load": 0.5}}, where="t")
    assert workload_identity(config_a) == workload_identity(config_b)  # same bytes, other name


@pytest.fixture
def isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(capacity, "BUNDLED_PATH", tmp_path / "bundled.json")
    return tmp_path


def test_the_cache_honours_xdg_cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 24: the capacity cache ignored XDG_CACHE_HOME. An absolute one is used (a
    relative one is ignored, as the XDG base directory specification says)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert capacity.cache_path() == tmp_path / "xdg/lmsim/capacity.json"
    capacity._write_cache("k", {"rate": 1.5})
    assert json.loads((tmp_path / "xdg/lmsim/capacity.json").read_text()) == {"k": {"rate": 1.5}}
    assert capacity.lookup_capacity("k").rate == 1.5
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
    assert capacity.cache_path() == Path.home() / ".cache/lmsim/capacity.json"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert capacity.cache_path() == Path.home() / ".cache/lmsim/capacity.json"


def test_validate_never_searches_and_run_announces_the_search(
    isolated_cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    exp = tmp_path / "exp.yaml"
    raw = raw_experiment(load=0.5)
    raw["output"] = {"figures": False}
    exp.write_text(yaml.safe_dump(raw))
    calls = []
    real = capacity.is_sustainable
    monkeypatch.setattr(capacity, "is_sustainable", lambda *a, **k: calls.append(1) or real(*a, **k))

    assert main(["validate", str(exp)]) == 0
    out = capsys.readouterr().out
    assert "capacity not shipped or cached" in out and not calls

    monkeypatch.chdir(tmp_path)
    assert main(["run", str(exp), "--out", str(tmp_path / "run")]) == 0
    captured = capsys.readouterr()
    assert "searching" in captured.err and "probe 1 of at most 24" in captured.err
    assert calls
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["capacity_source"] == "searched"
    assert summary["load_rate_req_s"] == pytest.approx(0.5 * summary["capacity_req_s"])
    assert f"arrival rate {summary['load_rate_req_s']:.4g} req/s" in captured.out
    head = (tmp_path / "run" / "config.yaml").read_text().splitlines()[:2]
    assert head[0].startswith("# workload.load 0.5 resolved to an arrival rate of")
    assert repr(summary["capacity_req_s"]) in head[1] and "(searched)" in head[1]

    # now cached: validate reports it, and nothing searches again
    calls.clear()
    assert main(["validate", str(exp)]) == 0
    assert "(cached)" in capsys.readouterr().out and not calls


def test_sweep_searches_each_missing_capacity_once_and_says_so(
    isolated_cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    from lmsim.study.execute import run_sweep

    raw = raw_experiment(load=0.5)
    raw["output"] = {"figures": False}
    raw["sweep"] = {"router.policy": ["round_robin", "vllm"]}  # one workload, two runs
    exp = tmp_path / "sweep.yaml"
    exp.write_text(yaml.safe_dump(raw))
    monkeypatch.chdir(tmp_path)
    outcome = run_sweep(exp, out=tmp_path / "out", progress=False)
    assert not outcome.failed and len(outcome.executed) == 2
    err = capsys.readouterr().err
    assert err.count("needs a capacity no cache has") == 1
    assert err.count("searching (up to 24 probes") == 1 and "probe 1 of at most 24" in err
    rates = {json.loads((tmp_path / "out" / name / "summary.json").read_text())["load_rate_req_s"]
             for name in outcome.executed}  # fmt: skip
    assert len(rates) == 1  # both runs used the one searched capacity


def test_key_holds_the_engines_resolved_settings() -> None:
    """Naming the default release, or writing its settings, is the key of leaving them unset
    (so capacities shipped before `cluster.engine` existed stay valid); vllm-0.33, or one
    setting moved off the default, is another key. The synchronous defaults are not written
    into the payload; `admission: first_chunk` is, as it always was."""
    def with_cluster(**fields) -> dict:
        raw = raw_experiment()
        return {**raw, "cluster": {**raw["cluster"], **fields}}

    base = key_of(raw_experiment())
    assert key_of(with_cluster(engine="vllm-0.11")) == base
    assert key_of(with_cluster(admission="first_chunk", async_scheduling=False, free_queue_order="release")) == base
    assert key_of(with_cluster(engine="vllm-0.33")) != base
    assert key_of(with_cluster(async_scheduling=True)) not in (base, key_of(with_cluster(engine="vllm-0.33")))
    payload = key_payload({}, validate(raw_experiment(), where="test"), SEARCH)["cluster"]
    assert payload["admission"] == "first_chunk"
    assert not {"engine", "async_scheduling", "free_queue_order", "waive_long_prefill_when_alone"} & set(payload)
