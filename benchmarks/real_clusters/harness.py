"""Shared pieces of the real-cluster cases (issue 33 item 5): the published numbers, lmsim's
profile and run, and the comparison every case reports.

A case script gives, per stage (a load step in increasing order) and per router, the real
value of each metric (`real`) and lmsim's (`sim`) as long tables with columns
`stage, router, metric, value`; `compare` turns them into the case's verdicts:

* ranking agreement: Kendall's tau-b between the routers' real and simulated values, per
  stage, on TTFT and on throughput (`kendall_tau`; tau-b so a tie counts half, as
  `scipy.stats.kendalltau` defines it: (C - D) / sqrt((n0 - n1)(n0 - n2)));
* the best router per stage (lowest TTFT; highest throughput where no TTFT is published),
  real vs simulated;
* each router's saturation stage (`saturation_stage`), the same rule on both sides;
* sim/real ratios of throughput and TTFT (TTFT only where the router is unsaturated on the
  real side, as the issue's bar reads: queueing past saturation is not a latency model).

The bars (issue 33): mean tau per stage >= 0.8 on TTFT and on throughput, best router matching
in >= 90% of stages, each router's saturation stage within one stage of the real one,
throughput within 15% and unsaturated TTFT within 30%.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # run as a script: import this checkout's lmsim
    sys.path.insert(0, str(REPO))
RESULTS_DIR = Path(__file__).resolve().parent / "results"

# The saturation rule: a router is saturated at the first stage whose TTFT exceeds
# SATURATION_TTFT_FACTOR x its TTFT at the lowest-load stage, or, where the source's
# throughput is over the sending window (so a keeping-up server delivers the offered rate),
# whose throughput falls below SATURATION_THROUGHPUT_FRACTION x offered.
SATURATION_TTFT_FACTOR = 3.0
SATURATION_THROUGHPUT_FRACTION = 0.9

BARS = {"tau": 0.8, "best_match": 0.9, "saturation_stages": 1, "throughput": 0.15, "ttft": 0.30}


def shared_dir() -> Path | None:
    """../shared (LMSIM_SHARED overrides), or None where it is absent."""
    path = Path(os.environ.get("LMSIM_SHARED", REPO.parent / "shared"))
    return path if (path / "docs" / "cluster_benchmarks" / "points.csv").exists() else None


def points(source: str) -> pd.DataFrame:
    """points.csv rows whose source_url contains `source` (raises if ../shared is absent)."""
    root = shared_dir()
    if root is None:
        raise FileNotFoundError("../shared/docs/cluster_benchmarks/points.csv not found (set LMSIM_SHARED)")
    table = pd.read_csv(root / "docs" / "cluster_benchmarks" / "points.csv")
    return table[table["source_url"].str.contains(source, regex=False)].reset_index(drop=True)


def point(rows: pd.DataFrame, **match: Any) -> float:
    """The one value of `rows` whose columns equal `match` (as strings)."""
    sel = np.ones(len(rows), dtype=bool)
    for column, value in match.items():
        sel &= rows[column].astype(str).to_numpy() == str(value)
    if sel.sum() != 1:
        raise KeyError(f"points.csv: {sel.sum()} rows match {match}")
    return float(rows.loc[sel, "value"].iloc[0])


# -- metrics ------------------------------------------------------------------------------


def kendall_tau(a: Sequence[float], b: Sequence[float]) -> float:
    """Kendall's tau-b of two paired sequences: (C - D) / sqrt((n0 - n1)(n0 - n2)), n0 the
    pairs, n1 / n2 the pairs tied in a / in b; a pair tied in both counts in neither C nor D.
    NaN when either side is all ties (no ranking to agree with) or fewer than 2 items."""
    if len(a) != len(b):
        raise ValueError("kendall_tau: sequences differ in length")
    concordant = discordant = tied_a = tied_b = pairs = 0
    for i in range(len(a)):
        for j in range(i + 1, len(a)):
            pairs += 1
            da, db = np.sign(a[i] - a[j]), np.sign(b[i] - b[j])
            tied_a += da == 0
            tied_b += db == 0
            if da * db > 0:
                concordant += 1
            elif da * db < 0:
                discordant += 1
    denominator = math.sqrt((pairs - tied_a) * (pairs - tied_b))
    return (concordant - discordant) / denominator if denominator else math.nan


def saturation_stage(ttft: Sequence[float], throughput: Sequence[float] | None = None,
                     offered: Sequence[float] | None = None, *,
                     factor: float = SATURATION_TTFT_FACTOR,
                     fraction: float = SATURATION_THROUGHPUT_FRACTION) -> int | None:
    """Index of the first stage where TTFT > factor x TTFT of stage 0, or (with `offered`)
    throughput < fraction x offered; None if no stage is saturated."""
    base = ttft[0]
    for k, value in enumerate(ttft):
        if value > factor * base:
            return k
        if offered is not None and throughput is not None and throughput[k] < fraction * offered[k]:
            return k
    return None


# -- comparison ---------------------------------------------------------------------------


@dataclass
class Comparison:
    """The verdicts of one case (see the module docstring)."""

    case: str
    stages: list[str]
    routers: list[str]
    per_stage: pd.DataFrame          # stage, tau_ttft, tau_tput, best_real, best_sim
    per_router: pd.DataFrame         # router, sat_real, sat_sim, sat_ok, tput_ratio_mean, ttft_ratio_mean
    cells: pd.DataFrame              # stage, router, metric, real, sim, ratio
    notes: list[str] = field(default_factory=list)
    engine: dict[str, pd.DataFrame] = field(default_factory=dict)  # router -> engine_state

    def bars(self) -> dict[str, Any]:
        """The issue's bars with the measured numbers (None where the case has no data)."""
        ps, pr = self.per_stage, self.per_router

        def mean(series: pd.Series) -> float | None:
            values = pd.to_numeric(series, errors="coerce").dropna()
            return float(values.mean()) if len(values) else None

        tau_ttft, tau_tput = mean(ps["tau_ttft"]), mean(ps["tau_tput"])
        ranked = ps.dropna(subset=["best_real", "best_sim"])
        best = float((ranked.best_real == ranked.best_sim).mean()) if len(ranked) else None
        sat = pr.dropna(subset=["sat_ok"]) if len(pr) else pr
        sat_share = float(sat.sat_ok.astype(bool).mean()) if len(sat) else None
        tput = self.cells[self.cells.metric == "throughput"].ratio.dropna()
        ttft = self.cells[(self.cells.metric == "ttft") & self.cells.unsaturated].ratio.dropna()
        # 1e-9: a ratio of exactly 0.85 is "within 15%" although 1 - 0.85 > 0.15 in floats
        tput_share = float((abs(tput - 1) <= BARS["throughput"] + 1e-9).mean()) if len(tput) else None
        ttft_share = float((abs(ttft - 1) <= BARS["ttft"] + 1e-9).mean()) if len(ttft) else None
        return {
            "case": self.case, "tau_ttft": tau_ttft, "tau_tput": tau_tput, "best_match": best,
            "saturation_ok": sat_share, "tput_within_15": tput_share, "ttft_within_30": ttft_share,
            "tput_ratio_median": float(tput.median()) if len(tput) else None,
            "ttft_ratio_median": float(ttft.median()) if len(ttft) else None,
            "pass_tau": None if tau_ttft is None and tau_tput is None else all(
                v is None or v >= BARS["tau"] for v in (tau_ttft, tau_tput)),
            "pass_best": None if best is None else best >= BARS["best_match"],
            "pass_saturation": None if sat_share is None else sat_share == 1.0,
            "pass_tput": None if tput_share is None else tput_share == 1.0,
            "pass_ttft": None if ttft_share is None else ttft_share == 1.0,
        }


