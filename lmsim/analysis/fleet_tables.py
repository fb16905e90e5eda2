"""The tables of experiments/beyond/fleet/RESULTS.md from the saved runs (issue 36): what a
fleet that changes over time costs and what its users see.

    python -m lmsim.analysis.fleet_tables runs/beyond/fleet > experiments/beyond/fleet/RESULTS.md

Every number comes from a run directory through `lmsim.fleet_cost` (GPU-hours from
fleet_events.parquet, SLO attainment per window) and the requests' records.

Recovery after a crash (the crash table) compares each router's crashed run with the same
router's run without the crash, window by window (`cost.window_s`): the crash run has
recovered at the end of the last window, from the crash on, whose P99 TTFT exceeds the
baseline's in the same window by more than `RECOVERY_SLACK` (x1.5) plus `RECOVERY_FLOOR_S`
(50 ms, so two sub-100 ms windows do not count as a difference); recovery time is that
end minus the crash time (0 when no window after the crash is worse).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from lmsim.fleet_cost import fleet_cost

RECOVERY_SLACK = 1.5
RECOVERY_FLOOR_S = 0.05


def _config(run: Path) -> dict[str, Any]:
    return yaml.safe_load((run / "config.yaml").read_text()) or {}


def _requests(run: Path) -> pd.DataFrame:
    import pyarrow.parquet as pq

    return pq.read_table(run / "requests.parquet").to_pandas()


def _pct(values: pd.Series, q: float) -> float:
    v = values.to_numpy(dtype=float, na_value=np.nan)
    v = v[~np.isnan(v)]
    return float(np.percentile(v, q)) if len(v) else float("nan")


def _ms(x: float) -> str:
    return "-" if x != x else f"{1000 * x:,.0f}"


def _runs(folder: Path) -> list[Path]:
    """Run directories under `folder` (a single run or a sweep's points), in name order."""
    if (folder / "summary.json").exists():
        return [folder]
    return sorted(p.parent for p in folder.rglob("summary.json"))


def _fleet_row(run: Path) -> dict[str, Any]:
    cost = fleet_cost(run)
    req = _requests(run)
    summary = json.loads((run / "summary.json").read_text())
    windows = cost.windows
    fleet = summary.get("fleet") or {}
    return {
        "run": run.name,
        "gpu_hours": cost.totals["gpu_hours"],
        "cost_usd": cost.totals["cost_usd"],
        "usd_per_m": cost.totals["usd_per_million_output_tokens"],
        "ttft_p99": _pct(req["ttft_s"], 99),
        "tpot_p99": _pct(req["tpot_s"], 99),
        "slo": cost.totals["slo_attainment"],
        "worst_window": float(np.nanmin(windows["slo_attainment"])) if len(windows) else float("nan"),
        "scale_events": fleet.get("num_scale_events", 0),
    }


def day_table(runs: list[Path]) -> str:
    out = ["| run | GPU-hours | cost (USD) | USD per M output tokens | P99 TTFT ms | P99 TPOT ms "
           "| SLO attainment | worst window | scale events |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for run in runs:
        r = _fleet_row(run)
        out.append(
            f"| {r['run']} | {r['gpu_hours']:.2f} | {r['cost_usd']:.2f} | {r['usd_per_m']:.3f} "
            f"| {_ms(r['ttft_p99'])} | {_ms(r['tpot_p99'])} | {r['slo']:.3f} | {r['worst_window']:.3f} "
            f"| {r['scale_events']} |"
        )
    return "\n".join(out)


def recovery_s(crashed: pd.DataFrame, baseline: pd.DataFrame, crash_at: float, window_s: float) -> float:
    """Seconds from `crash_at` to the end of the last window at or after it whose P99 TTFT
    exceeds the baseline's in the same window by more than the slack (module docstring)."""
    merged = crashed.merge(baseline, on="start_s", suffixes=("", "_base"))
    after = merged[merged["start_s"] + window_s > crash_at]
    worse = after[after["ttft_p99_s"] > RECOVERY_SLACK * after["ttft_p99_s_base"] + RECOVERY_FLOOR_S]
    if worse.empty:
        return 0.0
    return float(worse["start_s"].max() + window_s - crash_at)


def crash_table(folder: Path) -> str:
    by_policy: dict[str, dict[str, Path]] = {}
    for run in _runs(folder):
        cfg = _config(run)
        crashes = (cfg.get("faults") or {}).get("crashes") or []
        by_policy.setdefault(cfg["router"]["policy"], {})["crash" if crashes else "base"] = run
    rows = []
    for policy, pair in by_policy.items():
        if set(pair) != {"crash", "base"}:
            continue
        crashed, base = fleet_cost(pair["crash"]), fleet_cost(pair["base"])
        cfg = _config(pair["crash"])
        crash_at = float(cfg["faults"]["crashes"][0]["time_s"])
        window_s = float(crashed.totals["window_s"])
        req, base_req = _requests(pair["crash"]), _requests(pair["base"])
        during = (req["arrived_at"] >= crash_at) & (req["arrived_at"] < crash_at + 120)
        base_during = (base_req["arrived_at"] >= crash_at) & (base_req["arrived_at"] < crash_at + 120)
        status = req["status"].astype(str)
        rows.append({
            "policy": policy,
            "base_p99": _pct(base_req["ttft_s"], 99),
            "p99": _pct(req["ttft_s"], 99),
            "base_during": _pct(base_req.loc[base_during, "ttft_s"], 99),
            "during": _pct(req.loc[during, "ttft_s"], 99),
            "retried": int((req["retries"] > 0).sum()),
            "failed": int((status == "failed").sum()),
            "recovery": recovery_s(crashed.windows, base.windows, crash_at, window_s),
            "slo": crashed.totals["slo_attainment"],
            "base_slo": base.totals["slo_attainment"],
        })
    rows.sort(key=lambda r: (r["recovery"], r["during"]))
    out = ["| router | recovery s | requests retried | failed | P99 TTFT ms, 2 min after the crash (no crash) "
           "| P99 TTFT ms, whole run (no crash) | SLO attainment (no crash) |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append(
            f"| {r['policy']} | {r['recovery']:.0f} | {r['retried']} | {r['failed']} "
            f"| {_ms(r['during'])} ({_ms(r['base_during'])}) | {_ms(r['p99'])} ({_ms(r['base_p99'])}) "
            f"| {r['slo']:.3f} ({r['base_slo']:.3f}) |"
        )
    return "\n".join(out)


def main(argv: list[str]) -> int:
    root = Path(argv[0] if argv else "runs/beyond/fleet")
    print("# The fleet over time: results\n")
    print("Generated by `python -m lmsim.analysis.fleet_tables runs/beyond/fleet` from the saved runs "
          "of experiments/beyond/fleet (run.sh). Findings: README.md beside this file.\n")
    day = [root / name for name in ("day_fixed", "day_hpa", "day_planner") if (root / name / "summary.json").exists()]
    if day:
        print("## (a) A day compressed to an hour: fixed fleet, HPA, SLA planner\n")
        print(day_table(day) + "\n")
    if (root / "crash").exists():
        print("## (b) One crash at peak, by router\n")
        print(crash_table(root / "crash") + "\n")
    if (root / "startup").exists():
        print("## (c) Start-up time and what the planner saves\n")
        runs = _runs(root / "startup")
        labels = []
        for run in runs:
            s = (_config(run).get("fleet") or {}).get("startup_s")
            labels.append((s, run))
        labels.sort(key=lambda x: (x[0] is None, x[0]))
        table = day_table([run for _, run in labels]).split("\n")
        for k, (s, _run) in enumerate(labels):
            table[k + 2] = table[k + 2].replace(f"| {_run.name} |", f"| start-up {s:g} s |", 1)
        print("\n".join(table) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
