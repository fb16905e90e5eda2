"""The SLO a planned fleet must meet, judged on one run, and the early stop that ends a run once
its verdict is certain.

Definition. A bound `ttft_p99_s: 2.0` holds when the 99th percentile (numpy's linear
interpolation) of TTFT over *every request of the workload* is at most 2 s, a request that did
not finish (rejected, cut at the drain limit, never arrived) counting as an infinite TTFT: a
fleet that loses requests does not meet an SLO by dropping them from the statistics. TPOT and
E2E alike. ITL is pooled over output tokens (vLLM's benchmark_serving), so it is taken from the
run's summary over finished requests; `attainment: f` holds when at least `f` of the requests
meet both `output.slo` targets (the summary's `slo_attainment`, unfinished ones missing).

Early stop (exact, never a guess). Sorting the N values, the percentile at q interpolates between
ranks lo = floor((N-1)q) and hi = lo + 1 (0-based). While the run goes on, each request is a
certain miss (its value is known to exceed the bound: finished above it, rejected, or for TTFT
and E2E still without a first token / unfinished though older than the bound), a certain hit
(finished within it), or undecided. With k certain misses, rank lo already holds a value above
the bound once k >= N - lo: the bound fails whatever happens next, and the run stops. When the
certain misses plus the undecided are at most N - 1 - hi, rank hi is within the bound whatever
happens: it is met. A run stops early as met only when every bound is certainly met (never with
an ITL bound, which has no per-request rule). A diverging queue fails fast: its requests wait
longer than the bound long before they would finish.

Means (`ttft_mean_s`, `tpot_mean_s`, `e2e_mean_s`, `itl_mean_s`), the statistic Dynamo's
replay_optimize bounds. TTFT and E2E: the mean over every request, an unfinished one infinite
(so a fleet that loses a request fails a mean bound as it fails a percentile). TPOT: the mean
over the requests that have one (more than one output token), an unfinished one infinite. ITL:
the run summary's pooled mean over output tokens. Early stop: a mean bound can fail early, never
pass early. Its certain lower bound is the sum of what is already known (a finished request's
value; a request without its first token has TTFT and E2E of at least its age; any other value
at least 0; a rejected one infinite) divided by N, every request (for TPOT N is an upper bound
on the requests that have one, so the quotient stays a lower bound): once that exceeds the
bound, the bound fails whatever happens next. It can be certainly met only when every request
is done, i.e. at the end of the run, so a run with a mean bound never stops early as met. An
ITL mean, like an ITL percentile, is never decided early.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from lmsim.engine.metrics import FINISHED, REJECTED, UNFINISHED
from lmsim.plan.config import SLO_KEY

INFINITE = 1e12  # an unfinished request's value: finite so interpolation stays a number


@dataclass(frozen=True)
class Bound:
    key: str  # as written: ttft_p99_s, attainment
    metric: str  # ttft, tpot, itl, e2e, attainment
    q: float | None  # percentile (0-100); the fraction for attainment; None for a mean
    limit: float

    @property
    def is_mean(self) -> bool:
        return self.q is None

    def met(self, value: float | None) -> bool:
        if value is None or math.isnan(value):
            return False
        return value >= self.limit if self.metric == "attainment" else value <= self.limit

    def margin(self, value: float | None) -> float | None:
        """Relative headroom: positive when met (0.25 = 25% below a latency bound)."""
        if value is None or math.isnan(value):
            return None
        if self.metric == "attainment":
            return value - self.limit
        return (self.limit - value) / self.limit


def parse_bounds(slo: dict[str, float]) -> list[Bound]:
    out = []
    for key in sorted(slo):
        if key == "attainment":
            out.append(Bound(key, "attainment", float(slo[key]), float(slo[key])))
            continue
        m = SLO_KEY.match(key)
        assert m is not None  # checked by PlanSection
        q = None if m["stat"] == "mean" else float(m["stat"][1:])
        out.append(Bound(key, m["metric"], q, float(slo[key])))
    return out


def _ranks(n: int, q: float) -> tuple[int, int]:
    position = (n - 1) * q / 100.0
    lo = math.floor(position)
    return lo, min(lo + 1, n - 1)


def _per_request(metric: str, requests: Any) -> np.ndarray:
    values = requests[f"{metric}_s"].to_numpy(dtype=float, na_value=np.nan)
    done = (requests["status"] == "finished").to_numpy()
    out = np.where(done, values, INFINITE)
    if metric == "tpot":
        out = np.where(done & np.isnan(values), 0.0, out)  # one output token: no TPOT, meets any bound
    return out


def _mean(metric: str, requests: Any) -> float | None:
    values = _per_request(metric, requests)
    if metric == "tpot":  # only the requests that have a TPOT (more than one output token)
        done = (requests["status"] == "finished").to_numpy()
        values = values[~(done & np.isnan(requests["tpot_s"].to_numpy(dtype=float, na_value=np.nan)))]
    return float(values.mean()) if len(values) else None


def measure(bounds: list[Bound], results: Any) -> dict[str, float | None]:
    """Each bound's statistic on a finished run (`Results`), by the definitions above."""
    out: dict[str, float | None] = {}
    for b in bounds:
        if b.metric == "attainment":
            out[b.key] = results.summary.get("slo_attainment")
        elif b.metric == "itl":
            out[b.key] = results.summary.get("itl_s_mean" if b.is_mean else f"itl_s_p{int(b.q)}")
        elif b.is_mean:
            out[b.key] = _mean(b.metric, results.requests)
        else:
            values = _per_request(b.metric, results.requests)
            out[b.key] = float(np.percentile(values, b.q)) if len(values) else None
    return out


