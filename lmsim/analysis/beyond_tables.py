"""The tables of experiments/beyond/RESULTS.md, from the saved sweeps (run.sh writes them):

    python -m lmsim.analysis.beyond_tables runs/beyond > experiments/beyond/RESULTS.md
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

TRACES = ("chatbot", "agent", "toolagent", "coder")


def load(root: Path, name: str) -> pd.DataFrame:
    frame = pd.read_parquet(root / name / "sweep.parquet")
    return frame.rename(columns={"workload.generator.name": "trace"})


def router_label(row: pd.Series) -> str:
    policy = row.get("router.policy")
    side = row.get("router.params.prefill_policy")
    return f"pd (prefill {side})" if policy == "pd" and isinstance(side, str) else str(policy)


def cells(row: pd.Series) -> str:
    return (f"{1000 * row.ttft_s_mean:,.0f} | {1000 * row.ttft_s_p90:,.0f} | {1000 * row.tpot_s_mean:.1f} | "
            f"{row.slo_attainment:.3f} | {row.prefix_hit_ratio_first_admission:.3f}")


HEAD = "| mean TTFT ms | p90 TTFT ms | mean TPOT ms | SLO attained | hit (first adm.) |"
RULE = "|---:|---:|---:|---:|---:|"


def split_table(colocated: pd.DataFrame, split: pd.DataFrame) -> list[str]:
    out = ["## Prefill:decode split at 16 GPUs (pd, vllm on both sides) against colocated vllm", "",
           f"| trace | cluster {HEAD}", f"|---|---{RULE}"]
    for trace in TRACES:
        base = colocated[(colocated.trace == trace) & (colocated["router.policy"] == "vllm")]
        for _, row in base.iterrows():
            out.append(f"| {trace} | colocated 16 | {cells(row)} |")
        rows = split[split.trace == trace].sort_values("cluster.pools.0.num_instances")
        best = rows.ttft_s_mean.idxmin()
        for i, row in rows.iterrows():
            p = int(row["cluster.pools.0.num_instances"])
            mark = " (best TTFT)" if i == best else ""
            out.append(f"| {trace} | {p}P:{16 - p}D{mark} | {cells(row)} |")
    return out


def ranking_table(colocated: pd.DataFrame, disagg: pd.DataFrame) -> list[str]:
    out = ["## Routers, colocated and disaggregated (ranked by mean TTFT within each)", "",
           f"| trace | cluster | router | rank {HEAD}", f"|---|---|---|---:{RULE}"]
    verdicts = []
    for trace in TRACES:
        groups = (("colocated 16", colocated[colocated.trace == trace]), ("disaggregated", disagg[disagg.trace == trace]))
        order = {}
        for name, frame in groups:
            frame = frame.sort_values("ttft_s_mean")
            shape = ""
            if name == "disaggregated" and len(frame):
                p = int(frame["cluster.pools.0.num_instances"].iloc[0])
                shape = f" {p}P:{16 - p}D"
            for rank, (_, row) in enumerate(frame.iterrows(), start=1):
                out.append(f"| {trace} | {name}{shape} | {router_label(row)} | {rank} | {cells(row)} |")
            order[name] = [router_label(r).removeprefix("pd (prefill ").rstrip(")") for _, r in frame.iterrows()]
        study = [p for p in order["colocated 16"]]
        prefill = [p for p in order["disaggregated"] if p in study]
        verdicts.append(f"- {trace}: colocated {' < '.join(study)}; on the prefill side of pd {' < '.join(prefill)}"
                        f" ({'same order' if study == prefill else 'order changes'})")
    return [*out, "", "Mean-TTFT order (best first):", "", *verdicts]


def busiest_prefill_queue(root: Path, name: str, row: pd.Series) -> float:
    """Mean number of waiting requests on the prefill instance that waits most (the prefill pool
    is pools.0, so its instances are ids 0..P-1), from the run's sampled instance states."""
    states = pd.read_parquet(root / name / row.run / "instances.parquet")
    prefill = states[states.instance_id < int(row["cluster.pools.0.num_instances"])]
    return float(prefill.groupby("instance_id").num_waiting.mean().max())


def decode_table(root: Path, colocated: pd.DataFrame, split: pd.DataFrame, disagg: pd.DataFrame) -> list[str]:
    """The decode side and the KV transfer: the TPOT tail, preemptions, pool busy fractions,
    the transfer's mean time and size, llm-d's local-prefill bypass and the deepest prefill queue."""
    out = ["## Decode side and KV transfer", "",
           "| trace | cluster | router | mean TPOT ms | p99 TPOT ms | preemptions | busy prefill / decode "
           "| KV transfer ms | KV transfer MB | prefilled on decode | waiting, busiest prefill instance |",
           "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def line(trace: str, cluster: str, row: pd.Series, name: str | None, router: str) -> str:
        tpot = f"{1000 * row.tpot_s_mean:.1f} | {1000 * row.tpot_s_p99:.1f} | {int(row.num_preemptions)}"
        if name is None:
            return f"| {trace} | {cluster} | {router} | {tpot} | - | - | - | - | - |"
        return (f"| {trace} | {cluster} | {router} | {tpot} | "
                f"{row.busy_fraction_prefill:.2f} / {row.busy_fraction_decode:.2f} | "
                f"{1000 * row.kv_transfer_s_mean:.1f} | {row.kv_transfer_bytes_mean / 1e6:,.0f} | "
                f"{int(row.num_prefilled_on_decode)} | {busiest_prefill_queue(root, name, row):.1f} |")

    for trace in TRACES:
        for _, row in colocated[colocated.trace == trace].sort_values("ttft_s_mean").iterrows():
            out.append(line(trace, "colocated 16", row, None, router_label(row)))
        for _, row in split[split.trace == trace].sort_values("cluster.pools.0.num_instances").iterrows():
            p = int(row["cluster.pools.0.num_instances"])
            out.append(line(trace, f"{p}P:{16 - p}D", row, "split", "pd (prefill vllm)"))
        routers = disagg[disagg.trace == trace].sort_values("ttft_s_mean")
        for _, row in routers[routers.apply(router_label, axis=1) != "pd (prefill vllm)"].iterrows():  # a split row
            p = int(row["cluster.pools.0.num_instances"])
            out.append(line(trace, f"{p}P:{16 - p}D", row, "routers_disaggregated", router_label(row)))
    return out


def main(argv: list[str]) -> int:
    root = Path(argv[1] if len(argv) > 1 else "runs/beyond")
    colocated = load(root, "routers_colocated")
    split = load(root, "split")
    disagg = load(root, "routers_disaggregated")
    lines = ["# experiments/beyond: results", "",
             "Written by `experiments/beyond/run.sh` (`lmsim.analysis.beyond_tables`) from the saved sweeps; see README.md there.", "",
             *split_table(colocated, split), "", *ranking_table(colocated, disagg), "",
             *decode_table(root, colocated, split, disagg), ""]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
