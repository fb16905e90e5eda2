"""`sla_planner`: Dynamo's SLA planner (ai-dynamo 1.6.1, `optimization_target: sla`,
throughput-based scaling) sizing prefill and decode pools, or one aggregated pool, from a
load forecast and the engines' performance under the TTFT and ITL targets.

Sources (the installed wheel, dynamo/planner and dynamo/profiler, version 1.6.1):

* Forecast (plugins/builtins/local_planner.py, `_observe_load`, `_predict_load`;
  core/load/predictors.py): three predictors of one kind forecast the next interval's
  request count, mean ISL and mean OSL. Leading zeros (the idle start) are skipped
  (`BasePredictor.add_data_point`); an idle interval after live traffic carries the last
  ISL/OSL forward. Mirrored: `constant` (`ConstantPredictor`: the last value) and `kalman`
  (`KalmanPredictor`: a local linear trend filter, state [level, trend], F = [[1,1],[0,1]],
  H = [1,0], P0 = 1000 I, Q = diag(q_level, q_trend), R = r, initialised on the first point,
  the last value until `kalman_min_points` points, optional log1p space; filterpy's update
  in Joseph form, written out with numpy). Left out: `arima` (pmdarima) and `prophet`,
  which need heavy dependencies; Dynamo's default is `arima`, lmsim's is `constant`.
* Demand (core/state_machine.py, `advance_throughput_from_prediction`): demand_rps =
  predicted requests / interval duration.
* Per-engine capacity (core/perf_model/engine_query.py, `find_engine_capacity_rps` and
  `_find_prefill_capacity`, `_find_decode_capacity`, `_find_aggregated_capacity`): a search
  over batch sizes (all of 1..max if at most 128, else 128 evenly spaced) of synthetic
  forward passes priced by the engine's forward-pass model; a batch meeting the SLA beats
  one that does not, then the higher request rate wins (`_select_capacity`, throughput
  target):
  - prefill: b requests of ISL tokens at once, chunked into max_num_batched_tokens passes
    (`_prefill_chunk_time`), TTFT = their time, rps = b / TTFT, b <= min(max_num_seqs,
    max_num_batched_tokens // ISL) (1 when ISL exceeds it);
  - decode: context = ISL + OSL // 2 (`_decode_context_length`), ITL = the time of a pass of
    b decodes holding b x context KV tokens, rps = b / (OSL x ITL) (Little's law),
    b <= min(max_num_seqs, max_kv_tokens // context);
  - aggregated: b decodes plus the prefill tokens that keep up with them,
    ceil(b x ISL / OSL) per pass (`_aggregate_prefill_per_iteration`, at most
    max_num_batched_tokens - b), ITL = that mixed pass, TTFT = the chunked time of those
    tokens plus one ISL priced as mixed passes beside the b decodes, rps = b / (OSL x ITL).
  Replicas = max(ceil(demand_rps / engine_rps), min_endpoint) per role
  (core/throughput_scaling.py, `_compute_prefill_replicas`, `_compute_decode_replicas`,
  `_throughput_agg`).
* The forward-pass model: in 1.6.1 it is AISimulate's estimator (core/perf_model/
  ais_adapter.py, `PlannerEnginePerfModel`), bootstrapped from benchmark forward passes
  (replay/planner.py `_generate_ais_prefill_fpms`: one prefill of ISL tokens per point;
  `_generate_ais_decode_fpms`: batch x context grids; or monitoring/perf_metrics.py
  `_convert_profiling_data_to_fpms` from the profiler's raw_data.npz) and corrected online
  from observed forward passes. In lmsim the pool's step cost model *is* the engine's
  forward-pass time, so the planner prices each synthetic pass with it directly: the
  profile it would have measured, without the interpolation or regression error. Online
  correction is then the identity and is not modelled. `profiler_tables` evaluates the
  cost model at the points dynamo/profiler measures, for inspection and comparison:
  - prefill (profiler/utils/profile_prefill.py `_profile_prefill_helper`, saved as
    selected_prefill_interpolation/raw_data.npz): `prefill_isl` from 100 to
    max_context_length - 512 in `granularity` steps, `prefill_ttft` (ms) of one request of
    that ISL at batch 1, `prefill_thpt_per_gpu` = ISL / TTFT / GPUs (tokens/s);
  - decode (profiler/utils/profile_decode.py `_profile_decode_helper`,
    selected_decode_interpolation/raw_data.npz): for ISL from 100 to max_context_length - 500
    and OSL = 500, concurrency n from `get_num_request_range` (up to
    min(max_kv_tokens // (ISL + OSL), 2000)), `y_context_length` = ISL + OSL / 2,
    `x_kv_usage` = n x context / max_kv_tokens, `z_itl` (ms) = a pass of n decodes at that
    context, `z_thpt_per_gpu` = n / ITL / GPUs (tokens/s).
* Bounds (core/throughput_scaling.py `_cap_throughput_replicas`, config/planner_config.py
  `resolve_min_endpoint`, core/budget.py `fit_directional_budget_pair`,
  `guard_single_scaling_budget`): a change of at most `max_throughput_scaling_replicas` per
  role per decision from the ready count, then the endpoint floor, then the GPU ceiling
  `max_gpu_budget` (-1: none) fitted without reversing either role's direction. A model
  that cannot size a tick (no ISL/OSL yet) holds the ready counts, floor applied.
* Current counts are the *ready* (active) instances, as the offline replay reports them
  (planner/offline/replay_adapter.py `_build_tick_input`: `ready_num_* = active_*_count`,
  no pending start-ups), and a decision equal to them is no decision (the target stays).
* Traffic: the request count and mean ISL (and TTFT) of the pool requests enter (prefill,
  or the only pool), the mean OSL (and ITL) of the pool they finish in; Dynamo reads all
  from the frontend. Its offline replay averages the window's ISL (and OSL) over the requests
  completed in it, while its request count is of those that arrived (checked against the
  replay's per-request records on the stepped trace of benchmarks/fleet/dynamo_planner.py:
  window 0-60 s, 119 arrivals of mean ISL 2,140.48, 105 completions of mean ISL 2,155.91,
  the replay's tick input 119 / 2,155.905). `isl_from: finished` averages ISL over the
  requests that finished in the interval in the pool they finish in, as that replay does;
  `routed` (the default) over those routed in it, the requests the forecast is sizing
  for. On that trace the choice moves one decode step-up by one interval (a knife edge:
  17.98 req/s demand against 5.99 req/s per engine), see docs/explanation/dynamo-planner.md.
* Engine limits (max_num_batched_tokens, max_num_seqs, KV tokens): the params, else the
  scaler context's `engine_limits[pool]`, else lmsim's engine defaults and the profile's KV
  pool, else Dynamo's replay fallback (replay/planner.py: 16384 x 16 KV tokens).

Correction factors (`correction_factors: true`, off by default): 1.6.1 has none (observed
TTFT/ITL reach only its diagnostics recorder); the 0.x planner
(ai-dynamo/dynamo components/src/dynamo/planner/utils/planner_core.py,
`PrefillPlanner._update_correction_factor`, `DecodePlanner._update_correction_factor`,
`_compute_replica_requirements`) divided the observed mean TTFT by the profile's TTFT at the
observed ISL (p) and the observed mean ITL by the profile's ITL at the observed per-engine
concurrency num_req / decode engines x request duration / interval and context ISL + OSL/2
(d), then scaled the prefill demand by min(1, p) and sized decode for an ITL target of
itl / d. With the option on, those two corrections are applied to 1.6.1's capacity search.
The request duration is not in the observation: TTFT + ITL x (OSL - 1) stands for it.

Left out: load-based scaling (`enable_load_scaling`, FPM thresholds), the `throughput` /
`latency` / `load` optimisation targets ("easy mode"), the KV-hit-rate discount of prefill
ISL (the observation has no hit rate), speculative decoding (accept length 1), the GPU
floor `min_gpu_budget`, power budgets, the pending-start-up guard of the live planner
(`_startup_disagg_decision`; the offline replay feeds no pending counts) and the plugin
pipeline.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from lmsim.autoscalers.base import AUTOSCALERS
from lmsim.autoscalers.errors import bind_error
from lmsim.config import ClusterConfig
from lmsim.routing import check_bool, check_choice, check_number
from lmsim.scaling import Autoscaler, FleetObservation, PoolObservation, ScalerContext

MODES = ("auto", "disagg", "agg")
PREDICTORS = ("constant", "kalman")
ISL_FROM = ("finished", "routed")
MAX_CAPACITY_SEARCH_CANDIDATES = 128  # engine_query.py
DECODE_MAX_CONCURRENCY = 2000  # profiler/utils/defaults.py
# replay/planner.py `_generate_ais_decode_fpms`: the KV capacity assumed when the engine
# arguments give none.
FALLBACK_MAX_KV_TOKENS = 16384 * 16


# -- load predictors ------------------------------------------------------------------------


class ConstantPredictor:
    """predictors.py ConstantPredictor (with BasePredictor's idle-start skipping)."""

    minimum_data_points = 1

    def __init__(self) -> None:
        self.data: list[float] = []
        self._seen_nonzero = False

    def add(self, value: float) -> bool:
        if math.isnan(value):
            value = 0.0
        if value == 0 and not self._seen_nonzero:
            return False
        if value != 0:
            self._seen_nonzero = True
        self.data.append(float(value))
        return True

    def last(self) -> float:
        return self.data[-1] if self.data else 0.0

    def predict(self) -> float:
        return self.last()


class KalmanPredictor(ConstantPredictor):
    """predictors.py KalmanPredictor: local linear trend, one predict per interval."""

    def __init__(
        self, *, q_level: float, q_trend: float, r: float, min_points: int, log1p: bool
    ) -> None:
        super().__init__()
        self.minimum_data_points = min_points
        self.log1p = log1p
        self.x = np.zeros((2, 1))
        self.P = np.eye(2) * 1000.0
        self.F = np.array([[1.0, 1.0], [0.0, 1.0]])
        self.H = np.array([[1.0, 0.0]])
        self.R = np.array([[max(1e-9, r)]])
        self.Q = np.diag([max(1e-12, q_level), max(1e-12, q_trend)])
        self._initialised = False
        self._cached: float | None = None

    def _step(self) -> None:
        self.x = self.F @ self.x
        self.P = self.F @ self.P @ self.F.T + self.Q

    def add(self, value: float) -> bool:
        if not super().add(value):
            return False
        z = math.log1p(max(0.0, self.data[-1])) if self.log1p else self.data[-1]
        if not self._initialised:
            self.x = np.array([[z], [0.0]])
            self._initialised = True
        else:
            if self._cached is None:
                self._step()
            residual = z - (self.H @ self.x)[0, 0]
            S = self.H @ self.P @ self.H.T + self.R
            K = self.P @ self.H.T / S[0, 0]
            self.x = self.x + K * residual
            I_KH = np.eye(2) - K @ self.H
            self.P = I_KH @ self.P @ I_KH.T + K @ self.R @ K.T  # filterpy's Joseph form
        self._cached = None
        return True

    def predict(self) -> float:
        if not self._initialised or len(self.data) < self.minimum_data_points:
            return self.last()
        if self._cached is None:
            self._step()
            self._cached = float(self.x[0, 0])
        return max(0.0, math.expm1(self._cached)) if self.log1p else max(0.0, self._cached)


# -- the engine's performance, priced by the pool's cost model ---------------------------------


@dataclass(frozen=True)
class EngineCapacity:
    rps: float
    ttft_s: float | None = None
    itl_s: float | None = None
    eligible: bool = True


def capacity_batch_sizes(max_batch: int) -> list[int]:
    """engine_query.py `_capacity_batch_sizes`."""
    if max_batch <= 0:
        return []
    if max_batch <= MAX_CAPACITY_SEARCH_CANDIDATES:
        return list(range(1, max_batch + 1))
    span, denominator = max_batch - 1, MAX_CAPACITY_SEARCH_CANDIDATES - 1
    return [1 + k * span // denominator for k in range(MAX_CAPACITY_SEARCH_CANDIDATES)]


def _better(best: EngineCapacity | None, candidate: EngineCapacity) -> EngineCapacity:
    """engine_query.py `_select_capacity` with the throughput target."""
    if best is None or (candidate.eligible and not best.eligible):
        return candidate
    if best.eligible and not candidate.eligible:
        return best
    return candidate if candidate.rps > best.rps else best


def _ok(value: float | None, sla: float | None) -> bool:
    return sla is None or (value is not None and value <= sla)


class EnginePerformance:
    """One engine's forward passes priced by its step cost model, and Dynamo's capacity
    searches over them (engine_query.py `AISCoreEnginePerfModel`)."""

    def __init__(
        self, cost_model: Any, *, max_num_batched_tokens: int, max_num_seqs: int, max_kv_tokens: int
    ) -> None:
        self.cost_model = cost_model
        self.max_num_batched_tokens = int(max_num_batched_tokens)
        self.max_num_seqs = int(max_num_seqs)
        self.max_kv_tokens = int(max_kv_tokens)
        self._longest = bool(getattr(cost_model, "prices_decode_longest", False))

    def forward_s(
        self, prefill_tokens: int, num_decodes: int = 0, decode_kv_tokens: int = 0
    ) -> float:
        """A pass of one fresh prefill chunk (no cached context, as Dynamo's synthetic
        forward passes carry only token counts) beside a uniform decode batch."""
        chunks = ((int(prefill_tokens), 0),) if prefill_tokens > 0 else ()
        if self._longest and num_decodes > 0:
            longest = -(-int(decode_kv_tokens) // num_decodes)
            return float(
                self.cost_model.step_time(chunks, int(num_decodes), int(decode_kv_tokens), longest)
            )
        return float(self.cost_model.step_time(chunks, int(num_decodes), int(decode_kv_tokens)))

    def chunked_s(self, tokens: int, chunk_s: Callable[[int], float]) -> float:
        """engine_query.py `_prefill_chunk_time`: full max_num_batched_tokens chunks plus a tail."""
        full, tail = divmod(int(tokens), self.max_num_batched_tokens)
        total = full * chunk_s(self.max_num_batched_tokens) if full else 0.0
        return total + (chunk_s(tail) if tail else 0.0)

    def prefill_s(self, tokens: int) -> float:
        return self.chunked_s(tokens, lambda chunk: self.forward_s(chunk))

    def decode_s(self, batch: float, context_length: int) -> float:
        """A decode pass of `batch` requests at one context length; a fractional batch (a
        mean concurrency) interpolates linearly between its neighbours, as Dynamo's decode
        interpolator does over its grid, and a batch below 1 prices as 1."""
        if batch <= 1:
            return self.forward_s(0, 1, context_length)
        lo = math.floor(batch)
        t_lo = self.forward_s(0, lo, lo * context_length)
        if batch == lo:
            return t_lo
        t_hi = self.forward_s(0, lo + 1, (lo + 1) * context_length)
        return t_lo + (batch - lo) * (t_hi - t_lo)

    def prefill_capacity(self, isl: float, ttft_sla_s: float | None) -> EngineCapacity | None:
        """engine_query.py `_find_prefill_capacity`."""
        isl_tokens = max(1, math.ceil(isl))
        if isl_tokens > self.max_num_batched_tokens:
            max_batch = 1
        else:
            max_batch = min(self.max_num_seqs, self.max_num_batched_tokens // isl_tokens)
        best = None
        for batch in capacity_batch_sizes(max_batch):
            ttft = self.prefill_s(isl_tokens * batch)
            if ttft <= 0:
                continue
            best = _better(
                best, EngineCapacity(rps=batch / ttft, ttft_s=ttft, eligible=_ok(ttft, ttft_sla_s))
            )
        return best

    @staticmethod
    def context_length(isl: float, osl: float) -> int:
        """engine_query.py `_decode_context_length` on the ceiled ISL/OSL."""
        return max(1, math.ceil(isl) + max(1, math.ceil(osl)) // 2)

    def decode_max_batch(self, context_length: int) -> int:
        return min(self.max_num_seqs, self.max_kv_tokens // context_length)

    def decode_capacity(
        self, isl: float, osl: float, itl_sla_s: float | None
    ) -> EngineCapacity | None:
        """engine_query.py `_find_decode_capacity` (accept length 1)."""
        osl_tokens = max(1, math.ceil(osl))
        context = self.context_length(isl, osl)
        best = None
        for batch in capacity_batch_sizes(self.decode_max_batch(context)):
            itl = self.forward_s(0, batch, batch * context)
            if itl <= 0:
                continue
            best = _better(
                best,
                EngineCapacity(
                    rps=batch / (osl_tokens * itl), itl_s=itl, eligible=_ok(itl, itl_sla_s)
                ),
            )
        return best

    def aggregated_capacity(
        self, isl: float, osl: float, ttft_sla_s: float | None, itl_sla_s: float | None
    ) -> EngineCapacity | None:
        """engine_query.py `_find_aggregated_capacity` (accept length 1)."""
        mbt = self.max_num_batched_tokens
        if mbt <= 1:
            return None
        isl_tokens = max(1, math.ceil(isl))
        osl_tokens = max(1, math.ceil(osl))
        context = self.context_length(isl, osl)
        best = None
        for batch in capacity_batch_sizes(min(self.decode_max_batch(context), max(1, mbt - 1))):
            per_pass = math.ceil(batch * isl_tokens / osl_tokens)
            if max(0, mbt - batch) == 0 or per_pass > mbt - batch:
                continue  # `_prefill_decode_balanced`: the decodes' prefill cannot keep up
            decode_kv = batch * context
            itl = self.forward_s(min(mbt, per_pass), batch, decode_kv)
            if itl <= 0:
                continue
            ttft = self.chunked_s(
                min(mbt, per_pass) + isl_tokens,
                lambda chunk, b=batch, kv=decode_kv: self.forward_s(chunk, b, kv),
            )
            best = _better(
                best,
                EngineCapacity(
                    rps=batch / (osl_tokens * itl),
                    ttft_s=ttft,
                    itl_s=itl,
                    eligible=_ok(ttft, ttft_sla_s) and _ok(itl, itl_sla_s),
                ),
            )
        return best


def profiler_tables(
    perf: EnginePerformance, *, max_context_length: int, granularity: int = 8, num_gpus: int = 1
) -> dict[str, dict[str, np.ndarray]]:
    """The raw_data.npz arrays dynamo/profiler would save for this engine, from its cost
    model (see the module docstring for the file and function each mirrors)."""
    top = max_context_length - 512
    isls = list(range(100, top, max(1, (top - 100) // granularity))) if top > 100 else []
    ttft_ms = np.array([perf.prefill_s(isl) * 1000.0 for isl in isls])
    prefill = {
        "prefill_isl": np.array(isls),
        "prefill_ttft": ttft_ms,
        "prefill_thpt_per_gpu": np.array(isls) / ttft_ms / num_gpus * 1000.0
        if isls
        else np.array([]),
    }
    osl = 500
    kv_usage, contexts, itls, thpts = [], [], [], []
    for isl in range(
        100, max_context_length - osl, max(1, (max_context_length - osl) // granularity)
    ):
        max_concurrency = perf.max_kv_tokens // (isl + osl)
        if max_concurrency == 0:
            break
        for n in _num_request_range(min(max_concurrency, DECODE_MAX_CONCURRENCY), granularity):
            context = isl + osl / 2
            itl_s = perf.forward_s(0, n, round(n * context))
            kv_usage.append(context * n / perf.max_kv_tokens)
            contexts.append(context)
            itls.append(itl_s * 1000.0)
            thpts.append(n / itl_s / num_gpus)
    decode = {
        "x_kv_usage": np.array(kv_usage),
        "y_context_length": np.array(contexts),
        "z_itl": np.array(itls),
        "z_thpt_per_gpu": np.array(thpts),
        "max_kv_tokens": np.array([perf.max_kv_tokens]),
    }
    return {"prefill": prefill, "decode": decode}


def _num_request_range(max_concurrency: int, granularity: int) -> list[int]:
    """profile_decode.py `get_num_request_range` without attention data parallelism."""
    if max_concurrency < granularity:
        return list(range(1, max_concurrency + 1))
    step = (max_concurrency - 1) / (granularity - 1)
    return [1 + int(k * step) for k in range(granularity)]


# -- the GPU ceiling (core/budget.py) -----------------------------------------------------------


def fit_pair_under_ceiling(
    current: tuple[int, int],
    proposed: tuple[int, int],
    gpus: tuple[int, int],
    max_gpus: int,
    floors: tuple[int, int],
) -> tuple[int, int]:
    """budget.py `fit_directional_budget_pair` with no GPU floor: the proposal if it fits
    `max_gpus`, else the fitting pair nearest to it with each role between its current and
    proposed count (an opposing rebalance moves both roles or neither), or the current pair."""
    (cur_p, cur_d), (prop_p, prop_d), (p_gpu, d_gpu), (min_p, min_d) = (
        current,
        proposed,
        gpus,
        floors,
    )
    if p_gpu <= 0 or d_gpu <= 0:
        return proposed
    fits = max_gpus < 0 or prop_p * p_gpu + prop_d * d_gpu <= max_gpus
    if prop_p >= min_p and prop_d >= min_d and fits:
        return proposed
    opposing = (prop_p < cur_p and prop_d > cur_d) or (prop_p > cur_p and prop_d < cur_d)
    want_p, want_d = abs(prop_p - cur_p), abs(prop_d - cur_d)
    p_low, d_low = max(min(cur_p, prop_p), min_p), max(min(cur_d, prop_d), min_d)
    p_high, d_high = max(cur_p, prop_p), max(cur_d, prop_d)
    if max_gpus >= 0:
        p_high = min(p_high, (max_gpus - d_low * d_gpu) // p_gpu)
        d_high = min(d_high, (max_gpus - p_low * p_gpu) // d_gpu)
    if p_low > p_high or d_low > d_high:
        return current
    best: tuple[tuple[int, ...], tuple[int, int]] | None = None
    for cand_p in range(p_low, p_high + 1):
        lo, hi = d_low, d_high
        if max_gpus >= 0:
            hi = min(hi, (max_gpus - cand_p * p_gpu) // d_gpu)
        if opposing:
            if cand_p == cur_p:
                if lo <= cur_d <= hi:
                    lo = hi = cur_d
                else:
                    continue
            elif prop_d > cur_d:
                lo = max(lo, cur_d + 1)
            else:
                hi = min(hi, cur_d - 1)
        if lo > hi:
            continue
        cand_d = min(max(prop_d, lo), hi)
        moved_p, moved_d = abs(cand_p - cur_p), abs(cand_d - cur_d)
        score = (
            abs(prop_p - cand_p) + abs(prop_d - cand_d),
            abs(moved_p * want_d - moved_d * want_p),
            -(moved_p + moved_d),
            cand_p,
            cand_d,
        )
        if best is None or score < best[0]:
            best = (score, (cand_p, cand_d))
    return current if best is None else best[1]


def _clamp_single(desired: int, gpus: int, max_gpus: int, floor: int) -> int:
    """budget.py `proportional_clamp_single` with no GPU floor (0 when even the floor
    overshoots the ceiling: an infeasible configuration)."""
    if max_gpus < 0 or gpus <= 0 or desired * gpus <= max_gpus:
        return desired
    if max_gpus < floor * gpus:
        return 0
    return max(floor, max_gpus // gpus)


def fit_single_under_ceiling(
    current: int, proposed: int, gpus: int, max_gpus: int, floor: int
) -> int:
    """budget.py `guard_single_scaling_budget` with no GPU floor."""
    if gpus <= 0:
        return proposed
    if max_gpus >= 0 and current * gpus > max_gpus:
        return _clamp_single(current, gpus, max_gpus, floor)
    if max_gpus >= 0 and current * gpus >= max_gpus and proposed > current:
        return current
    final = _clamp_single(proposed, gpus, max_gpus, floor)
    return final if min(current, proposed) <= final <= max(current, proposed) else current


# -- the planner ------------------------------------------------------------------------------


def _fact(facts: Any, key: str) -> Any:
    if isinstance(facts, Mapping):
        return facts.get(key)
    return getattr(facts, key, None)


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


@AUTOSCALERS.register("sla_planner")
class SlaPlanner(Autoscaler):
    """Dynamo 1.6.1's SLA planner: forecasts the next interval's requests, ISL and OSL, sizes
    each engine's capacity under the TTFT and ITL targets from the pool's step cost model,
    and asks for ceil(demand / capacity) prefill and decode (or aggregated) replicas within
    its change cap and GPU budget (the module docstring cites Dynamo's source step by step)."""

    def __init__(
        self,
        *,
        mode: str = "auto",
        ttft_ms: float = 500.0,
        itl_ms: float = 50.0,
        load_predictor: str = "constant",
        load_predictor_log1p: bool = False,
        kalman_q_level: float = 1.0,
        kalman_q_trend: float = 0.1,
        kalman_r: float = 10.0,
        kalman_min_points: int = 5,
        min_endpoint: int = 1,
        prefill_min_endpoint: int | None = None,
        decode_min_endpoint: int | None = None,
        max_gpu_budget: int = -1,
        max_throughput_scaling_replicas: int = 8,
        correction_factors: bool = False,
        prefill_pool: str | None = None,
        decode_pool: str | None = None,
        pool: str | None = None,
        max_num_batched_tokens: int | None = None,
        max_num_seqs: int | None = None,
        max_kv_tokens: int | None = None,
        isl_from: str = "routed",
    ) -> None:
        self.mode = check_choice("mode", mode, MODES)
        self.isl_from = check_choice("isl_from", isl_from, ISL_FROM)
        self.ttft_ms = float(check_number("ttft_ms", ttft_ms, lo=0, lo_open=True))
        self.itl_ms = float(check_number("itl_ms", itl_ms, lo=0, lo_open=True))
        self.load_predictor = check_choice("load_predictor", load_predictor, PREDICTORS)
        self.load_predictor_log1p = check_bool("load_predictor_log1p", load_predictor_log1p)
        self.kalman = {
            "q_level": float(check_number("kalman_q_level", kalman_q_level, lo=0)),
            "q_trend": float(check_number("kalman_q_trend", kalman_q_trend, lo=0)),
            "r": float(check_number("kalman_r", kalman_r, lo=0)),
            "min_points": int(
                check_number("kalman_min_points", kalman_min_points, lo=1, integer=True)
            ),
        }
        self.min_endpoint = int(check_number("min_endpoint", min_endpoint, lo=0, integer=True))
        for name, value in (
            ("prefill_min_endpoint", prefill_min_endpoint),
            ("decode_min_endpoint", decode_min_endpoint),
        ):
            if value is not None:
                check_number(name, value, lo=1, integer=True)
        self.prefill_min_endpoint = (
            self.min_endpoint if prefill_min_endpoint is None else prefill_min_endpoint
        )
        self.decode_min_endpoint = (
            self.min_endpoint if decode_min_endpoint is None else decode_min_endpoint
        )
        self.max_gpu_budget = int(
            check_number("max_gpu_budget", max_gpu_budget, lo=-1, integer=True)
        )
        self.max_step = int(
            check_number(
                "max_throughput_scaling_replicas",
                max_throughput_scaling_replicas,
                lo=1,
                integer=True,
            )
        )
        self.correction_factors = check_bool("correction_factors", correction_factors)
        for name, value in (
            ("prefill_pool", prefill_pool),
            ("decode_pool", decode_pool),
            ("pool", pool),
        ):
            if value is not None and not isinstance(value, str):
                raise ValueError(f"param {name!r} must be a pool name, got {value!r}")
        self._pool_names = {"prefill": prefill_pool, "decode": decode_pool, "agg": pool}
        self._limits = {
            "max_num_batched_tokens": max_num_batched_tokens,
            "max_num_seqs": max_num_seqs,
            "max_kv_tokens": max_kv_tokens,
        }
        for name, value in self._limits.items():
            if value is not None:
                check_number(name, value, lo=1, integer=True)
        self._predictors = {key: self._new_predictor() for key in ("num_req", "isl", "osl")}
        self._seen_traffic = False
        self._last_isl: float | None = None
        self._last_osl: float | None = None
        self.p_correction = 1.0
        self.d_correction = 1.0
        self.last_decision: dict[str, Any] = {}

    def _new_predictor(self) -> ConstantPredictor:
        if self.load_predictor == "constant":
            return ConstantPredictor()
        return KalmanPredictor(log1p=self.load_predictor_log1p, **self.kalman)

    # -- binding to the fleet ------------------------------------------------------------------

    def bind(self, ctx: ScalerContext) -> None:
        super().bind(ctx)
        roles = {name: _fact(facts, "role") for name, facts in sorted(ctx.pools.items())}

        def pick(role: str, given: str | None, param: str) -> str:
            if given is not None:
                if given not in roles:
                    raise bind_error(
                        self, f"param {param!r}: no pool {given!r} (pools: {', '.join(roles)})"
                    )
                return given
            found = [name for name, r in roles.items() if r == role]
            if len(found) != 1:
                raise bind_error(
                    self,
                    f"param {param!r} must name the {role} pool ({len(found)} pools have role {role}: {', '.join(roles)})",
                )
            return found[0]

        mode = self.mode
        if mode == "auto":
            mode = "disagg" if any(r in ("prefill", "decode") for r in roles.values()) else "agg"
        self.resolved_mode = mode
        if mode == "agg" and self.correction_factors:
            raise bind_error(
                self,
                "param 'correction_factors' needs prefill and decode pools (the 0.x planner had no aggregated mode)",
            )
        if mode == "disagg":
            self.prefill_pool = pick("prefill", self._pool_names["prefill"], "prefill_pool")
            self.decode_pool = pick("decode", self._pool_names["decode"], "decode_pool")
            managed = (self.prefill_pool, self.decode_pool)
        else:
            self.agg_pool = pick("both", self._pool_names["agg"], "pool")
            managed = (self.agg_pool,)
        self.performance = {name: self._performance(ctx, name) for name in managed}

    def _performance(self, ctx: ScalerContext, name: str) -> EnginePerformance:
        """The pool's engine limits: the params, else `ctx.engine_limits[pool]` (a mapping
        of max_num_batched_tokens, max_num_seqs, max_kv_tokens), else the pool facts, else
        lmsim's engine defaults; the KV capacity last from the cost model's memory facts at
        the default block size and memory utilisation, then Dynamo's replay fallback."""
        cost_model = ctx.cost_models[name]
        sources = (
            self._limits,
            (getattr(ctx, "engine_limits", None) or {}).get(name) or {},
            ctx.pools[name],
        )

        def limit(key: str) -> int | None:
            for source in sources:
                value = _fact(source, key)
                if value:
                    return int(value)
            return None

        kv = limit("max_kv_tokens")
        if kv is None:
            blocks, block_size = limit("num_gpu_blocks"), limit("block_size")
            if blocks and block_size:
                kv = blocks * block_size
        if kv is None and hasattr(cost_model, "num_kv_blocks"):
            block_size = ClusterConfig.model_fields["block_size"].default
            utilisation = ClusterConfig.model_fields["gpu_memory_utilization"].default
            blocks = cost_model.num_kv_blocks(block_size, utilisation)
            kv = blocks * block_size if blocks else None
        return EnginePerformance(
            cost_model,
            max_num_batched_tokens=limit("max_num_batched_tokens")
            or ClusterConfig.model_fields["max_num_batched_tokens"].default,
            max_num_seqs=limit("max_num_seqs")
            or ClusterConfig.model_fields["max_num_seqs"].default,
            max_kv_tokens=kv or FALLBACK_MAX_KV_TOKENS,
        )

    # -- one decision --------------------------------------------------------------------------

    def _traffic(self, observation: FleetObservation) -> tuple[PoolObservation, PoolObservation]:
        """The pool requests enter by (request count, ISL, TTFT) and the pool they finish in
        (OSL, ITL): Dynamo reads both from the frontend, which sees the whole request."""
        if self.resolved_mode == "disagg":
            return observation.pools[self.prefill_pool], observation.pools[self.decode_pool]
        pool = observation.pools[self.agg_pool]
        return pool, pool

    def observe(self, observation: FleetObservation) -> tuple[float, float, float]:
        """local_planner.py `_observe_load` then `_predict_load`: the forecast request
        count, ISL and OSL of the next interval."""
        entry, exit_ = self._traffic(observation)
        num_req = float(entry.num_requests)
        isl, osl = entry.mean_input_tokens, exit_.mean_output_tokens
        if self.isl_from == "finished":
            isl = exit_.mean_finished_input_tokens
        self._predictors["num_req"].add(num_req)
        if num_req > 0:
            self._seen_traffic = True
            if _finite(isl):
                self._last_isl = isl
            if _finite(osl):
                self._last_osl = osl
        if num_req == 0 and self._seen_traffic:
            isl = self._last_isl if self._last_isl is not None else 0.0
            osl = self._last_osl if self._last_osl is not None else 0.0
        if _finite(isl):
            self._predictors["isl"].add(isl)
        if _finite(osl):
            self._predictors["osl"].add(osl)
        return tuple(self._predictors[key].predict() for key in ("num_req", "isl", "osl"))  # type: ignore[return-value]

    def update_correction_factors(self, observation: FleetObservation) -> None:
        """planner_core.py (0.x) `_update_correction_factor`: observed / expected TTFT and ITL."""
        entry, exit_ = self._traffic(observation)
        isl, osl = entry.mean_input_tokens, exit_.mean_output_tokens
        if not (_finite(isl) and isl > 0 and _finite(osl) and osl > 0):
            return
        first = self.performance[
            self.prefill_pool if self.resolved_mode == "disagg" else self.agg_pool
        ]
        if _finite(entry.ttft_mean_s):
            expected_ttft = first.prefill_s(max(1, math.ceil(isl)))
            if expected_ttft > 0:
                self.p_correction = entry.ttft_mean_s / expected_ttft
        if _finite(exit_.itl_mean_s) and exit_.active > 0:
            last = self.performance[
                self.decode_pool if self.resolved_mode == "disagg" else self.agg_pool
            ]
            ttft = entry.ttft_mean_s if _finite(entry.ttft_mean_s) else 0.0
            duration = ttft + exit_.itl_mean_s * max(0.0, osl - 1)
            concurrency = entry.num_requests / exit_.active * duration / observation.interval_s
            expected_itl = last.decode_s(concurrency, max(1, round(isl + osl / 2)))
            if expected_itl > 0:
                self.d_correction = exit_.itl_mean_s / expected_itl

    def prefill_replicas(self, demand_rps: float, isl: float) -> int | None:
        """throughput_scaling.py `_compute_prefill_replicas` (+ the 0.x TTFT correction)."""
        if isl <= 0:
            return None
        capacity = self.performance[self.prefill_pool].prefill_capacity(isl, self.ttft_ms / 1000.0)
        if capacity is None or capacity.rps <= 0:
            return None
        if self.correction_factors:
            demand_rps *= min(1.0, self.p_correction)
        self.last_decision["prefill_engine_rps"] = capacity.rps
        return max(math.ceil(demand_rps / capacity.rps), self.prefill_min_endpoint)

    def decode_replicas(self, demand_rps: float, isl: float, osl: float) -> int | None:
        """throughput_scaling.py `_compute_decode_replicas` (+ the 0.x ITL correction)."""
        if isl <= 0 or osl <= 0:
            return None
        itl_ms = self.itl_ms
        if self.correction_factors and self.d_correction > 0:
            itl_ms = itl_ms / self.d_correction
        capacity = self.performance[self.decode_pool].decode_capacity(isl, osl, itl_ms / 1000.0)
        if capacity is None or capacity.rps <= 0:
            return None
        self.last_decision["decode_engine_rps"] = capacity.rps
        return max(math.ceil(demand_rps / capacity.rps), self.decode_min_endpoint)

    def aggregated_replicas(self, demand_rps: float, isl: float, osl: float) -> int | None:
        """throughput_scaling.py `_throughput_agg`."""
        if isl <= 0 or osl <= 0:
            return None
        capacity = self.performance[self.agg_pool].aggregated_capacity(
            isl, osl, self.ttft_ms / 1000.0, self.itl_ms / 1000.0
        )
        if capacity is None or capacity.rps <= 0:
            return None
        self.last_decision["engine_rps"] = capacity.rps
        return max(math.ceil(demand_rps / capacity.rps), self.decode_min_endpoint)

    def _cap(self, desired: int, current: int) -> int:
        """throughput_scaling.py `_cap_throughput_replicas`."""
        return min(max(desired, max(0, current - self.max_step)), current + self.max_step)

    def decide(self, observation: FleetObservation) -> dict[str, int]:
        if self.correction_factors:
            self.update_correction_factors(observation)
        num_req, isl, osl = self.observe(observation)
        demand_rps = num_req / observation.interval_s
        self.last_decision = {
            "predicted_num_req": num_req,
            "predicted_isl": isl,
            "predicted_osl": osl,
            "demand_rps": demand_rps,
        }
        if self.resolved_mode == "disagg":
            answer = self._decide_disagg(observation, demand_rps, isl, osl)
        else:
            answer = self._decide_agg(observation, demand_rps, isl, osl)
        if self.correction_factors:
            self.last_decision.update(
                p_correction=self.p_correction, d_correction=self.d_correction
            )
        self.last_decision.update(
            {f"target_{name}": count for name, count in sorted(answer.items())}
        )
        # what Dynamo's diagnostics report per tick, into the run's router_events.parquet
        self.ctx.record_event("sla_planner", **self.last_decision)
        return answer

    def _decide_disagg(
        self, observation: FleetObservation, demand_rps: float, isl: float, osl: float
    ) -> dict[str, int]:
        prefill, decode = observation.pools[self.prefill_pool], observation.pools[self.decode_pool]
        current = (prefill.active, decode.active)
        num_p = self.prefill_replicas(demand_rps, isl)
        num_d = self.decode_replicas(demand_rps, isl, osl)
        if num_p is None or num_d is None:  # the model cannot size this tick: hold both
            num_p, num_d = current
        num_p = max(self._cap(num_p, current[0]), self.prefill_min_endpoint)
        num_d = max(self._cap(num_d, current[1]), self.decode_min_endpoint)
        num_p, num_d = fit_pair_under_ceiling(
            current,
            (num_p, num_d),
            (prefill.gpus_per_instance, decode.gpus_per_instance),
            self.max_gpu_budget,
            (self.prefill_min_endpoint, self.decode_min_endpoint),
        )
        if (num_p, num_d) == current:
            return {}
        return {self.prefill_pool: num_p, self.decode_pool: num_d}

    def _decide_agg(
        self, observation: FleetObservation, demand_rps: float, isl: float, osl: float
    ) -> dict[str, int]:
        pool = observation.pools[self.agg_pool]
        desired = self.aggregated_replicas(demand_rps, isl, osl)
        if desired is None:
            desired = pool.active
        desired = max(self._cap(desired, pool.active), self.decode_min_endpoint)
        desired = fit_single_under_ceiling(
            pool.active,
            desired,
            pool.gpus_per_instance,
            self.max_gpu_budget,
            self.decode_min_endpoint,
        )
        if desired == pool.active:
            return {}
        return {self.agg_pool: desired}