class EarlyStop:
    """A periodic check (`Simulation.add_periodic`) that ends the run once every bound is
    certainly met or one certainly fails (module docstring); `verdict` says which."""

    def __init__(self, sim: Any, bounds: list[Bound], slo_targets: dict[str, float]) -> None:
        self.sim = sim
        self.bounds = bounds
        self.targets = slo_targets
        self.verdict: str | None = None  # "met" or "failed: <key>"
        self.at_s: float | None = None
        frontend = getattr(sim, "frontend", None)
        self._stream_s = frontend.stream_s if frontend is not None else 0.0
        self._can_pass = all(b.metric != "itl" and not b.is_mean for b in bounds)

    def _waiting_ages(self, now: float) -> tuple[np.ndarray, np.ndarray]:
        """Ids and ages of requests that certainly have no first token yet: waiting on an
        instance that prefills, never scheduled."""
        ids = [r.request_id for inst in self.sim.instances if inst.pool.role != "decode"
               for r in inst.scheduler.waiting if r.first_scheduled_at is None]  # fmt: skip
        ids_arr = np.asarray(ids, dtype=np.int64)
        return ids_arr, now - self.sim.recorder.arrived_at[ids_arr]

    def __call__(self, now: float) -> None:
        rec = self.sim.recorder
        n = len(rec.status)
        done = rec.status == FINISHED
        lost = rec.status == REJECTED
        live = rec.status == UNFINISHED
        first = rec.first_token_at + self._stream_s
        finish = rec.finished_at + self._stream_s
        out = rec.output_tokens
        waiting_ids, waiting_age = self._waiting_ages(now)
        age = now - rec.arrived_at
        with np.errstate(invalid="ignore", divide="ignore"):
            value = {
                "ttft": first - rec.arrived_at,
                "e2e": finish - rec.arrived_at,
                "tpot": np.where(out > 1, (finish - first) / (out - 1), 0.0),
            }
        all_met = True
        for b in self.bounds:
            if b.metric == "itl":
                continue
            if b.is_mean:
                if lost.any() or self._mean_floor(b.metric, value[b.metric], done, age) > b.limit:
                    return self._stop(now, f"failed: {b.key}")
                continue
            if b.metric == "attainment":
                good = done & (value["ttft"] <= self.targets["ttft_s"]) & (value["tpot"] <= self.targets["tpot_s"])
                miss = (done & ~good) | lost
                miss[waiting_ids[waiting_age > self.targets["ttft_s"]]] = True
                allowed = n - math.ceil(b.q * n - 1e-9)  # misses the fraction tolerates
                certain, possible = int(miss.sum()), int((~good).sum())
                if certain > allowed:
                    return self._stop(now, f"failed: {b.key}")
                all_met &= possible <= allowed
                continue
            lo, hi = _ranks(n, b.q)
            with np.errstate(invalid="ignore"):
                miss = (done & (value[b.metric] > b.limit)) | lost
                hit = done & (value[b.metric] <= b.limit)
            if b.metric == "ttft":
                miss[waiting_ids[waiting_age > b.limit]] = True
            elif b.metric == "e2e":
                miss |= live & (age > b.limit)
            certain, possible = int(miss.sum()), n - int(hit.sum())
            if certain >= n - lo:
                return self._stop(now, f"failed: {b.key}")
            all_met &= possible <= n - 1 - hi
        if all_met and self._can_pass:
            return self._stop(now, "met")
        return None

    @staticmethod
    def _mean_floor(metric: str, value: np.ndarray, done: np.ndarray, age: np.ndarray) -> float:
        """A certain lower bound on the mean of `metric` (module docstring): known values, and
        for a request still without its first token (TTFT) or unfinished (E2E) its age."""
        known = np.where(done, value, 0.0)
        if metric == "ttft":  # a first token already out gives the request's TTFT for good
            known = np.where(np.isnan(value), np.maximum(age, 0.0), value)
        elif metric == "e2e":
            known = np.where(done, value, np.maximum(age, 0.0))
        return float(np.nan_to_num(known, nan=0.0).sum()) / len(value)

    def _stop(self, now: float, verdict: str) -> None:
        from lmsim.engine.clock import stop_run

        self.verdict = verdict
        self.at_s = now
        self.sim.last_activity_s = now
        stop_run()
