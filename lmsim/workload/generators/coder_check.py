"""The held-out check of the `coder` generator: fit its calibration on one random half of
the real sessions, generate, and compare with the other half, which the fit never saw.

Each statistic must lie within the spread two disjoint random halves of the real sessions
show (`compare.split_tolerance` over all of them), at every seed checked.

    python -m lmsim.workload.generators.coder_check TRACE [--seeds 0,1] [--sessions 800]
        [--split-seed 0]

TRACE is the WEKA Claude Code file (`claude_code_traces.jsonl.gz`) or its canonical
parquet conversion. Prints one comparison table per seed. Exits 0 when every statistic is
inside at every seed, 1 otherwise, 2 on bad arguments. The generated traces use 64-token
blocks (the real trace's) and no served-model window, as the real sessions had none.
About 20 s per seed plus loading on one core. `tests/test_coder.py` runs it (marked slow).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import numpy as np

from lmsim.workload.compare import (
    Row,
    compare,
    format_comparison,
    session_samples,
    split_tolerance,
    subset,
    verdicts,
)
from lmsim.workload.generators import generate
from lmsim.workload.generators.coder_fit import fit_coder, save_calibration
from lmsim.workload.trace import Trace


def fit_half(num_sessions: int, split_seed: int = 0) -> np.ndarray:
    """The fitted half: a random half of the sessions (indexed like np.unique(session_id))."""
    half = np.zeros(num_sessions, dtype=bool)
    half[np.random.default_rng(split_seed).permutation(num_sessions)[: num_sessions // 2]] = True
    return half


def holdout_check(
    real: Trace, *, seeds: tuple[int, ...] = (0, 1), num_sessions: int = 800, split_seed: int = 0,
) -> dict[int, list[Row]]:
    """Per seed, the comparison of the held-out half (A) with the generator fitted on the
    other half (B), with the tolerance of all real sessions' split halves."""
    samples = session_samples(real)
    half = fit_half(samples.num_sessions, split_seed)
    tolerance = split_tolerance(samples)
    held_out = subset(samples, ~half)
    fd, name = tempfile.mkstemp(suffix=".json", prefix="coder_half_")
    os.close(fd)
    try:
        save_calibration(fit_coder(real, half), name)
        params = {"num_sessions": num_sessions, "block_size": real.block_size,
                  "max_context_tokens": None, "calibration": name}
        return {seed: compare(held_out, session_samples(generate("coder", params, seed=seed)), tolerance)
                for seed in seeds}
    finally:
        Path(name).unlink()


def main(argv: list[str] | None = None) -> int:
    import argparse

    from lmsim.errors import LmsimError
    from lmsim.workload.formats import load_trace

    parser = argparse.ArgumentParser(prog="python -m lmsim.workload.generators.coder_check")
    parser.add_argument("trace")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--sessions", type=int, default=800)
    parser.add_argument("--split-seed", type=int, default=0, help="which random half is fitted")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        seeds = tuple(int(x) for x in args.seeds.split(","))
    except ValueError:
        print(f"--seeds: expected comma-separated integers, got {args.seeds!r}", file=sys.stderr)
        return 2
    try:
        real = load_trace(args.trace)
    except (LmsimError, OSError) as exc:
        print(f"{args.trace}: {exc}", file=sys.stderr)
        return 2
    results = holdout_check(real, seeds=seeds, num_sessions=args.sessions, split_seed=args.split_seed)
    ok = True
    for seed, rows in results.items():
        print(format_comparison(rows, "real: held-out half", f"coder fitted on the other half, seed {seed}"))
        print()
        ok &= all(verdicts(rows).values())
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
