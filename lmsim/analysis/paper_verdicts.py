"""The numbers behind the claims table of experiments/paper/README.md, from saved results only.

    python -m lmsim.analysis.paper_verdicts runs/paper                   # markdown on stdout
    python -m lmsim.analysis.paper_verdicts runs/paper --json runs/paper/verdicts.json \
        --before experiments/paper/verdicts_before.json                # + before -> after

Every claim of the table gets one section with the numbers its row quotes (latencies in ms),
computed from `runs/paper/<fig>/sweep.parquet` and, for Figures 16 and 21, the runs'
requests and router events. Sections whose sweep is missing are skipped. `--json` writes
every number under a flat key (`fig23/toolagent/load=0.5/lmetric/ttft_mean_ms`), so two
rounds can be compared: `--before FILE` appends a table of every key both hold, before ->
after. `verdicts_before.json` holds the numbers the README quoted before the round that
added this script (transcribed from its claims table; see its `source`).

llm-d appears twice in Figures 22 and 23 (issue 27): "llm-d (oracle)", its exact estimator,
at seed 0 like every other policy, and "llm-d (deployed)", the Figure 16 estimate error, at
seeds 0-2, where LMetric also runs. Verdicts on "LMetric beats llm-d" are judged against the
deployed one, paired by seed (mean ± 95% CI over the seeds, `lmsim.study.replicates`); the
oracle is shown beside it at seed 0. Rankings among all policies use seed 0, where every
policy ran.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from lmsim.study.index import read_index
from lmsim.study.replicates import paired
from lmsim.viz.runs import flatten
from lmsim.viz.titles import TRACE_NAMES, policy_words

ORACLE, DEPLOYED = "llm-d (oracle)", "llm-d (deployed)"
# The study's six policies, llm-d as deployed in place of the oracle (what a reader can run)
# and as the oracle (what the earlier rounds reported).
SIX_DEPLOYED = ("vllm", "bailian", "dynamo", "aibrix", DEPLOYED, "lmetric")
SIX_ORACLE = ("vllm", "bailian", "dynamo", "aibrix", ORACLE, "lmetric")
SEED_LAMBDA = {"chatbot": 0.7, "agent": 0.55}  # the seed paper's Figure 11 values
QWEN3 = "h20/qwen3-30b-a3b"
GEN, POL, LOAD = "workload.generator.name", "router.policy", "workload.load"

Numbers = dict[str, Any]


# -- reading -----------------------------------------------------------------------------


def load(root: Path, fig: str) -> pd.DataFrame | None:
    """The sweep's index with `trace` (generator name, `-qwen2-7b` for Agent on Qwen2-7B),
    `arm` (the policy's name in figures: "llm-d (deployed)") and `seed` (0 when not swept)."""
    if not (root / fig / "sweep.parquet").exists():
        return None
    frame = read_index(root / fig)
    shared = _first_config(root / fig, frame)
    for key, default in (("seed", 0), (GEN, "workload"), ("cluster.profile", QWEN3)):
        if key not in frame:  # not swept: every run has the first run's value
            frame[key] = shared.get(key, default)
    frame["trace"] = [n if p == QWEN3 or not isinstance(p, str) else f"{n}-{p.split('/')[-1]}"
                      for n, p in zip(frame[GEN], frame["cluster.profile"])]  # fmt: skip
    frame["arm"] = [_arm(row) for _, row in frame.iterrows()]
    frame.attrs["root"] = root / fig
    return frame


def _first_config(sweep: Path, frame: pd.DataFrame) -> dict[str, Any]:
    path = sweep / str(frame["run"].iloc[0]) / "config.yaml" if len(frame) else sweep / "missing"
    return flatten(yaml.safe_load(path.read_text()) or {}) if path.exists() else {}


def _arm(row: pd.Series) -> str:
    policy = str(row.get(POL, row.get("policy", "run")))
    config = {k: (v.item() if isinstance(v, np.generic) else v) for k, v in row.items()
              if str(k).startswith("router.params.") and not _missing(v)}  # fmt: skip
    return policy_words(policy, config)[0]


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def trace_words(trace: str) -> str:
    name, _, model = trace.partition("-")
    return TRACE_NAMES.get(name, name) + (f" ({model})" if model else "")


def select(frame: pd.DataFrame, **where: Any) -> pd.DataFrame:
    mask = pd.Series(True, index=frame.index)
    for key, value in where.items():
        key = {"load": LOAD, "policy": POL}.get(key, key)
        mask &= frame[key].isna() if value is None else np.isclose(frame[key], value) if isinstance(value, float) else frame[key] == value
    return frame[mask]


def value(frame: pd.DataFrame, metric: str, seed: int | None = 0, **where: Any) -> float:
    """`metric` (seconds -> ms for latencies) of the rows matching `where`: at `seed`, or the
    mean over seeds when `seed` is None; NaN when no run matches."""
    rows = select(frame, **where)
    if seed is not None:
        rows = rows[rows["seed"] == seed]
    if not len(rows):
        return math.nan
    scale = 1000.0 if metric.endswith(("_mean", "_p50", "_p90", "_p99")) and metric.split("_")[0] in (
        "ttft", "tpot", "itl", "e2e", "queue") else 1.0  # fmt: skip
    return float(rows[metric].astype(float).mean()) * scale


def short(metric: str) -> str:
    """`ttft_s_mean` -> `ttft_mean`: the metric's name in a key of the numbers."""
    return metric.replace("_s_", "_")


def pct(a: float, b: float) -> float:
    return 100.0 * (a - b) / b if b else math.nan


def fmt(x: float, digits: int = 3) -> str:
    """Three significant digits (1,837; 170; 41.9; 0.42)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if 0 < abs(x) < 1e-3:  # e.g. the oracle's median prediction error: float noise, not digits
        return f"{x:.0e}"
    return f"{x:.{max(0, digits - 1 - math.floor(math.log10(abs(x))))}f}" if x else "0"


def fpct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:+.0f}%" if abs(x) >= 1 else f"{x:+.1f}%"


# -- claims ------------------------------------------------------------------------------


def capacities(root: Path, n: Numbers) -> list[str]:
    out = ["## Capacities the runs were scaled by (req/s)", ""]
    for fig in ("fig22", "fig23", "fig21", "canary"):
        frame = load(root, fig)
        if frame is None or "capacity_req_s" not in frame:
            continue
        for group, sub in frame.groupby(["trace", "arm"] if fig == "canary" else ["trace"]):
            key = f"capacity/{group[0]}" + (f"/canary-{group[1]}" if fig == "canary" else "")
            if key not in n:
                n[key] = float(sub["capacity_req_s"].iloc[0])
                out.append(f"- {key}: {fmt(n[key], 4)}")
    return out


def fig11(root: Path, n: Numbers) -> list[str]:
    frame = load(root, "fig11")
    if frame is None:
        return []
    out = ["## Fig. 11: Bailian λ", ""]
    curves = {}
    for trace, sub in frame.groupby("trace", sort=False):
        curve = sub.groupby("router.params.lambda")["ttft_s_mean"].mean() * 1000.0
        curves[trace] = curve
        best = float(curve.idxmin())
        n[f"fig11/{trace}/best_lambda"], n[f"fig11/{trace}/best_ttft_ms"] = best, float(curve.min())
        for lam, ttft in curve.items():
            n[f"fig11/{trace}/ttft_ms@{lam:g}"] = float(ttft)
        mid = curve[(curve.index >= 0.05) & (curve.index <= 0.5)]
        n[f"fig11/{trace}/worst_0.05-0.5_pct"] = pct(float(mid.max()), float(curve.min()))
        text = f"- {trace_words(trace)}: best λ {best:g} ({fmt(curve.min())} ms); λ 0.05-0.5 within {fpct(n[f'fig11/{trace}/worst_0.05-0.5_pct'])}"
        if trace in SEED_LAMBDA:
            lam = SEED_LAMBDA[trace]
            near = curve.index[np.argmin(np.abs(curve.index - lam))]
            n[f"fig11/{trace}/seed_lambda_pct"] = pct(float(curve[near]), float(curve.min()))
            text += f"; the seed's λ {lam:g}: {fmt(curve[near])} ms ({fpct(n[f'fig11/{trace}/seed_lambda_pct'])})"
        text += "; λ = 1: " + fmt(float(curve.get(1.0, math.nan))) + " ms"
        out.append(text)
    if curves:
        table = pd.DataFrame({t: c / c.min() for t, c in curves.items()}).dropna()
        worst = table.max(axis=1)
        common = float(worst.idxmin())
        n["fig11/common_lambda"], n["fig11/common_lambda_worst_pct"] = common, 100.0 * (float(worst.min()) - 1)
        out.append(f"- one λ for every trace: {common:g}, within {fpct(n['fig11/common_lambda_worst_pct'])} of each trace's best")
    tuned = load(root, "fig22")
    if tuned is not None:  # the λ fig22 uses must be this run's best
        for trace, sub in select(tuned, policy="bailian").groupby("trace"):
            used, best = float(sub["router.params.lambda"].iloc[0]), n.get(f"fig11/{trace.split('-')[0]}/best_lambda")
            if best is not None and not math.isclose(used, best):
                out.append(f"- **fig22 runs {trace_words(trace)} at λ {used:g}, but this fig11's best is {best:g}: update the YAMLs**")
    return out


def fig12(root: Path, n: Numbers) -> list[str]:
    frame = load(root, "fig12")
    if frame is None:
        return []
    key = "router.params.imbalance_abs_count"
    out = ["## Fig. 12: AIBrix threshold (P50 TTFT, P50 TPOT, mean TTFT, ms)", ""]
    for trace, sub in frame.groupby("trace", sort=False):
        cells = []
        for thr in sorted(sub[key].unique()):
            row = {m: value(sub, f"{m}", **{key: thr}) for m in ("ttft_s_p50", "tpot_s_p50", "ttft_s_mean")}
            for m, v in row.items():
                n[f"fig12/{trace}/thr={int(thr)}/{short(m)}_ms"] = v
            cells.append(f"{int(thr)}: {fmt(row['ttft_s_p50'])} / {fmt(row['tpot_s_p50'])} / {fmt(row['ttft_s_mean'])}")
        for m in ("ttft_p50", "tpot_p50", "ttft_mean"):
            a, b = n.get(f"fig12/{trace}/thr=16/{m}_ms"), n.get(f"fig12/{trace}/thr=4/{m}_ms")
            if a is not None and b is not None:
                n[f"fig12/{trace}/4to16/{m}_pct"] = pct(a, b)
        best = min(n[f"fig12/{trace}/thr={int(t)}/ttft_mean_ms"] for t in sub[key].unique())
        n[f"fig12/{trace}/aibrix_best_ttft_ms"] = best
        line = f"- {trace_words(trace)}: " + "; ".join(cells)
        line += (f". 4 -> 16: P50 TTFT {fpct(n.get(f'fig12/{trace}/4to16/ttft_p50_pct', math.nan))}, P50 TPOT "
                 f"{fpct(n.get(f'fig12/{trace}/4to16/tpot_p50_pct', math.nan))}, mean TTFT "
                 f"{fpct(n.get(f'fig12/{trace}/4to16/ttft_mean_pct', math.nan))}")  # fmt: skip
        bailian = n.get(f"fig11/{trace}/best_ttft_ms")
        if bailian is not None:
            n[f"fig12/{trace}/aibrix_vs_bailian_pct"] = pct(best, bailian)
            line += f". Best aibrix vs best bailian (fig11) mean TTFT: {fmt(best)} vs {fmt(bailian)} ({fpct(pct(best, bailian))})"
        out.append(line)
    return out


def _prediction_errors(root: Path, run: str) -> np.ndarray:
    req = pd.read_parquet(root / run / "requests.parquet", columns=["status", "ttft_s", "predicted_ttft_s"])
    req = req[(req["status"].astype(str) == "finished") & req["predicted_ttft_s"].notna() & (req["ttft_s"] > 0)]
    return (np.abs(req["predicted_ttft_s"] - req["ttft_s"]) / req["ttft_s"]).to_numpy(dtype=float)


def fig15(root: Path, n: Numbers) -> list[str]:
    frame = load(root, "fig15")
    if frame is None:
        return []
    out = ["## Figs. 15/16: llm-d's estimator tuned (its own profile) vs untuned (Qwen2-7B's)", ""]
    for trace, sub in frame.groupby("trace", sort=False):
        cells = []
        for label, est in (("tuned", None), ("untuned", "h20/qwen2-7b")):
            rows = select(sub, **{"router.params.estimator_profile": est})
            if not len(rows):
                continue
            err = _prediction_errors(frame.attrs["root"], rows["run"].iloc[0])
            n[f"fig16/{trace}/{label}/err_gt20_pct"] = 100.0 * float(np.mean(err > 0.2)) if len(err) else math.nan
            n[f"fig16/{trace}/{label}/err_median_pct"] = 100.0 * float(np.median(err)) if len(err) else math.nan
            for m in ("ttft_s_p99", "tpot_s_p99", "ttft_s_mean", "tpot_s_mean"):
                n[f"fig15/{trace}/{label}/{short(m)}_ms"] = value(rows, m)
            cells.append(label)
        if len(cells) == 2:
            for m in ("ttft_p99", "tpot_p99"):
                n[f"fig15/{trace}/tuned_vs_untuned/{m}_pct"] = pct(n[f"fig15/{trace}/tuned/{m}_ms"], n[f"fig15/{trace}/untuned/{m}_ms"])
            out.append(
                f"- {trace_words(trace)}: error > 20% tuned {fmt(n[f'fig16/{trace}/tuned/err_gt20_pct'], 2)}% vs untuned "
                f"{fmt(n[f'fig16/{trace}/untuned/err_gt20_pct'], 2)}% (median {fmt(n[f'fig16/{trace}/tuned/err_median_pct'], 2)}% vs "
                f"{fmt(n[f'fig16/{trace}/untuned/err_median_pct'], 2)}%); P99 TTFT tuned vs untuned "
                f"{fmt(n[f'fig15/{trace}/tuned/ttft_p99_ms'])} vs {fmt(n[f'fig15/{trace}/untuned/ttft_p99_ms'])} "
                f"({fpct(n[f'fig15/{trace}/tuned_vs_untuned/ttft_p99_pct'])}); P99 TPOT {fmt(n[f'fig15/{trace}/tuned/tpot_p99_ms'])} vs "
                f"{fmt(n[f'fig15/{trace}/untuned/tpot_p99_ms'])} ({fpct(n[f'fig15/{trace}/tuned_vs_untuned/tpot_p99_pct'])})"
            )  # fmt: skip
    return out


def fig19(root: Path, n: Numbers) -> list[str]:
    frame = load(root, "fig19")
    if frame is None:
        return []
    li, ki = "router.params.load_indicator", "router.params.kv_indicator"
    out = ["## Fig. 19: LMetric's indicators", ""]
    for trace, sub in frame.groupby("trace", sort=False):
        v = {(a, b): {m: value(sub, m, **{li: a, ki: b}) for m in ("ttft_s_mean", "tpot_s_mean", "tpot_s_p99")}
             for a in ("batch_size", "total_tokens") for b in ("p_token", "miss_ratio")}  # fmt: skip
        bs, tok, miss = v[("batch_size", "p_token")], v[("total_tokens", "p_token")], v[("batch_size", "miss_ratio")]
        for name, (a, b) in (("bs_vs_tokens", (bs, tok)), ("ptoken_vs_miss", (bs, miss))):
            for m in ("ttft_s_mean", "tpot_s_mean", "tpot_s_p99"):
                n[f"fig19/{trace}/{name}/{short(m)}_pct"] = pct(a[m], b[m])
        for (a, b), row in v.items():
            for m, x in row.items():
                n[f"fig19/{trace}/{a}+{b}/{short(m)}_ms"] = x
        out.append(
            f"- {trace_words(trace)}: BS vs #tokens (P-token): mean TPOT {fpct(pct(bs['tpot_s_mean'], tok['tpot_s_mean']))}, "
            f"P99 TPOT {fmt(bs['tpot_s_p99'])} vs {fmt(tok['tpot_s_p99'])}, mean TTFT {fpct(pct(bs['ttft_s_mean'], tok['ttft_s_mean']))}. "
            f"P-token vs miss ratio (BS): mean TTFT {fpct(pct(bs['ttft_s_mean'], miss['ttft_s_mean']))}, mean TPOT "
            f"{fpct(pct(bs['tpot_s_mean'], miss['tpot_s_mean']))}, P99 TPOT {fmt(bs['tpot_s_p99'])} vs {fmt(miss['tpot_s_p99'])}"
        )  # fmt: skip
    return out


def fig21(root: Path, n: Numbers) -> list[str]:
    frame = load(root, "fig21")
    if frame is None:
        return []
    base = frame.attrs["root"]
    reqs = {arm: pd.read_parquet(base / run / "requests.parquet") for arm, run in zip(frame["arm"], frame["run"])}
    first = next(iter(reqs.values()))
    burst = first.loc[first["class_id"] == 1, "arrived_at"]
    if not len(burst):
        return []
    start, end = float(burst.min()), float(burst.max())
    n["fig21/burst_start_min"], n["fig21/burst_end_min"] = start / 60.0, end / 60.0
    out = ["## Fig. 21: the KV$ hotspot", "",
           f"Burst window: requests arriving in minutes {start / 60:.1f} to {end / 60:.1f} (all classes)."]  # fmt: skip
    cells = []
    for arm, req in reqs.items():
        done = req[req["status"].astype(str) == "finished"]
        win = done[(done["arrived_at"] >= start) & (done["arrived_at"] <= end)]
        n[f"fig21/{arm}/burst_ttft_mean_ms"] = 1000.0 * float(win["ttft_s"].mean())
        n[f"fig21/{arm}/burst_tpot_mean_ms"] = 1000.0 * float(win["tpot_s"].mean())
        cells.append(f"{arm} TTFT {fmt(n[f'fig21/{arm}/burst_ttft_mean_ms'])}, TPOT {fmt(n[f'fig21/{arm}/burst_tpot_mean_ms'])}")
    out.append("- burst-window means: " + "; ".join(cells))
    if "vllm" in reqs:
        for arm in reqs:
            if arm != "vllm":
                n[f"fig21/{arm}_vs_vllm/burst_tpot_pct"] = pct(n[f"fig21/{arm}/burst_tpot_mean_ms"], n["fig21/vllm/burst_tpot_mean_ms"])
                n[f"fig21/{arm}_vs_vllm/burst_ttft_pct"] = pct(n[f"fig21/{arm}/burst_ttft_mean_ms"], n["fig21/vllm/burst_ttft_mean_ms"])
        out.append("- vs vLLM in the window: " + "; ".join(
            f"{arm} TTFT {fpct(n[f'fig21/{arm}_vs_vllm/burst_ttft_pct'])}, TPOT {fpct(n[f'fig21/{arm}_vs_vllm/burst_tpot_pct'])}"
            for arm in reqs if arm != "vllm"))  # fmt: skip
    if "lmetric" in reqs and "vllm" in reqs:
        minutes = {arm: reqs[arm][reqs[arm]["status"].astype(str) == "finished"].groupby(
            np.floor(reqs[arm]["arrived_at"] / 60.0))["ttft_s"].mean() for arm in ("lmetric", "vllm")}  # fmt: skip
        both = pd.concat(minutes, axis=1).dropna()
        n["fig21/lmetric_below_vllm_minutes"] = int((both["lmetric"] < both["vllm"]).sum())
        n["fig21/minutes"] = len(both)
        out.append(f"- LMetric's mean TTFT below vLLM's in {n['fig21/lmetric_below_vllm_minutes']} of {len(both)} arrival minutes")
    hot = select(frame, policy="lmetric_hotspot")
    if len(hot):
        path = base / hot["run"].iloc[0] / "router_events.parquet"
        ev = pd.read_parquet(path) if path.exists() else pd.DataFrame(columns=["kind"])
        alarms = ev[ev["kind"] == "hotspot_alarm"]
        n["fig21/alarms"] = len(alarms)
        burst_classes = _burst_prefix_classes(base / hot["run"].iloc[0])
        n["fig21/alarms_on_burst_class"] = int(alarms["class_id"].isin(burst_classes).sum()) if len(alarms) else 0
        n["fig21/alarms_outside_burst"] = int(((alarms["time_s"] < start) | (alarms["time_s"] > end)).sum())
        if len(alarms):
            n["fig21/first_alarm_min"], n["fig21/last_alarm_min"] = float(alarms["time_s"].min()) / 60, float(alarms["time_s"].max()) / 60
            out.append(_detector_details(ev, alarms, burst_classes, end, n))
        out.append(f"- detector: {len(alarms)} alarms, {n['fig21/alarms_on_burst_class']} on the burst class, "
                   f"{n['fig21/alarms_outside_burst']} outside the burst window"
                   + (f", minutes {n['fig21/first_alarm_min']:.1f} to {n['fig21/last_alarm_min']:.1f}" if len(alarms) else ""))  # fmt: skip
    return out


def _burst_prefix_classes(run: Path) -> set[int]:
    """The detector's classes (`class_by: prefix`: the name of a request's block at
    `prefix_depth_blocks`, lmsim.policies.lmetric) of the burst requests (class_id 1),
    recomputed from the run's generated workload: alarms name prefix classes, not class ids."""
    from lmsim.config import validate
    from lmsim.engine.kv_cache import engine_block_hashes
    from lmsim.study.experiment import generated_trace

    config = validate(yaml.safe_load((run / "config.yaml").read_text()), where=str(run / "config.yaml"))
    generator = config.workload.generator
    if generator is None:
        return set()
    trace = generated_trace(generator.name, dict(generator.params), config.seed)
    depth = int(config.router.params.get("prefix_depth_blocks", 8))
    classes = set()
    for row in np.flatnonzero(trace.column("class_id") == 1):
        names = engine_block_hashes(trace.hash_ids(row).astype(np.int64), trace.block_size,
                                    int(trace.input_tokens[row]), config.cluster.block_size)  # fmt: skip
        if names:
            classes.add(int(names[min(depth, len(names)) - 1]))
    return classes


