"""The reduced reproduction's claims tables, from saved sweeps only (runs/paper-reduced/*).

Every difference is paired by seed and reported as mean ± 95% CI half-width (Student's t over
the seeds, `lmsim.study.replicates`); "tie" when the interval spans zero. Usage:
    python -m lmsim.analysis.paper_claims_reduced runs/paper-reduced > claims.md
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from lmsim.study.index import read_index
from lmsim.study.replicates import paired, relative_difference
from lmsim.viz.titles import policy_words

TRACES = ("chatbot", "agent", "toolagent", "coder")
LMETRIC = {  # variant label -> (bs_plus_one, p_token)
    "+1, instance": (True, "instance_total"),
    "+1, request": (True, "request"),
    "no +1, instance": (False, "instance_total"),
    "no +1, request": (False, "request"),
}
BASELINES = ("vllm", "bailian", "dynamo", "llmd", "llmd_deployed")
# What the figures call llm-d's two estimators (lmsim.viz.titles.NAMED_VARIANTS, issue 27)
BASELINE_NAMES = {"llmd": "llm-d (oracle)", "llmd_deployed": "llm-d (deployed)"}
GEN, LOAD, POL = "workload.generator.name", "workload.load", "router.policy"


def _load(root: Path, name: str) -> pd.DataFrame | None:
    path = root / name
    if not (path / "sweep.parquet").exists():
        return None
    return read_index(path)


def lmetric_arm(variant: str) -> dict:
    plus, ptok = LMETRIC[variant]
    return {POL: "lmetric", "router.params.bs_plus_one": plus, "router.params.p_token": ptok}


def choices_tables(frame: pd.DataFrame) -> list[str]:
    out = ["## LMetric's open choices: each variant vs vLLM (mean TTFT / mean TPOT, % ± 95% CI)", "",
           "| trace | load | " + " | ".join(LMETRIC) + " |", "|---|---|" + "---|" * len(LMETRIC)]
    for trace in TRACES:
        for load in sorted(frame.loc[frame[GEN] == trace, LOAD].unique()):
            where = {GEN: trace, LOAD: load}
            cells = []
            for v in LMETRIC:
                t = paired(frame, "ttft_s_mean", lmetric_arm(v), {POL: "vllm"}, where)
                p = paired(frame, "tpot_s_mean", lmetric_arm(v), {POL: "vllm"}, where)
                hit = frame[_mask(frame, {**where, **lmetric_arm(v)})]["prefix_hit_ratio"].mean()
                cells.append(f"TTFT {t}<br>TPOT {p}<br>hit {hit:.2f}")
            out.append(f"| {trace} | {load} | " + " | ".join(cells) + " |")
    out += ["", "## Headline: LMetric vs every baseline, per variant (mean TTFT; mean TPOT)", "",
            "Verdict per cell: lower = LMetric better, higher = worse, tie = interval spans 0.", "",
            "| trace | load | baseline | " + " | ".join(LMETRIC) + " |", "|---|---|---|" + "---|" * len(LMETRIC)]
    for trace in TRACES:
        for load in sorted(frame.loc[frame[GEN] == trace, LOAD].unique()):
            where = {GEN: trace, LOAD: load}
            for base in BASELINES:
                cells = []
                for v in LMETRIC:
                    t = paired(frame, "ttft_s_mean", lmetric_arm(v), {POL: base}, where)
                    p = paired(frame, "tpot_s_mean", lmetric_arm(v), {POL: base}, where)
                    cells.append(f"{t}; {p}")
                out.append(f"| {trace} | {load} | {BASELINE_NAMES.get(base, base)} | " + " | ".join(cells) + " |")
    return out


def _mask(frame: pd.DataFrame, cond: dict) -> pd.Series:
    mask = pd.Series(True, index=frame.index)
    for k, v in cond.items():
        mask &= frame[k].isna() if v is None else frame[k] == v
    return mask


def bailian_table(frame: pd.DataFrame) -> list[str]:
    out = ["## Bailian: Figure 11 under both normalisations (mean TTFT ms, mean over seeds)", "",
           "| trace | normalize | best λ (per seed) | TTFT at best | λ = seed's value vs best |",
           "|---|---|---|---|---|"]
    seed_lambda = {"chatbot": 0.7, "agent": 0.55}
    for (trace, norm), sub in frame.groupby([GEN, "router.params.normalize"]):
        mean = sub.groupby("router.params.lambda")["ttft_s_mean"].mean()
        best = float(mean.idxmin())
        per_seed = sub.loc[sub.groupby("seed")["ttft_s_mean"].idxmin(), "router.params.lambda"].tolist()
        target = min(mean.index, key=lambda x: abs(x - seed_lambda[trace]))
        d = paired(sub, "ttft_s_mean", {"router.params.lambda": target}, {"router.params.lambda": best})
        out.append(f"| {trace} | {norm} | {best} ({', '.join(map(str, per_seed))}) | "
                   f"{1000 * mean[best]:.0f} | λ {target}: {d} |")
    return out


def hotspot_table(root: Path, frame: pd.DataFrame) -> list[str]:
    """Burst window = from the first to the last arrival of the burst class (class_id 1) in each
    run, as verdicts.py's Figure 21: where it falls moves with the capacity the load is a
    fraction of (a fixed window of seconds stops covering it when the capacity is re-measured)."""
    out = ["## Figure 21 both ways: burst-window means (arrivals of the burst class), % vs vLLM ± 95% CI", "",
           "| arm | TTFT | TPOT | hit |", "|---|---|---|---|"]
    rows = []
    for _, r in frame.iterrows():
        req = pd.read_parquet(root / "choices_hotspot" / r["run"] / "requests.parquet",
                              columns=["arrived_at", "ttft_s", "tpot_s", "cached_tokens", "input_tokens", "class_id"]
                              ) if (root / "choices_hotspot" / r["run"]).exists() else None
        if req is None:
            continue
        arrivals = req.loc[req["class_id"] == 1, "arrived_at"]
        if not len(arrivals):
            continue
        burst = req[(req["arrived_at"] >= arrivals.min()) & (req["arrived_at"] <= arrivals.max())]
        rows.append({POL: r[POL], "plus": r.get("router.params.bs_plus_one"), "seed": r["seed"],
                     "ttft": burst["ttft_s"].mean(), "tpot": burst["tpot_s"].mean(),
                     "hit": burst["cached_tokens"].sum() / max(1, burst["input_tokens"].sum())})
    df = pd.DataFrame(rows)
    if df.empty:
        return out
    base = df[df[POL] == "vllm"].set_index("seed")
    for (pol, plus), sub in df[df[POL] != "vllm"].groupby([POL, "plus"]):
        sub = sub.set_index("seed")
        seeds = sorted(set(sub.index) & set(base.index))
        t = relative_difference([sub.loc[s, "ttft"] for s in seeds], [base.loc[s, "ttft"] for s in seeds])
        p = relative_difference([sub.loc[s, "tpot"] for s in seeds], [base.loc[s, "tpot"] for s in seeds])
        out.append(f"| {pol} bs_plus_one={plus} | {t} | {p} | {sub['hit'].mean():.2f} |")
    return out


def simple_vs(frame: pd.DataFrame, title: str, key: str, base: dict, extra: str = "") -> list[str]:
    out = [f"## {title}", "", f"| {key} | mean TTFT vs base | mean TPOT vs base | hit |", "|---|---|---|---|"]
    for value, sub in frame.groupby(key, dropna=False):
        t = paired(frame, "ttft_s_mean", {key: value}, base)
        p = paired(frame, "tpot_s_mean", {key: value}, base)
        out.append(f"| {value} | {t} | {p} | {sub['prefix_hit_ratio'].mean():.3f} |")
    return out + ([extra] if extra else [])


def main(root: Path) -> None:
    lines: list[str] = []

    def section(rows: list[str]) -> None:
        lines.extend(rows)
        lines.append("")

    frame = _load(root, "choices")
    if frame is not None:
        deployed = _load(root, "choices_llmd_deployed")
        if deployed is not None:  # llm-d with the Fig. 16 noise, same points and seeds
            frame = pd.concat([frame, deployed.assign(**{POL: "llmd_deployed"})], ignore_index=True)
        section(choices_tables(frame))
    frame = _load(root, "choices_bailian")
    if frame is not None:
        section(bailian_table(frame))
    frame = _load(root, "choices_hotspot")
    if frame is not None:
        section(hotspot_table(root, frame))
    frame = _load(root, "dynamo_weight")
    if frame is not None:
        for trace, sub in frame.groupby(GEN):
            section(simple_vs(sub, f"Dynamo overlap_score_weight on {trace} (vs weight 1.0)",
                              "router.params.overlap_score_weight",
                              {"router.params.overlap_score_weight": 1.0}))
    frame = _load(root, "llmd_noise")
    if frame is not None:
        def arm(r: pd.Series) -> str:
            noise = r.get("router.params.noise_rel")
            if pd.notna(noise):
                name = policy_words(r[POL], {"router.params.noise_rel": float(noise)})[0]
                return name if name != r[POL] else f"{name} noise_rel={noise}"
            text = r[POL]
            if pd.notna(r.get("router.params.bs_plus_one")):
                text += f" bs_plus_one={bool(r['router.params.bs_plus_one'])}"
            return text

        frame = frame.assign(arm=frame.apply(arm, axis=1))
        section(simple_vs(frame, "Kimi conversation trace at 0.5: every arm vs vLLM (llm-d by "
                          "prediction noise)", "arm", {"arm": "vllm"}))
    frame = _load(root, "fig15_deployed")
    if frame is not None:
        frame = frame.assign(arm=frame["router.params.estimator_profile"].fillna("tuned").astype(str)
                             + " noise " + frame["router.params.noise_rel"].astype(str))
        for trace, sub in frame.groupby(GEN):
            section(simple_vs(sub, f"Fig. 15 as deployed on {trace} (vs tuned, exact)", "arm",
                              {"arm": "tuned noise 0.0"}))
    frame = _load(root, "capacity_reading")
    if frame is not None:
        for cap, sub in frame.groupby("capacity.policy"):
            t = paired(sub, "ttft_s_mean", {POL: "lmetric"}, {POL: "vllm"})
            p = paired(sub, "tpot_s_mean", {POL: "lmetric"}, {POL: "vllm"})
            rate = sub["offered_rate_per_s"].mean()
            lines.append(f"- load 0.5 of the capacity under {cap}: offered {rate:.1f} req/s; "
                         f"LMetric vs vLLM mean TTFT {t}, mean TPOT {p}")
    print("\n".join(lines))


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/paper-reduced"))
