"""inference-perf's stage barrier, replayed: a stage starts only when the previous one is over.

inference-perf's load generator (kubernetes-sigs/inference-perf `loadgen/load_generator.py`,
the stage loop of `LoadGenerator.run`) sends a stage's `int(rate x duration)` requests on
its timer, then waits until every request of the stage has finished (successfully or not),
sleeps the stage interval (`load.interval`, 1 s by default) and starts the next stage, whose
timer begins then. Stages never overlap, and a slow stage delays every later one.

The generator (`lmsim.workload.ladder`) writes each request's `stage` and its nominal
arrival (the stages back to back); `StageBarrier` keeps a stage's rows out of the arrival
stream until its turn and releases each at (the stage's real start + its offset within the
stage). The simulation asks it at the start and whenever a staged request is done
(finished, or rejected: a failed request also counts as complete for inference-perf), at the
time the client sees it done (the front end's streaming delay included).

Per-stage metrics are inference-perf's (`stage_summary`): over the requests sent in the
stage, output tok/s = total output tokens / (last end - first start), and the latency
statistics of those requests.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd

from lmsim.workload.ladder import META_BARRIER, META_INTERVAL, META_STARTS, stage_meta  # noqa: F401  (re-exported)
from lmsim.workload.trace import Trace


class StageBarrier:
    """Which staged rows may arrive, and when (see the module docstring).

    `start()` gives the first stage's (time, row) pairs; `on_done(row, at)` counts a
    finished row and, when it was its stage's last, gives the next stage's pairs, starting
    `interval_s` after `at`. Stages left empty (a `workload.limit` cut) are skipped."""

    def __init__(self, stage: np.ndarray, arrival_s: np.ndarray, starts: list[float], interval_s: float) -> None:
        self.interval_s = interval_s
        rows = np.flatnonzero(stage >= 0)
        order = sorted(set(stage[rows].tolist()))
        self._stages = order  # stage numbers that have rows, ascending
        self._rows: dict[int, np.ndarray] = {k: rows[stage[rows] == k] for k in order}
        nominal = np.asarray(starts, dtype=float)
        self._offset = np.zeros(len(stage))
        self._offset[rows] = arrival_s[rows] - nominal[stage[rows]]
        self._stage_of = stage
        self._left = {k: len(self._rows[k]) for k in order}
        self._current = -1  # index into self._stages of the stage running now
        self.started_at: dict[int, float] = {}

    @property
    def gated_rows(self) -> np.ndarray:
        return np.flatnonzero(self._stage_of >= 0)

    @property
    def pending(self) -> bool:
        """Some stage has not been released yet."""
        return self._current < len(self._stages) - 1

    @classmethod
    def from_trace(cls, trace: Trace) -> StageBarrier | None:
        """The barrier of a staged trace, or None (no stages, or `barrier: false`: the
        stages then keep their nominal, overlapping-free open-loop times)."""
        if trace.stage is None or trace.meta.get(META_BARRIER, "1") != "1" or not (trace.stage >= 0).any():
            return None
        # a closed-loop row arrives after its predecessor, never by the barrier (which then
        # neither releases nor waits for it)
        stage = np.where(trace.column("after_id") >= 0, -1, trace.stage)
        if META_STARTS in trace.meta:
            starts = json.loads(trace.meta[META_STARTS])
        else:  # a staged trace from elsewhere: a stage starts at its first arrival
            starts = [0.0] * (int(stage.max()) + 1)
            for k in range(len(starts)):
                sel = trace.arrival_s[stage == k]
                starts[k] = float(sel.min()) if len(sel) else 0.0
        interval = float(trace.meta.get(META_INTERVAL, "1.0"))
        return cls(stage, trace.arrival_s, starts, interval)

    def _release(self, at: float) -> list[tuple[float, int]]:
        self._current += 1
        k = self._stages[self._current]
        self.started_at[k] = at
        rows = self._rows[k]
        return list(zip((at + self._offset[rows]).tolist(), rows.tolist()))

    def start(self) -> list[tuple[float, int]]:
        return self._release(0.0) if self._stages else []

    def on_done(self, row: int, at: float) -> list[tuple[float, int]]:
        k = int(self._stage_of[row])
        if k < 0:
            return []
        self._left[k] -= 1
        if self._left[k] or not self.pending or self._stages[self._current] != k:
            return []
        return self._release(at + self.interval_s)


STAGE_COLUMNS = (
    "stage", "num_requests", "num_finished", "start_s", "end_s", "duration_s", "request_throughput_per_s",
    "output_token_throughput_per_s", "ttft_s_mean", "ttft_s_p50", "ttft_s_p90", "ttft_s_p99",
    "tpot_s_mean", "tpot_s_p90", "itl_s_mean", "itl_s_mean_sse_lines", "e2e_s_mean", "e2e_s_p90",
)


def stage_summary(requests: pd.DataFrame) -> pd.DataFrame:
    """One row per stage, over the stage's finished requests, as inference-perf reports a
    stage: output tok/s = their output tokens / (last end - first start); `itl_s_mean` is
    the mean of every gap between their tokens, which is exactly (sum of e2e - ttft) / (sum
    of output tokens - 1) (a pooled mean needs no per-gap record); latency statistics
    over the stage's requests. Empty when the requests have no `stage` column.

    `itl_s_mean_sse_lines` is the ITL mean inference-perf prints for vLLM's SSE stream: it
    times the gaps between streamed lines, and vLLM writes a data line and an empty line per
    token, so a request of n tokens has 2n - 1 gaps of which n - 1 carry the decode time
    and n are about 0: sum of (e2e - ttft) / sum of (2n - 1), about half `itl_s_mean`
    (cluster_benchmarks README, "Metrics")."""
    if "stage" not in requests:
        return pd.DataFrame(columns=list(STAGE_COLUMNS))
    stage = requests["stage"].to_numpy(dtype=np.int64, na_value=-1)
    done = (requests["status"] == "finished").to_numpy()
    rows = []
    for k in sorted(set(stage[stage >= 0].tolist())):
        sel = stage == k
        fin = requests[sel & done]
        out: dict[str, Any] = {"stage": k, "num_requests": int(sel.sum()), "num_finished": len(fin)}
        if len(fin):
            start = float(fin["arrived_at"].min())
            end = float(fin["finished_at"].max())
            span = end - start
            tokens = float(fin["output_tokens"].sum())
            decode = (fin["e2e_s"] - fin["ttft_s"]).to_numpy(dtype=float)
            gaps = float((fin["output_tokens"] - 1).sum())
            lines = float((2 * fin["output_tokens"] - 1).sum())
            out.update({
                "start_s": start, "end_s": end, "duration_s": span,
                "request_throughput_per_s": len(fin) / span if span > 0 else None,
                "output_token_throughput_per_s": tokens / span if span > 0 else None,
                "itl_s_mean": float(decode.sum() / gaps) if gaps else None,
                "itl_s_mean_sse_lines": float(decode.sum() / lines),
            })  # fmt: skip
            for metric, stats in (("ttft_s", (50, 90, 99)), ("tpot_s", (90,)), ("e2e_s", (90,))):
                values = fin[metric].to_numpy(dtype=float)
                values = values[~np.isnan(values)]
                out[f"{metric}_mean"] = float(values.mean()) if len(values) else None
                for q in stats:
                    out[f"{metric}_p{q}"] = float(np.percentile(values, q)) if len(values) else None
        rows.append(out)
    return pd.DataFrame(rows, columns=list(STAGE_COLUMNS))


def across_stages(table: pd.DataFrame) -> dict[str, Any]:
    """inference-perf's "summary across QPS": the plain mean of the stages' values (for the
    run's summary.json; absent for a run without stages)."""
    if not len(table):
        return {}
    out: dict[str, Any] = {"num_stages": len(table)}
    for name in ("output_token_throughput_per_s", "ttft_s_mean", "ttft_s_p90", "itl_s_mean", "tpot_s_mean"):
        values = pd.to_numeric(table[name], errors="coerce").dropna()
        out[f"stages_mean_{name}"] = float(values.mean()) if len(values) else None
    return out


def format_stage_table(table: pd.DataFrame) -> str:
    """The per-stage table as `lmsim run` prints it (times in ms, as inference-perf's report)."""
    lines = ["stage  requests  finished  span s  out tok/s  TTFT mean  p90 ms  ITL mean ms"]
    for row in table.itertuples(index=False):
        def ms(value: Any) -> str:
            return "-" if value is None or pd.isna(value) else f"{1000 * value:.1f}"

        span = "-" if pd.isna(row.duration_s) else f"{row.duration_s:.1f}"
        tps = "-" if pd.isna(row.output_token_throughput_per_s) else f"{row.output_token_throughput_per_s:.1f}"
        lines.append(f"{row.stage:>5}  {row.num_requests:>8}  {row.num_finished:>8}  {span:>6}  {tps:>9}  "
                     f"{ms(row.ttft_s_mean):>9}  {ms(row.ttft_s_p90):>6}  {ms(row.itl_s_mean):>11}")
    return "\n".join(lines)