def _detector_details(ev: pd.DataFrame, alarms: pd.DataFrame, burst: set[int], end: float, n: Numbers) -> str:
    """How long each alarm lasted (to the next clear of its class), |M| at the alarms and
    the clears, and from the last alarm to the end of the burst (`end`, s) the burst
    class's logged windows: x/(1 - x) against |M|/|M̄| (Eq. 2 holds while the first stays
    below the second)."""
    clears = ev[ev["kind"] == "hotspot_clear"]
    lasted = []
    for _, alarm in alarms.iterrows():
        later = clears[(clears["class_id"] == alarm["class_id"]) & (clears["time_s"] >= alarm["time_s"])]
        if len(later):
            lasted.append(float(later["time_s"].min() - alarm["time_s"]))
    text = "- alarms"
    if lasted:
        n["fig21/alarm_lasted_s_min"], n["fig21/alarm_lasted_s_max"] = min(lasted), max(lasted)
        text += f" cleared after {min(lasted):.2f} to {max(lasted):.2f} s"
    n["fig21/alarm_m_min"], n["fig21/alarm_m_max"] = int(alarms["m"].min()), int(alarms["m"].max())
    text += f"; |M| at the alarms {n['fig21/alarm_m_min']} to {n['fig21/alarm_m_max']}"
    cleared_m = clears.loc[clears["class_id"].isin(alarms["class_id"]), "m"].dropna()
    if len(cleared_m):
        n["fig21/clear_m_max"] = int(cleared_m.max())
        text += f", at the clears up to {n['fig21/clear_m_max']} of {int(alarms['num_instances'].iloc[0])}"
    windows = ev[(ev["kind"] == "hotspot_window") & ev["class_id"].isin(burst)
                 & (ev["time_s"] > alarms["time_s"].max()) & (ev["time_s"] <= end)]  # fmt: skip
    windows = windows[(windows["x"] < 1) & (windows["m"] < windows["num_instances"])]
    if len(windows):
        share = windows["x"] / (1 - windows["x"])
        cover = windows["m"] / (windows["num_instances"] - windows["m"])
        n["fig21/after_x_ratio_min"], n["fig21/after_x_ratio_max"] = float(share.min()), float(share.max())
        n["fig21/after_m_ratio_min"], n["fig21/after_m_ratio_max"] = float(cover.min()), float(cover.max())
        text += (f"; later in the burst its windows have x/x̄ {share.min():.2f} to {share.max():.2f} "
                 f"against |M|/|M̄| {cover.min():.2f} to {cover.max():.2f}")  # fmt: skip
    return text


