"""A2: llm-d kv-cache-manager "37-capacity" (llm-d/llm-d-kv-cache-manager@edb766fd
benchmarking/37-capacity/README.md; points.csv A2) replayed in lmsim.

    python benchmarks/real_clusters/a2_llmd_37_capacity.py [--stages N] [--routers a,b]

The cluster: 4 pods of Llama-3.1-70B-Instruct, TP4 on H100 (the GPU is named in an earlier run
of the same benchmark in that folder; points.csv marks it UNVERIFIED), 461,376 KV tokens per
pod as vLLM reported (the profile's own pool at 0.9 utilization is 469,584, 1.8% more);
vLLM's OpenAI-server defaults on an H100 (max_num_batched_tokens 8,192, max_num_seqs 1,024,
lmsim's defaults), prefix caching on. The workload, as inference-perf drove it
(`harness.llmd_ladder`): shared_prefix 83 groups x 3 prompts, system 8,000 + question 1,000
random-token text, 1,000 output tokens (ignore_eos), constant stages 10@25 s (warm-up), 3@210,
4@180, 5@120, 6@120, 8@90, 10@70, 12@60, 15@50, 20@50, each after the previous one's last
request plus 1 s. Nothing is scaled down: inference-perf's per-stage metrics are over the
whole stage, so a shorter stage is a different measurement.

Routers: the report's four EPP configurations as `llmd_epp` presets (random, load,
estimate-prefix-cache_load, precise-prefix-cache_load; `lmsim/policies/llmd_epp.py` cites the
scorers' sources at the builds the report ran).

The real per-stage numbers (output tok/s, mean TTFT, ITL mean) are transcribed from the
report's tables (`REAL`); points.csv holds the 5, 10 and 20 req/s rows of two routers and
the summaries, which `check_against_points` confirms equal to these.

KV pressure and tails (issue 33 item 4; the numbers on the final tree are in
docs/explanation/real-clusters.md, A2, and results/A2-tails.md, printed by this script):

* lmsim's KV rules were checked against vLLM v1 (vllm/v1/core/sched/scheduler.py
  `Scheduler.schedule`, vllm/v1/core/kv_cache_manager.py `allocate_slots`, block_pool.py):
  admission needs only the first chunk's blocks, no watermark; a failed allocation preempts
  the newest running request with recompute and admits nothing that step; prefix blocks are
  shared by reference count. Block size 64 changes nothing measurable.
* `epp_state`: against the report's whole-run EPP-log summary lmsim's pods run emptier and
  queue less under every router (precise KV mean 0.46 vs 0.59), not fuller. Precise never
  preempts; random preempts 13-17% of requests from 5 req/s on.
* A preemption storm is a routing effect: llm-d's *default* weights (prefix 3, queue 2, KV 2)
  spread groups, hits fall to 0.70 and 8-19% of requests are preempted from 8 req/s on
  (measured with llmd_scorer, 2026-12-04), while the report's weights (2/1/1) keep every
  group on one pod (hit 0.999, no preemption).
* `stage_spans`: the real stage spans are the sending time + mean TTFT + 1,000 tokens at the
  real per-token time; lmsim's are shorter where its per-token time is (8-14% at 3-6 req/s).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness

CASE = "A2"
SOURCE = "37-capacity/README.md"
STAGES = ((10, 25), (3, 210), (4, 180), (5, 120), (6, 120), (8, 90), (10, 70), (12, 60), (15, 50), (20, 50))
ROUTERS = {name: {"policy": "llmd_epp", "params": {"preset": name}}
           for name in ("random", "load", "estimate-prefix-cache_load", "precise-prefix-cache_load")}

# The report's per-stage rows (rates 3..20): output tok/s, mean TTFT s, ITL mean s.
REAL = {
    "precise-prefix-cache_load": (
        (2590.0, 0.246, 0.013), (3345.2, 0.304, 0.015), (3916.7, 0.270, 0.016), (4640.3, 0.271, 0.017),
        (5557.1, 0.248, 0.019), (6264.0, 0.242, 0.020), (6765.9, 0.255, 0.022), (7345.1, 0.247, 0.024),
        (8003.9, 0.250, 0.031)),
    "estimate-prefix-cache_load": (
        (2573.6, 1.007, 0.017), (3326.3, 1.497, 0.020), (3691.2, 1.919, 0.024), (3724.3, 9.700, 0.027),
        (3571.6, 20.389, 0.028), (3798.6, 26.567, 0.028), (3773.5, 31.615, 0.028), (3200.9, 38.253, 0.028),
        (3017.1, 71.632, 0.029)),
    "random": (
        (2505.7, 1.102, 0.020), (2829.5, 7.257, 0.026), (2898.2, 11.988, 0.026), (2955.9, 23.742, 0.027),
        (3108.8, 40.124, 0.028), (3117.3, 46.359, 0.027), (3140.8, 49.556, 0.027), (3126.2, 58.760, 0.027),
        (3241.0, 93.345, 0.028)),
    "load": (
        (2545.4, 1.548, 0.019), (2967.6, 5.021, 0.026), (2943.6, 11.329, 0.026), (2656.5, 31.824, 0.027),
        (2506.3, 42.683, 0.027), (2620.3, 47.727, 0.027), (2897.6, 53.087, 0.027), (2549.1, 67.339, 0.027),
        (2334.5, 86.643, 0.028)),
}


# The report's EPP-log summary over the whole run (epp_log_metrics_summary.csv, every pod's
# scraped samples): waiting queue mean / p50 / p90 / max, KV usage mean / p50 / p90 / max.
REAL_EPP = {
    "precise-prefix-cache_load": (0.47, 0.0, 0.0, 32, 0.593, 0.670, 0.802, 0.926),
    "estimate-prefix-cache_load": (26.8, 7.0, 80.0, 258, 0.690, 0.758, 0.995, 1.0),
    "random": (36.6, 20.0, 99.0, 214, 0.750, 0.910, 0.995, 1.0),
    "load": (37.6, 15.0, 106.0, 360, 0.741, 0.901, 0.995, 1.0),
}


def epp_state(comparison: harness.Comparison):
    """The report's whole-run EPP-log summary beside lmsim's (`engine_state`'s "run" row)."""
    rows = []
    for router, table in comparison.engine.items():
        mine = table[table.stage == "run"].iloc[0]
        w_mean, w_p50, w_p90, w_max, kv_mean, kv_p50, kv_p90, kv_max = REAL_EPP[router]
        rows.append({"router": router, "waiting_mean": f"{w_mean:g} / {mine.waiting_mean:.2g}",
                     "waiting_p50": f"{w_p50:g} / {mine.waiting_p50:g}",
                     "waiting_p90": f"{w_p90:g} / {mine.waiting_p90:g}", "waiting_max": f"{w_max} / {mine.waiting_max}",
                     "kv_mean": f"{kv_mean:.2f} / {mine.kv_mean:.2f}", "kv_p50": f"{kv_p50:.2f} / {mine.kv_p50:.2f}",
                     "kv_p90": f"{kv_p90:.2f} / {mine.kv_p90:.2f}", "kv_max": f"{kv_max:.2f} / {mine.kv_max:.2f}"})
    return harness.pd.DataFrame(rows)


def real_table(stages=STAGES):
    labels = [f"{rate:g}" for rate, _ in stages[1:]]
    return harness.long_table(
        (label, router, metric, value)
        for router, rows in REAL.items() for label, (tput, ttft, _itl) in zip(labels, rows)
        for metric, value in (("throughput", tput), ("ttft", ttft)))


def check_against_points(real) -> None:
    """The transcribed rows equal points.csv where it has them (5, 10, 20 req/s)."""
    rows = harness.points(SOURCE)
    per_stage = rows[rows.rate_qps.astype(str).str.isdigit()]
    for r in per_stage.itertuples():
        metric = {"ttft_mean": "ttft", "output_tok_per_s": "throughput"}[r.metric]
        mine = real[(real.stage == r.rate_qps) & (real.router == r.router) & (real.metric == metric)].value
        assert len(mine) == 1 and abs(float(mine.iloc[0]) - r.value) < 1e-6, (r.router, r.rate_qps, r.metric)


def stage_spans(comparison: harness.Comparison, router: str = "precise-prefix-cache_load", output_len: int = 1000):
    """Where a stage's time goes, for the router that never saturates. inference-perf's output
    tok/s is the stage's counted tokens over its span (first send to last end), so the span is
    rate x duration x output_len x the client's count per token / tok/s on each side. The real span is also predicted from
    the report's other columns: the stage's sending time, plus the mean TTFT, plus output_len
    tokens at the per-token time (twice the ITL mean: vLLM's SSE stream yields two lines a
    token). When that prediction matches the real span, the tail is the last request's
    decode, and lmsim's shorter tail is its per-token time."""
    durations = {f"{rate:g}": duration for rate, duration in STAGES[1:]}
    engine = comparison.engine[router]
    rows = []
    for label, (tput, ttft, itl) in zip(durations, REAL[router]):
        if label not in comparison.stages:
            continue
        cells = comparison.cells[(comparison.cells.router == router) & (comparison.cells.stage == label)]
        sim_tput = float(cells[cells.metric == "throughput"].sim.iloc[0])
        tokens = float(label) * durations[label] * output_len * harness.LLAMA31_OUTPUT_COUNT
        rows.append({
            "stage": label, "real_span_s": tokens / tput, "real_send_ttft_decode_s": durations[label] + ttft + output_len * 2 * itl,
            "sim_span_s": tokens / sim_tput, "real_per_token_ms": 2000 * itl,
            "sim_per_token_ms": float(engine[engine.stage == label].per_token_ms.iloc[0]),
        })
    return harness.pd.DataFrame(rows).round(1)


def main(argv=None) -> harness.Comparison:
    stages, routers, labels = harness.ladder_selection(argv, __doc__, STAGES, ROUTERS, warmup=True)
    real = real_table(STAGES)
    check_against_points(real)
    real = real[real.stage.isin(labels) & real.router.isin(routers)]
    comparison = harness.run_llmd_case(
        CASE, routers, real, labels, "stages as the source ran them, nothing scaled down",
        model="llama-3.1-70b", gpu="h100", tp=4, kv_tokens_per_pod=461_376, num_pods=4,
        groups=83, per_group=3, system_len=8000, question_len=1000, output_len=1000, stages=stages, warmup=True)
    parts = [f"### {CASE}: the whole run's EPP-log summary, real / lmsim", "", harness.markdown(epp_state(comparison))]
    if "precise-prefix-cache_load" in routers:
        parts += ["", f"### {CASE}: stage spans (precise)", "", harness.markdown(stage_spans(comparison))]
    text = "\n".join(parts) + "\n"
    print(text)
    (harness.RESULTS_DIR / f"{CASE}-tails.md").write_text(text)
    return comparison


if __name__ == "__main__":
    main()
