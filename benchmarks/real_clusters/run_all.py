"""Re-run every real-cluster case and collate the issue's bars (issue 33 item 5).

    python benchmarks/real_clusters/run_all.py [--cases A2,A14,...]

Writes results/<case>.md and .csv per case and results/summary.md (the bars of every case),
which docs/explanation/real-clusters.md quotes.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness

CASES = {
    "A2": "a2_llmd_37_capacity", "A3": "a3_llmd_64p_cache_load", "A4": "a4_llmd_frequent_evictions",
    "A12": "a12_sglang_cache_aware", "A14": "a14_llm_router", "B2": "b2_openinfer_rtx5090",
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args(argv)
    if harness.shared_dir() is None:
        print("../shared/docs/cluster_benchmarks/points.csv not found (set LMSIM_SHARED)", file=sys.stderr)
        return 2
    timings = []
    for case in args.cases.split(","):
        start = time.perf_counter()
        importlib.import_module(CASES[case]).main([])  # writes results/<case>.*
        timings.append((case, time.perf_counter() - start))
    # every case's latest bars (results/<case>.bars.csv), so a re-run of some cases keeps the rest
    table = pd.concat([pd.read_csv(harness.RESULTS_DIR / f"{case}.bars.csv") for case in CASES
                       if (harness.RESULTS_DIR / f"{case}.bars.csv").exists()], ignore_index=True)
    text = "\n".join([
        "# Real clusters: the bars of every case", "", harness.markdown(table), "",
        "Wall time per case run now (s): " + ", ".join(f"{c} {t:.0f}" for c, t in timings)
        + f"; total {sum(t for _, t in timings):.0f}", ""])
    print(text)
    harness.RESULTS_DIR.mkdir(exist_ok=True)
    (harness.RESULTS_DIR / "summary.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