def compare(case: str, real: pd.DataFrame, sim: pd.DataFrame, stages: Sequence[str],
            offered: dict[str, float] | None = None, ttft_metric: str = "ttft",
            tput_metric: str = "throughput") -> Comparison:
    """`real`/`sim`: long tables (stage, router, metric, value) with metrics named
    `ttft_metric` and `tput_metric` (other metrics are carried into the cells table).
    `offered`: throughput the load offers per stage, for the saturation rule where the
    source's throughput allows it. Stages are in increasing load."""
    stages = [str(s) for s in stages]
    real = real.assign(stage=real.stage.astype(str), metric=real.metric.replace({ttft_metric: "ttft", tput_metric: "throughput"}))
    sim = sim.assign(stage=sim.stage.astype(str), metric=sim.metric.replace({ttft_metric: "ttft", tput_metric: "throughput"}))
    cells = real.merge(sim, on=["stage", "router", "metric"], how="left", suffixes=("_real", "_sim"))
    cells = cells.rename(columns={"value_real": "real", "value_sim": "sim"})
    cells["ratio"] = cells["sim"] / cells["real"]
    routers = list(dict.fromkeys(real.router.tolist()))

    def series(table: pd.DataFrame, router: str, metric: str) -> list[float]:
        t = table[(table.router == router) & (table.metric == metric)].set_index("stage")["value"]
        return [float(t.get(s, math.nan)) for s in stages]

    per_router, saturated_from = [], {}
    for router in routers:
        real_ttft, sim_ttft = series(real, router, "ttft"), series(sim, router, "ttft")
        sat = {}
        for side, ttft, table in (("real", real_ttft, real), ("sim", sim_ttft, sim)):
            known = [k for k, v in enumerate(ttft) if not math.isnan(v)]
            if len(known) < 2:
                sat[side] = "n/a"
                continue
            tput = series(table, router, "throughput")
            off = [offered[s] for s in stages] if offered else None
            k = saturation_stage([ttft[i] for i in known], [tput[i] for i in known] if off else None,
                                 [off[i] for i in known] if off else None)
            sat[side] = None if k is None else known[k]
        saturated_from[router] = sat["real"]
        ok = None
        if "n/a" not in (sat["real"], sat["sim"]):
            last = len(stages)  # "never" counts as one past the last stage
            r = last if sat["real"] is None else sat["real"]
            s = last if sat["sim"] is None else sat["sim"]
            ok = abs(r - s) <= BARS["saturation_stages"]
        name = lambda k: "never" if k is None else ("n/a" if k == "n/a" else stages[k])  # noqa: E731
        mine = cells[cells.router == router]
        per_router.append({
            "router": router, "sat_real": name(sat["real"]), "sat_sim": name(sat["sim"]), "sat_ok": ok,
            "tput_ratio_mean": mine[mine.metric == "throughput"].ratio.mean(),
            "ttft_ratio_mean": mine[mine.metric == "ttft"].ratio.mean(),
        })

    def unsaturated(row) -> bool:
        k = saturated_from.get(row.router)
        return k in (None, "n/a") or stages.index(row.stage) < k

    cells["unsaturated"] = [unsaturated(r) for r in cells.itertuples()] if len(cells) else []
    per_stage = []
    for s in stages:
        row: dict[str, Any] = {"stage": s}
        for metric, key in (("ttft", "tau_ttft"), ("throughput", "tau_tput")):
            here = cells[(cells.stage == s) & (cells.metric == metric)].dropna(subset=["real", "sim"])
            row[key] = kendall_tau(here.real.tolist(), here.sim.tolist()) if len(here) >= 2 else math.nan
        # the best router: lowest TTFT, or highest throughput where no TTFT is published
        here = cells[(cells.stage == s) & (cells.metric == "ttft")].dropna(subset=["real", "sim"])
        pick = "idxmin"
        if len(here) < 2:
            here = cells[(cells.stage == s) & (cells.metric == "throughput")].dropna(subset=["real", "sim"])
            pick = "idxmax"
        if len(here) >= 2:
            row["best_real"] = here.loc[getattr(here.real, pick)(), "router"]
            row["best_sim"] = here.loc[getattr(here.sim, pick)(), "router"]
        else:
            row["best_real"] = row["best_sim"] = None
        per_stage.append(row)
    return Comparison(case, stages, routers, pd.DataFrame(per_stage), pd.DataFrame(per_router), cells)