def _arms(sub: pd.DataFrame) -> list[str]:
    order = {a: i for i, a in enumerate(("vllm", "bailian", "dynamo", "aibrix", ORACLE, DEPLOYED, "lmetric"))}
    return sorted(sub["arm"].unique(), key=lambda a: (order.get(a, len(order)), a))


def _per_arm(sub: pd.DataFrame, n: Numbers, prefix: str, metrics: tuple[str, ...]) -> dict[str, dict[str, float]]:
    """Each arm's metrics at seed 0 (`n[prefix/arm/metric]`) and, for arms run at several
    seeds, their mean over seeds (`.../metric@seeds`)."""
    table = {}
    for arm in _arms(sub):
        rows = sub[sub["arm"] == arm]
        table[arm] = {m: value(rows, m) for m in metrics}
        for m in metrics:
            n[f"{prefix}/{arm}/{short(m)}_ms"] = table[arm][m]
        if rows["seed"].nunique() > 1:
            for m in metrics:
                n[f"{prefix}/{arm}/{short(m)}_ms@seeds"] = value(rows, m, seed=None)
            n[f"{prefix}/{arm}/seeds"] = int(rows["seed"].nunique())
    return table


def _vs_llmd(sub: pd.DataFrame, n: Numbers, prefix: str, metric: str) -> str:
    """LMetric vs llm-d as deployed (paired by seed) and vs the oracle (seed 0), in words."""
    name = short(metric)
    d = paired(sub, metric, {"arm": "lmetric"}, {"arm": DEPLOYED})
    n[f"{prefix}/lmetric_vs_deployed/{name}_pct"] = d.mean_pct
    n[f"{prefix}/lmetric_vs_deployed/{name}_ci"] = d.half_width_pct
    n[f"{prefix}/lmetric_vs_deployed/{name}_verdict"] = d.verdict
    o = pct(value(sub, metric, arm="lmetric"), value(sub, metric, arm=ORACLE))
    n[f"{prefix}/lmetric_vs_oracle/{name}_pct"] = o
    return f"vs deployed {d} (n={d.n}), vs oracle {fpct(o)} (seed 0)"


def _best(table: dict[str, dict[str, float]], metric: str, arms: tuple[str, ...]) -> tuple[str, float]:
    present = {a: table[a][metric] for a in arms if a in table and not math.isnan(table[a][metric])}
    if not present:
        return "n/a", math.nan
    arm = min(present, key=present.get)
    return arm, present[arm]


FIG22_METRICS = ("ttft_s_mean", "ttft_s_p50", "ttft_s_p99", "tpot_s_mean", "tpot_s_p99", "queue_s_mean")


def fig22(root: Path, n: Numbers) -> list[str]:
    frame = load(root, "fig22")
    return [] if frame is None else fig22_rows(frame, n)


def fig22_rows(frame: pd.DataFrame, n: Numbers) -> list[str]:
    """Figure 22's section from its index (`load`'s columns): also for the same runs under
    another engine (engine_compare.py)."""
    out = ["## Fig. 22: every policy at 0.5 (ms; seed 0, and the mean of seeds 0-2 for the repeated arms)", "",
           "| trace | policy | mean TTFT | P50 TTFT | P99 TTFT | mean TPOT | P99 TPOT | mean queue |",
           "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    summary = []
    wins = {"ttft_mean": 0, "ttft_mean_with_oracle": 0, "tpot_mean": 0, "tpot_mean_with_oracle": 0}
    for trace, sub in frame.groupby("trace", sort=False):
        prefix = f"fig22/{trace}"
        table = _per_arm(sub, n, prefix, FIG22_METRICS)
        for arm, row in table.items():
            cells = [fmt(row[m]) for m in FIG22_METRICS]
            if f"{prefix}/{arm}/seeds" in n:
                cells = [f"{c} ({fmt(n[f'{prefix}/{arm}/{short(m)}_ms@seeds'])})" for c, m in zip(cells, FIG22_METRICS)]
            out.append(f"| {trace_words(trace)} | {arm} | " + " | ".join(cells) + " |")
        words = []
        for metric, name in (("ttft_s_mean", "mean TTFT"), ("tpot_s_mean", "mean TPOT")):
            best_d, v_d = _best(table, metric, SIX_DEPLOYED)
            best_o, _ = _best(table, metric, SIX_ORACLE)
            n[f"{prefix}/best_{short(metric)}"], n[f"{prefix}/best_{short(metric)}_with_oracle"] = best_d, best_o
            wins[short(metric)] += best_d == "lmetric"
            wins[f"{short(metric)}_with_oracle"] += best_o == "lmetric"
            words.append(f"{name}: best {best_d} ({fmt(v_d)}; with the oracle instead: {best_o}), LMetric "
                         + _vs_llmd(sub, n, prefix, metric))
        summary.append(f"- {trace_words(trace)}: " + "; ".join(words))
    for k, v in wins.items():
        n[f"fig22/lmetric_best_{k}_traces"] = v
    return [*out, "", *summary]


FIG23_METRICS = ("ttft_s_mean", "ttft_s_p99", "tpot_s_mean", "tpot_s_p99")


def fig23(root: Path, n: Numbers) -> list[str]:
    frame = load(root, "fig23")
    return [] if frame is None else fig23_rows(frame, n)


def fig23_rows(frame: pd.DataFrame, n: Numbers) -> list[str]:
    """Figure 23's section from its index, at whichever loads it holds."""
    out = ["## Fig. 23: every policy vs load (ms; seed 0; LMetric vs llm-d deployed paired over seeds 0-2)", ""]
    for trace, sub in frame.groupby("trace", sort=False):
        loads = sorted(sub[LOAD].unique())
        arms = _arms(sub)
        for metric, name in (("ttft_s_mean", "mean TTFT"), ("tpot_s_mean", "mean TPOT"), ("tpot_s_p99", "P99 TPOT")):
            out += [f"### {trace_words(trace)}: {name}", "", "| load | " + " | ".join(arms) + " | best (deployed) | LMetric vs deployed | vs oracle |",
                    "|---|" + "---|" * (len(arms) + 3)]  # fmt: skip
            for load_ in loads:
                at = sub[np.isclose(sub[LOAD], load_)]
                prefix = f"fig23/{trace}/load={load_:g}"
                table = _per_arm(at, n, prefix, FIG23_METRICS)
                best, _ = _best(table, metric, SIX_DEPLOYED)
                n[f"{prefix}/best_{short(metric)}"] = best
                n[f"{prefix}/best_{short(metric)}_with_oracle"] = _best(table, metric, SIX_ORACLE)[0]
                vs = _vs_llmd(at, n, prefix, metric)
                out.append(f"| {load_:g} | " + " | ".join(fmt(table[a][metric]) for a in arms) + f" | {best} | "
                           + vs.replace(", vs oracle", " |").replace(" (seed 0)", "") + " |")  # fmt: skip
            out.append("")
        gaps = []
        for label, six in (("oracle", SIX_ORACLE), ("deployed", SIX_DEPLOYED)):
            ratios = []
            for load_ in loads:
                vals = [n.get(f"fig23/{trace}/load={load_:g}/{a}/ttft_mean_ms", math.nan) for a in six]
                vals = [v for v in vals if not math.isnan(v)]
                r = max(vals) / min(vals) if vals else math.nan
                n[f"fig23/{trace}/load={load_:g}/gap_{label}"] = r
                ratios.append(r)
            n[f"fig23/{trace}/gap_rises_{label}"] = int(sum(b > a for a, b in itertools.pairwise(ratios)))
            gaps.append(f"{label}: " + " -> ".join(f"{r:.2f}" for r in ratios))
        out.append(f"Max/min mean TTFT over the six policies by load (llm-d as {'; '.join(gaps)})")
        for metric in ("ttft_mean", "tpot_mean"):
            for suffix, words in (("", "llm-d as deployed"), ("_with_oracle", "llm-d's oracle")):
                lowest = [f"{x:g}" for x in loads if n[f"fig23/{trace}/load={x:g}/best_{metric}{suffix}"] == "lmetric"]
                n[f"fig23/{trace}/lmetric_best_{metric}_loads{suffix}"] = len(lowest)
                out.append(f"- LMetric has the lowest {metric.replace('_', ' ')} among the six (with {words}; seed 0) "
                           f"at loads: {', '.join(lowest) or 'none'}")  # fmt: skip
        out.append("")
        if trace == "toolagent":
            out += _toolagent_tail(sub, n, loads)
    return out


def _toolagent_tail(sub: pd.DataFrame, n: Numbers, loads: list[float]) -> list[str]:
    """Fig. 15's claim: llm-d's ToolAgent P99 TPOT is 71% worse than the best linear
    combination (the better of bailian and dynamo), per load."""
    out = ["### ToolAgent: llm-d's P99 TPOT vs the better of bailian and dynamo (Fig. 15's claim)", "",
           "| load | deployed (mean of seeds) | deployed seed 0 | oracle | best linear | deployed vs it | oracle vs it | LMetric |",
           "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for load_ in loads:
        p = f"fig23/toolagent/load={load_:g}"
        lin = min(n.get(f"{p}/bailian/tpot_p99_ms", math.inf), n.get(f"{p}/dynamo/tpot_p99_ms", math.inf))
        dep = n.get(f"{p}/{DEPLOYED}/tpot_p99_ms@seeds", n.get(f"{p}/{DEPLOYED}/tpot_p99_ms", math.nan))
        ora = n.get(f"{p}/{ORACLE}/tpot_p99_ms", math.nan)
        n[f"{p}/deployed_vs_linear/tpot_p99_pct"], n[f"{p}/oracle_vs_linear/tpot_p99_pct"] = pct(dep, lin), pct(ora, lin)
        out.append(f"| {load_:g} | {fmt(dep)} | {fmt(n.get(f'{p}/{DEPLOYED}/tpot_p99_ms', math.nan))} | {fmt(ora)} | {fmt(lin)} | "
                   f"{fpct(pct(dep, lin))} | {fpct(pct(ora, lin))} | {fmt(n.get(f'{p}/lmetric/tpot_p99_ms', math.nan))} |")  # fmt: skip
    return [*out, ""]


def fig26(root: Path, n: Numbers) -> list[str]:
    frame = load(root, "fig26")
    if frame is None:
        return []
    out = ["## Fig. 26: LMetric vs Preble and PolyServe on ChatBot (LMetric vs Preble, %)", "",
           "| load | mean TTFT | P99 TTFT | mean TPOT | P99 TPOT | PolyServe mean TTFT / TPOT |", "|---|---|---|---|---|---|"]
    for load_ in sorted(frame[LOAD].unique()):
        at = frame[np.isclose(frame[LOAD], load_)]
        cells = []
        for m in FIG23_METRICS:
            a, b = value(at, m, arm="lmetric"), value(at, m, arm="preble")
            n[f"fig26/load={load_:g}/lmetric_vs_preble/{short(m)}_pct"] = pct(a, b)
            n[f"fig26/load={load_:g}/lmetric/{short(m)}_ms"] = a
            n[f"fig26/load={load_:g}/preble/{short(m)}_ms"] = b
            cells.append(f"{fpct(pct(a, b))} ({fmt(a)} vs {fmt(b)})")
        pt, pp = value(at, "ttft_s_mean", arm="polyserve"), value(at, "tpot_s_mean", arm="polyserve")
        n[f"fig26/load={load_:g}/polyserve/ttft_mean_ms"], n[f"fig26/load={load_:g}/polyserve/tpot_mean_ms"] = pt, pp
        out.append(f"| {load_:g} | " + " | ".join(cells) + f" | {fmt(pt)} / {fmt(pp)} |")
    return out


def canary(root: Path, n: Numbers) -> list[str]:
    frame = load(root, "canary")
    if frame is None:
        return []
    t = {a: value(frame, "ttft_s_mean", arm=a) for a in ("lmetric", "bailian")}
    p = {a: value(frame, "tpot_s_mean", arm=a) for a in ("lmetric", "bailian")}
    h = {a: value(frame, "prefix_hit_ratio", arm=a) for a in ("lmetric", "bailian")}
    for a in t:
        n[f"canary/{a}/ttft_mean_ms"], n[f"canary/{a}/tpot_mean_ms"], n[f"canary/{a}/hit"] = t[a], p[a], h[a]
    n["canary/ttft_pct"], n["canary/tpot_pct"] = pct(t["lmetric"], t["bailian"]), pct(p["lmetric"], p["bailian"])
    return ["## Fig. 29: the canary", "",
            f"- LMetric vs Bailian: mean TTFT {fmt(t['lmetric'])} vs {fmt(t['bailian'])} ({fpct(n['canary/ttft_pct'])}), "
            f"mean TPOT {fmt(p['lmetric'])} vs {fmt(p['bailian'])} ({fpct(n['canary/tpot_pct'])}), hit {h['lmetric']:.2f} vs {h['bailian']:.2f}"]  # fmt: skip


SWEEPS = ("fig11", "fig12", "fig15", "fig19", "fig21", "fig22", "fig23", "fig26", "canary")


def setup(root: Path, n: Numbers) -> list[str]:
    """The Setup section's sizes: runs per sweep, each trace's replayed N and its span of
    nominal arrivals N / (load x capacity) in fig22 and fig23, and how long the closed-loop
    Coder runs, the hotspot and the canary arms really last (first arrival to last finish)."""
    out = ["## Setup: runs, spans and run lengths", ""]
    frames = {fig: load(root, fig) for fig in SWEEPS}
    frames = {fig: f for fig, f in frames.items() if f is not None}
    if not frames:
        return []
    for fig, frame in frames.items():
        n[f"runs/{fig}"] = len(frame)
    n["runs/total"] = sum(len(f) for f in frames.values())
    n["runs/load_sweeps"] = sum(len(frames[f]) for f in ("fig23", "fig26") if f in frames)
    out.append(f"- runs: {n['runs/total']} ({', '.join(f'{fig} {len(f)}' for fig, f in frames.items())}); "
               f"fig23 + fig26: {n['runs/load_sweeps']}")  # fmt: skip
    for fig in ("fig22", "fig23"):
        frame = frames.get(fig)
        if frame is None or "load_rate_req_s" not in frame:
            continue
        seed0 = frame[frame["seed"] == 0]
        for trace, sub in seed0.groupby("trace", sort=False):
            size = int(sub["workload.limit"].iloc[0]) if "workload.limit" in sub and pd.notna(sub["workload.limit"].iloc[0]) else int(sub["num_requests"].iloc[0])
            n[f"setup/{fig}/{trace}/requests"] = size
            cells = []
            for at, rows in (sub.groupby(LOAD) if LOAD in sub else [(0.5, sub)]):
                span = size / float(rows["load_rate_req_s"].iloc[0])
                n[f"setup/{fig}/{trace}/load={at:g}/span_s"] = span
                text = f"{at:g}: {fmt(span)} s"
                if trace.startswith("coder"):
                    lo, hi = float(rows["duration_s"].min()) / 60, float(rows["duration_s"].max()) / 60
                    n[f"setup/{fig}/{trace}/load={at:g}/run_min_min"], n[f"setup/{fig}/{trace}/load={at:g}/run_min_max"] = lo, hi
                    text += f" (runs last {lo:.1f} to {hi:.1f} min)"
                cells.append(text)
            out.append(f"- {fig} {trace_words(trace)}, N = {size:,}: span by load " + "; ".join(cells))
    if "fig11" in frames:
        coder = frames["fig11"][(frames["fig11"]["trace"] == "coder") & (frames["fig11"]["router.params.lambda"] >= 0.9 - 1e-9)]
        if len(coder):
            n["setup/fig11/coder/lambda>=0.9/run_min_min"] = float(coder["duration_s"].min()) / 60
            n["setup/fig11/coder/lambda>=0.9/run_min_max"] = float(coder["duration_s"].max()) / 60
            out.append(f"- fig11 Coder at λ ≥ 0.9: runs last {n['setup/fig11/coder/lambda>=0.9/run_min_min']:.1f} to "
                       f"{n['setup/fig11/coder/lambda>=0.9/run_min_max']:.1f} min")  # fmt: skip
    for fig in ("fig21", "canary"):
        frame = frames.get(fig)
        if frame is None:
            continue
        for _, row in frame.iterrows():
            arrived = pd.read_parquet(frame.attrs["root"] / row["run"] / "requests.parquet", columns=["arrived_at"])["arrived_at"]
            key = f"setup/{fig}/{row['arm']}"
            n[f"{key}/arrivals_min"] = float(arrived.max() - arrived.min()) / 60
            n[f"{key}/run_min"] = float(row["duration_s"]) / 60
            n[f"{key}/requests"] = int(row["num_requests"])
            offered = row.get("load_rate_req_s")
            if pd.notna(offered) and fig == "canary":
                instances = _first_config(frame.attrs["root"], frame[frame["run"] == row["run"]]).get("cluster.num_instances")
                if instances:
                    n[f"{key}/req_s_per_instance"] = float(offered) / int(instances)
            out.append(f"- {fig} {row['arm']}: {n[f'{key}/requests']:,} requests arriving over {n[f'{key}/arrivals_min']:.1f} min, "
                       f"run lasts {n[f'{key}/run_min']:.1f} min"
                       + (f", {n[f'{key}/req_s_per_instance']:.2f} req/s per instance" if f"{key}/req_s_per_instance" in n else ""))  # fmt: skip
    return out


def coder(root: Path, n: Numbers) -> list[str]:
    """'Coder at 0.5': per policy (seed 0) the mean and median queueing delay, the prefix
    hit ratio and the mean TTFT in fig22, and in fig23 at 0.5 and 0.9 the mean queueing
    delay, mean TTFT and preemptions."""
    out = ["## Coder at 0.5 and 0.9 (s; seed 0)", "", "| sweep | load | policy | mean queue | P50 queue | hit | mean TTFT | preemptions |",
           "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for fig, loads in (("fig22", (None,)), ("fig23", (0.5, 0.9))):
        frame = load(root, fig)
        if frame is None:
            continue
        sub = frame[(frame["trace"] == "coder") & (frame["seed"] == 0)]
        for at in loads:
            rows = sub if at is None else sub[np.isclose(sub[LOAD], at)]
            for arm in _arms(rows):
                r = rows[rows["arm"] == arm].iloc[0]
                key = f"coder/{fig}" + ("" if at is None else f"/load={at:g}") + f"/{arm}"
                n[f"{key}/queue_mean_s"], n[f"{key}/queue_p50_s"] = float(r["queue_s_mean"]), float(r["queue_s_p50"])
                n[f"{key}/hit"], n[f"{key}/ttft_mean_s"] = float(r["prefix_hit_ratio"]), float(r["ttft_s_mean"])
                n[f"{key}/preemptions"] = int(r["num_preemptions"])
                out.append(f"| {fig} | {0.5 if at is None else at:g} | {arm} | {r['queue_s_mean']:.2f} | {r['queue_s_p50']:.2f} | "
                           f"{r['prefix_hit_ratio']:.2f} | {r['ttft_s_mean']:.1f} | {int(r['num_preemptions'])} |")  # fmt: skip
    return out if len(out) > 4 else []


SECTIONS = (capacities, setup, fig11, fig12, fig15, fig19, fig21, fig22, fig23, coder, fig26, canary)


# -- before -> after ---------------------------------------------------------------------


def compare(before: Numbers, after: Numbers, labels: tuple[str, str] = ("before", "after")) -> list[str]:
    """Every key both rounds hold: before, after, and the relative change of numbers
    (percentages: the change in points)."""
    out = [f"## {labels[0].capitalize()} -> {labels[1]}", "", f"| key | {labels[0]} | {labels[1]} | change |",
           "|---|---|---|---|"]  # fmt: skip
    for key in sorted(set(before) & set(after)):
        b, a = before[key], after[key]
        if isinstance(b, (int, float)) and isinstance(a, (int, float)) and not isinstance(b, bool):
            change = "" if key.endswith("_pct") or key.endswith("_ci") or not b else fpct(pct(float(a), float(b)))
            if key.endswith("_pct"):
                change = f"{float(a) - float(b):+.0f} points"
            out.append(f"| {key} | {fmt(float(b))} | {fmt(float(a))} | {change} |")
        else:
            out.append(f"| {key} | {b} | {a} | {'same' if a == b else 'changed'} |")
    return out


# Keys that carry a verdict rather than a measurement: who is best, a paired verdict, how
# many traces or loads a claim holds at, how often a gap rises.
VERDICT_KEYS = ("/best_", "_verdict", "/lmetric_best_", "/gap_rises_", "fig11/common_lambda", "/best_lambda")


def changed_verdicts(before: Numbers, after: Numbers, labels: tuple[str, str] = ("before", "after")) -> list[str]:
    """The verdict keys (VERDICT_KEYS) both rounds hold whose value differs, first in a
    list of their own so a reader sees what flipped before the full table."""
    keys = [k for k in sorted(set(before) & set(after))
            if any(m in k for m in VERDICT_KEYS) and not k.endswith(("_ms", "_pct"))]  # fmt: skip
    flipped = [k for k in keys if before[k] != after[k]]
    out = [f"## Verdicts that differ, {labels[0]} -> {labels[1]} ({len(flipped)} of {len(keys)})", ""]
    out += [f"- {k}: {before[k]} -> {after[k]}" for k in flipped]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", default="runs/paper", type=Path)
    parser.add_argument("--json", type=Path, help="write every number here")
    parser.add_argument("--before", type=Path, help="a --json file of an earlier round: add before -> after")
    args = parser.parse_args(argv)
    numbers: Numbers = {}
    lines: list[str] = []
    for section in SECTIONS:
        rows = section(args.root, numbers)
        if rows:
            lines += [*rows, ""]
    if not numbers:
        print(f"{args.root}: no paper sweep found (expected {args.root}/fig11/sweep.parquet, ...)", file=sys.stderr)
        return 2
    if args.before is not None:
        before = json.loads(args.before.read_text())
        before = before.get("numbers", before)
        lines += [*changed_verdicts(before, numbers), "", *compare(before, numbers)]
    print("\n".join(lines))
    if args.json is not None:
        clean = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in numbers.items()}
        tmp = args.json.with_name(f".{args.json.name}.tmp")
        tmp.write_text(json.dumps({"numbers": clean}, indent=1, sort_keys=True) + "\n")
        tmp.replace(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