def long_table(rows: Iterable[tuple[Any, str, str, float]]) -> pd.DataFrame:
    return pd.DataFrame(list(rows), columns=["stage", "router", "metric", "value"])


# -- reporting ------------------------------------------------------------------------------


def _fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool | np.bool_):
        return "yes" if value else "NO"
    if isinstance(value, float | np.floating):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def markdown(table: pd.DataFrame) -> str:
    head = "| " + " | ".join(table.columns) + " |"
    rule = "|" + "|".join("---" for _ in table.columns) + "|"
    body = ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join([head, rule, *body])


def report(comparison: Comparison, elapsed_s: float | None = None, write: bool = True) -> str:
    """Print and (with `write`) save results/<case>.md and results/<case>.csv."""
    c = comparison
    cells = c.cells.copy()
    parts = [f"## {c.case}", "", "Per stage and router (real vs lmsim):", "", markdown(cells), "",
             "Per stage:", "", markdown(c.per_stage), "", "Per router:", "", markdown(c.per_router), "",
             "Bars:", "", markdown(pd.DataFrame([c.bars()]))]
    parts += [""] + [f"- {n}" for n in c.notes]
    if elapsed_s is not None:
        parts += [f"- simulated in {elapsed_s:.0f} s"]
    text = "\n".join(parts) + "\n"
    print(text)
    if write:
        RESULTS_DIR.mkdir(exist_ok=True)
        (RESULTS_DIR / f"{c.case}.md").write_text(text)
        cells.to_csv(RESULTS_DIR / f"{c.case}.csv", index=False)
        pd.DataFrame([c.bars()]).to_csv(RESULTS_DIR / f"{c.case}.bars.csv", index=False)
    return text


# -- lmsim side -------------------------------------------------------------------------------

_PROFILES: dict[tuple, str] = {}
_SCRATCH = None


def profile(model: str, gpu: str, tp: int = 1, engine: str | None = None) -> str:
    """A profile folder as `lmsim profile new --model --gpu --tp [--engine]` writes it (built
    once per process, in a temporary folder)."""
    global _SCRATCH
    key = (model, gpu, tp, engine)
    if key not in _PROFILES:
        from lmsim.cli.profile import _write_new_profile, build_new

        if _SCRATCH is None:
            _SCRATCH = tempfile.TemporaryDirectory(prefix="lmsim-real-clusters-")
        data, _ = build_new(model, gpu, tp, None, engine)
        out = Path(_SCRATCH.name) / f"{Path(gpu).stem}-{model}-tp{tp}-{engine or 'default'}"
        _write_new_profile(data, out)
        _PROFILES[key] = str(out)
    return _PROFILES[key]


def run(config: dict[str, Any]):
    """lmsim's Results for an experiment given as a dict (validated as a YAML would be)."""
    import lmsim
    from lmsim.config import validate

    config = {"seed": 0, "output": {"figures": False}, **config}
    return lmsim.run(validate(config, where=config.get("name", "real-clusters")))


def stage_rows(results, router: str, labels: Sequence[Any], ttft: str = "ttft_s_mean",
               tput: str = "output_token_throughput_per_s",
               output_count: float = 1.0) -> list[tuple[Any, str, str, float]]:
    """(stage label, router, metric, value) rows from a run's per-stage summary (inference-perf's
    per-stage metrics; lmsim.engine.stages.stage_summary); `output_count`: the client's count
    of an output token (its re-tokenised output over the generated tokens)."""
    from lmsim.engine.stages import stage_summary

    table = stage_summary(results.requests)
    rows = []
    for row in table.itertuples(index=False):
        label = labels[int(row.stage)]
        rows.append((label, router, "ttft", float(getattr(row, ttft))))
        rows.append((label, router, "throughput", output_count * float(getattr(row, tput))))
    return rows


def engine_state(results, labels: Sequence[Any]) -> pd.DataFrame:
    """What only the simulator shows, per stage (from its first send to its last end): share of
    requests preempted, running requests per pod (mean, max), waiting max, KV usage (mean,
    max), the prompt-token hit share (carried over from benchmarks/a2_kv_pressure.py) and the
    mean time per output token after the first. A
    last row, "run", covers the whole run with the percentiles the llm-d reports' EPP-log
    summaries give (waiting queue and KV usage over every pod's samples: mean, p50, p90)."""
    requests, samples = results.requests, results.instances
    rows = []
    stages = sorted(set(requests["stage"].dropna().astype(int).tolist()))
    for k in [*stages, None]:
        mine = requests if k is None else requests[requests["stage"] == k]
        start, end = float(mine.arrived_at.min()), float(mine.finished_at.max())
        during = samples[(samples.time_s >= start) & (samples.time_s <= end)]
        rows.append({
            "stage": "run" if k is None else labels[k], "preempted": float((mine.num_preemptions > 0).mean()),
            "running_mean": float(during.num_running.mean()), "running_max": int(during.num_running.max()),
            "waiting_mean": float(during.num_waiting.mean()), "waiting_p50": float(during.num_waiting.quantile(0.5)),
            "waiting_p90": float(during.num_waiting.quantile(0.9)),
            "waiting_max": int(during.num_waiting.max()), "kv_mean": float(during.kv_usage_frac.mean()),
            "kv_p50": float(during.kv_usage_frac.quantile(0.5)), "kv_p90": float(during.kv_usage_frac.quantile(0.9)),
            "kv_max": float(during.kv_usage_frac.max()),
            "hit": float(mine.cached_tokens.astype(float).sum() / mine.input_tokens.sum()),
            "per_token_ms": 1000 * float((mine.e2e_s - mine.ttft_s).sum() / (mine.output_tokens - 1).sum()),
        })
    return pd.DataFrame(rows)


def epp_config(*scorers: tuple[str, dict[str, Any] | None]) -> dict[str, Any]:
    """An EndpointPickerConfig as the llm-d reports write them: the scorers, each weight 1,
    then max-score-picker; `llmd_epp` takes it as its params."""
    plugins: list[dict[str, Any]] = [{"type": "single-profile-handler"}, {"type": "max-score-picker"}]
    refs = []
    for kind, params in scorers:
        plugins.append({"type": kind, **({"parameters": params} if params else {})})
        refs.append({"pluginRef": kind, "weight": 1})
    return {"plugins": plugins,
            "schedulingProfiles": [{"name": "default", "plugins": [*refs, {"pluginRef": "max-score-picker"}]}]}


EPP_RANDOM = {"plugins": [{"type": "single-profile-handler"}, {"type": "random-picker"}],
              "schedulingProfiles": [{"name": "default", "plugins": [{"pluginRef": "random-picker"}]}]}


# llm-d's request path: the calibrated API server behind the gateway whose EPP body path
# GIE #2928 measured (lmsim.engine.frontend: 28.4e6 body bytes/s).
LLMD_FRONTEND = {"gateway_bytes_per_s": 28.4e6}

# How inference-perf counts tokens on Llama-3.1 (the llm-d reports' model): it re-tokenises
# the prompt and the streamed output text with the model's tokenizer (`apis/completion.py`
# `process_response`: `tokenizer.count_tokens`), and its output tok/s divides that count.
# The llm-d 64p-cache-load run's totals (analysis_metrics.csv, 5,460 requests of nominally
# 3,500 + 512 in and 192 out, one total per router): input 1.042-1.045 x nominal, output
# 1,028,830-1,030,054 tokens = 0.981-0.983 x generated. lmsim's synthetic text round-trips to
# its nominal length, so the prompts are scaled (`token_scale`) and the generated tokens
# counted as the client would.
LLAMA31_TOKEN_SCALE = 1.043
LLAMA31_OUTPUT_COUNT = 0.982


def llmd_ladder(case: str, routers: dict[str, Any], *, model: str, gpu: str, tp: int, kv_tokens_per_pod: int,
                num_pods: int, groups: int, per_group: int, system_len: int, question_len: int, output_len: int,
                stages: Sequence[tuple[float, float]], warmup: bool, block_size: int = 16,
                extra_cluster: dict[str, Any] | None = None, token_scale: float = LLAMA31_TOKEN_SCALE,
                output_count: float = LLAMA31_OUTPUT_COUNT) -> tuple[pd.DataFrame, dict[str, Any]]:
    """An llm-d kv-cache-manager benchmark replayed as inference-perf drove it: `shared_prefix`
    prompts (random-token text, re-tokenised), constant-rate stages with the barrier and a
    1 s interval, `output_len` tokens per request (ignore_eos), the KV pool set to the reported
    tokens per pod, llm-d's 50 ms metrics refresh, the calibrated API-server front end behind
    the gateway's measured body path (`LLMD_FRONTEND`), tokens counted as inference-perf counts
    them on Llama-3.1 (`LLAMA31_TOKEN_SCALE`, `LLAMA31_OUTPUT_COUNT`).
    `routers`: real label -> lmsim `router:` mapping. Returns the per-stage long table (the
    warm-up stage dropped when `warmup`) and each router's `engine_state` table."""
    labels = ["warm-up" if warmup and k == 0 else f"{rate:g}" for k, (rate, _) in enumerate(stages)]
    rows, summaries = [], {}
    for label, router in routers.items():
        results = run({
            "name": f"{case}-{label}",
            "workload": {"generator": {"name": "shared_prefix", "params": {
                "num_groups": groups, "num_prompts_per_group": per_group, "system_prompt_len": system_len,
                "question_len": question_len, "output_len": output_len, "load_type": "constant", "interval_s": 1.0,
                "block_size": block_size, "token_scale": token_scale,
                "stages": [{"rate": rate, "duration": duration} for rate, duration in stages]}}},
            "cluster": {"num_instances": num_pods, "profile": profile(model, gpu, tp), "block_size": block_size,
                        "num_gpu_blocks": kv_tokens_per_pod // block_size, **(extra_cluster or {})},
            "router": {**router, "view": {"metrics_path": "llm-d", **router.get("view", {})}},
            "frontend": LLMD_FRONTEND,
        })
        rows += [r for r in stage_rows(results, label, labels, output_count=output_count) if r[0] != "warm-up"]
        summaries[label] = engine_state(results, labels)
    return long_table(rows), summaries


def report_engine_state(case: str, tables: dict[str, pd.DataFrame], write: bool = True) -> str:
    """Print (and save as results/<case>-engine.md) each router's `engine_state` table."""
    parts = [f"### {case}: lmsim's engine state per stage", ""]
    for router, table in tables.items():
        parts += [f"{router}:", "", markdown(table), ""]
    text = "\n".join(parts)
    print(text)
    if write:
        RESULTS_DIR.mkdir(exist_ok=True)
        (RESULTS_DIR / f"{case}-engine.md").write_text(text)
    return text


def run_llmd_case(case: str, routers: dict, real: Any, labels: list[str], note: str, **ladder: Any) -> Any:
    """An llm-d ladder case end to end: replay (`llmd_ladder`), compare with the real rows,
    print the report and the per-stage engine state; the comparison for run_all."""
    start = time.perf_counter()
    sim, engine = llmd_ladder(case, routers, **ladder)
    comparison = compare(case, real, sim, labels)
    comparison.notes.append(note)
    comparison.engine = engine
    report(comparison, time.perf_counter() - start)
    report_engine_state(case, engine)
    return comparison


def ladder_selection(argv: Any, doc: str, stages: Sequence[tuple[float, float]], routers: dict, *,
                     warmup: bool) -> tuple[list, dict, list[str]]:
    """An llm-d ladder case's command line (`--stages N`, `--routers a,b`): the stages and
    routers to run, and the labels of the stages compared (the warm-up stage, when there is
    one, is run but not compared)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--stages", type=int, default=len(stages),
                        help="run the first N stages" + (" (warm-up included)" if warmup else ""))
    parser.add_argument("--routers", default=",".join(routers))
    args = parser.parse_args(argv)
    chosen = list(stages[: args.stages])
    picked = {name: routers[name] for name in args.routers.split(",")}
    labels = [f"{rate:g}" for rate, _ in chosen[1 if warmup else 0:]]
    return chosen, picked, labels

