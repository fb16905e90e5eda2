"""`hpa`: the Kubernetes HorizontalPodAutoscaler (autoscaling/v2) on one per-replica metric.

One HPA per managed pool, each with the same spec. Every decision runs the controller's
three steps, as kube-controller-manager does in pkg/controller/podautoscaler:

1. **Metric replicas** (replica_calculator.go, `calcPlainMetricReplicas`, an `AverageValue`
   target on a Pods metric): the per-replica average over the replicas that report the
   metric (the pool's active instances), `ratio = average / target`; inside the tolerance
   band `1 - tolerance <= ratio <= 1 + tolerance` the count stays, else
   `desired = ceil(ratio * reporting replicas)`. Instances still starting have no metrics
   yet (a vLLM pod serves /metrics only once its server is up): kube counts such *missing*
   pods as using the target on a scale-down and 0 on a scale-up, recomputes the ratio over
   all of them, and holds if that flips the direction or lands in the band.
2. **Stabilization** (horizontal.go, `stabilizeRecommendationWithBehaviors`): the raw
   recommendation of every decision is stored with its time; the answer may not go above
   the current count by more than the *minimum* of the recommendations of the last
   `scale_up.stabilization_window_s` (default 0 s), nor below it by more than the *maximum*
   of those of the last `scale_down.stabilization_window_s` (default 300 s). Windows are
   half-open, (now - window, now], as kube compares `timestamp.After(cutoff)`.
3. **Rate limits** (horizontal.go, `convertDesiredReplicasWithBehaviorRate`,
   `calculateScaleUpLimitWithScalingRules`, `calculateScaleDownLimitWithBehaviors`): each
   policy `{type: pods|percent, value, period_s}` proposes a bound from the replica count at
   the start of its period (the current count minus the scale-ups plus the scale-downs
   made in the last `period_s`): up `start + value` or `ceil(start * (1 + value/100))`,
   down `start - value` or `int(start * (1 - value/100))`; `select_policy: max` takes the
   policy allowing the largest change (kube's default), `min` the smallest, `disabled`
   forbids that direction. Then `[min_replicas, max_replicas]` of the fleet pool.

Defaults are the API's (k8s.io/api autoscaling/v2 `HPAScalingRules`, and the HPA docs,
kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/ "Algorithm details",
"Default Behavior"): scale-up 0 s window, policies 4 pods or 100 % per 15 s, `max`;
scale-down 300 s window, 100 % per 15 s; tolerance 0.1 (per direction configurable since
KEP-4951, Kubernetes 1.33). The controller's sync period (15 s by default,
`--horizontal-pod-autoscaler-sync-period`) is `autoscaler.interval_s` here; the metrics
pipeline lag (metrics-server / Prometheus adapter) is `autoscaler.metrics_delay_s`.

Metrics (`metric`), each averaged per reporting replica: `num_running` and `num_waiting`
(vLLM's `vllm:num_requests_running` / `_waiting` gauges, summed over the active instances),
`kv_usage` (`vllm:kv_cache_usage_perc`, 0..1) and `request_rate` (the pool's arrival rate
over the last interval, req/s, divided among the active instances).

llm-d's simulator BLIS (inference-sim/inference-sim, sim/cluster/autoscaler.go,
`autoscalerPipeline.tick`) gates decisions differently: a scale signal passes once it has
been present continuously for the window, and any tick without it restarts the timer. That
is not kube's rule (a max/min over stored recommendations), which is what is mirrored here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lmsim.autoscalers.base import AUTOSCALERS
from lmsim.autoscalers.errors import bind_error
from lmsim.routing import check_choice, check_number
from lmsim.scaling import Autoscaler, FleetObservation, PoolObservation, ScalerContext

METRICS = ("num_running", "num_waiting", "kv_usage", "request_rate")
POLICY_TYPES = ("pods", "percent")
SELECT_POLICIES = ("max", "min", "disabled")
RULE_KEYS = ("stabilization_window_s", "policies", "select_policy", "tolerance")
POLICY_KEYS = ("type", "value", "period_s")

# k8s.io/api autoscaling/v2 defaults (HPAScalingRules doc): scale up by 4 pods or 100 % per
# 15 s, whichever is more; scale down by up to 100 % per 15 s.
DEFAULT_SCALE_UP_POLICIES = (
    {"type": "pods", "value": 4, "period_s": 15},
    {"type": "percent", "value": 100, "period_s": 15},
)
DEFAULT_SCALE_DOWN_POLICIES = ({"type": "percent", "value": 100, "period_s": 15},)


@dataclass(frozen=True)
class ScalingPolicy:
    kind: str  # pods | percent
    value: int
    period_s: float


@dataclass(frozen=True)
class ScalingRules:
    """One direction of `spec.behavior` (HPAScalingRules)."""

    stabilization_window_s: float
    policies: tuple[ScalingPolicy, ...]
    select_policy: str
    tolerance: float


def _parse_rules(
    name: str, raw: Any, *, window_s: float, policies: Sequence[Mapping[str, Any]], tolerance: float
) -> ScalingRules:
    raw = {} if raw is None else raw
    if not isinstance(raw, Mapping):
        raise ValueError(f"param {name!r} must be a mapping of {'|'.join(RULE_KEYS)}, got {raw!r}")
    for key in raw:
        if key not in RULE_KEYS:
            raise ValueError(f"param {name!r} has no key {key!r} (allowed: {', '.join(RULE_KEYS)})")
    window = check_number(
        f"{name}.stabilization_window_s", raw.get("stabilization_window_s", window_s), lo=0
    )
    select = check_choice(f"{name}.select_policy", raw.get("select_policy", "max"), SELECT_POLICIES)
    tol = check_number(f"{name}.tolerance", raw.get("tolerance", tolerance), lo=0)
    raw_policies = raw.get("policies", policies)
    if not isinstance(raw_policies, Sequence) or isinstance(raw_policies, str) or not raw_policies:
        raise ValueError(f"param '{name}.policies' must be a non-empty list, got {raw_policies!r}")
    parsed = []
    for k, item in enumerate(raw_policies):
        where = f"{name}.policies[{k}]"
        if not isinstance(item, Mapping):
            raise ValueError(
                f"param {where!r} must be a mapping of type, value, period_s, got {item!r}"
            )
        for key in item:
            if key not in POLICY_KEYS:
                raise ValueError(
                    f"param {where!r} has no key {key!r} (allowed: {', '.join(POLICY_KEYS)})"
                )
        for key in POLICY_KEYS:
            if key not in item:
                raise ValueError(f"param {where!r} lacks {key!r}")
        parsed.append(
            ScalingPolicy(
                kind=check_choice(f"{where}.type", item["type"], POLICY_TYPES),
                value=int(
                    check_number(f"{where}.value", item["value"], lo=0, lo_open=True, integer=True)
                ),
                period_s=float(
                    check_number(f"{where}.period_s", item["period_s"], lo=0, lo_open=True)
                ),
            )
        )
    return ScalingRules(float(window), tuple(parsed), select, float(tol))


class _PoolState:
    """What one HPA remembers between decisions: its raw recommendations and the scale
    events its rate limits count."""

    def __init__(self) -> None:
        self.recommendations: list[tuple[float, int]] = []
        self.scale_ups: list[tuple[float, int]] = []
        self.scale_downs: list[tuple[float, int]] = []


@AUTOSCALERS.register("hpa")
class HorizontalPodAutoscaler(Autoscaler):
    """Kubernetes' HorizontalPodAutoscaler (autoscaling/v2), one per pool, on one per-replica
    metric (running, waiting, KV usage or request rate) with a target value, its tolerance,
    stabilization windows and scale rate limits (the module docstring cites kube's source)."""

    def __init__(
        self,
        *,
        metric: str,
        target: float,
        tolerance: float = 0.1,
        scale_up: Mapping[str, Any] | None = None,
        scale_down: Mapping[str, Any] | None = None,
        pools: Sequence[str] | None = None,
    ) -> None:
        self.metric = check_choice("metric", metric, METRICS)
        self.target = float(check_number("target", target, lo=0, lo_open=True))
        tolerance = float(check_number("tolerance", tolerance, lo=0))
        self.scale_up = _parse_rules(
            "scale_up",
            scale_up,
            window_s=0.0,
            policies=DEFAULT_SCALE_UP_POLICIES,
            tolerance=tolerance,
        )
        self.scale_down = _parse_rules(
            "scale_down",
            scale_down,
            window_s=300.0,
            policies=DEFAULT_SCALE_DOWN_POLICIES,
            tolerance=tolerance,
        )
        if pools is not None and (
            isinstance(pools, str)
            or not isinstance(pools, Sequence)
            or not all(isinstance(p, str) for p in pools)
        ):
            raise ValueError(f"param 'pools' must be a list of pool names, got {pools!r}")
        self.pools = None if pools is None else tuple(pools)
        self._state: dict[str, _PoolState] = {}

    def bind(self, ctx: ScalerContext) -> None:
        super().bind(ctx)
        for name in self.pools or ():
            if name not in ctx.pools:
                raise bind_error(
                    self, f"param 'pools': no pool {name!r} (pools: {', '.join(sorted(ctx.pools))})"
                )

    def decide(self, observation: FleetObservation) -> dict[str, int]:
        names = self.pools if self.pools is not None else sorted(observation.pools)
        answer: dict[str, int] = {}
        for name in names:
            desired = self._decide_pool(
                observation.time_s,
                observation.pools[name],
                self._state.setdefault(name, _PoolState()),
            )
            if desired is not None:
                answer[name] = desired
        return answer

    # -- one HPA ---------------------------------------------------------------------------

    def _decide_pool(self, now: float, pool: PoolObservation, state: _PoolState) -> int | None:
        current = pool.target
        # horizontal.go reconcileAutoscaler: out-of-range counts go to the bound first, and a
        # target scaled to zero disables autoscaling.
        if current > pool.max_replicas:
            desired = pool.max_replicas
        elif current < pool.min_replicas:
            desired = pool.min_replicas
        elif current == 0:
            return None
        else:
            metric_desired = self.metric_replicas(pool)
            if metric_desired is None:  # no replica reports the metric: kube skips the update
                return None
            desired = self._stabilize(now, current, metric_desired, state)
            desired = self._rate_limit(now, current, desired, pool, state)
        if desired > current:
            state.scale_ups.append((now, desired - current))
        elif desired < current:
            state.scale_downs.append((now, current - desired))
        self._forget_old_events(now, state)
        return desired

    def metric_total(self, pool: PoolObservation) -> float:
        """The metric summed over the replicas that report it (the active instances)."""
        if self.metric == "num_running":
            return float(pool.num_running)
        if self.metric == "num_waiting":
            return float(pool.num_waiting)
        if self.metric == "kv_usage":
            return pool.kv_usage * pool.active
        return pool.request_rate

    def _within(self, ratio: float) -> bool:
        return 1.0 - self.scale_down.tolerance <= ratio <= 1.0 + self.scale_up.tolerance

    def metric_replicas(self, pool: PoolObservation) -> int | None:
        """replica_calculator.go calcPlainMetricReplicas for an AverageValue target."""
        ready, missing, current = pool.active, pool.starting, pool.target
        if ready == 0:
            return None
        total = self.metric_total(pool)
        ratio = total / ready / self.target
        if missing == 0:
            if self._within(ratio):
                return current
            return math.ceil(ratio * ready)
        if ratio < 1.0:
            counted, filled = ready + missing, total + missing * self.target
        elif ratio > 1.0:
            counted, filled = ready + missing, total
        else:  # neither direction: the missing pods stay out of the average
            counted, filled = ready, total
        new_ratio = filled / counted / self.target
        if (
            self._within(new_ratio)
            or (ratio > 1.0 and new_ratio < 1.0)
            or (ratio < 1.0 and new_ratio > 1.0)
        ):
            return current
        new_replicas = math.ceil(new_ratio * counted)
        if (new_ratio < 1.0 and new_replicas > current) or (
            new_ratio > 1.0 and new_replicas < current
        ):
            return current
        return new_replicas

    def _stabilize(self, now: float, current: int, desired: int, state: _PoolState) -> int:
        up_cutoff = now - self.scale_up.stabilization_window_s
        down_cutoff = now - self.scale_down.stabilization_window_s
        up_bound = down_bound = desired
        for at, recommendation in state.recommendations:
            if at > up_cutoff:
                up_bound = min(up_bound, recommendation)
            if at > down_cutoff:
                down_bound = max(down_bound, recommendation)
        state.recommendations = [
            (at, r) for at, r in state.recommendations if at > up_cutoff or at > down_cutoff
        ]
        state.recommendations.append((now, desired))
        return min(max(current, up_bound), down_bound)

    @staticmethod
    def _changed_within(events: list[tuple[float, int]], now: float, period_s: float) -> int:
        return sum(change for at, change in events if at > now - period_s)

    def _period_start(self, now: float, current: int, period_s: float, state: _PoolState) -> int:
        return (
            current
            - self._changed_within(state.scale_ups, now, period_s)
            + self._changed_within(state.scale_downs, now, period_s)
        )

    def _rate_limit(
        self, now: float, current: int, desired: int, pool: PoolObservation, state: _PoolState
    ) -> int:
        if desired > current:
            limit = max(self._change_limit(self.scale_up, now, current, state, up=True), current)
            return min(desired, pool.max_replicas, limit)
        if desired < current:
            limit = min(self._change_limit(self.scale_down, now, current, state, up=False), current)
            return max(desired, pool.min_replicas, limit)
        return desired

    def _change_limit(self, rules: ScalingRules, now: float, current: int, state: _PoolState, *, up: bool) -> int:
        """The furthest one direction's policies let the count move from `current`: each policy
        proposes a count from the count at its period's start; `select_policy: max` takes the
        proposal that moves furthest, `min` the one that moves least."""
        if rules.select_policy == "disabled":
            return current
        proposals = []
        for policy in rules.policies:
            start = self._period_start(now, current, policy.period_s, state)
            if policy.kind == "pods":
                proposals.append(start + policy.value if up else start - policy.value)
            elif up:  # rounded up, else a small pool could never grow
                proposals.append(math.ceil(start * (1 + policy.value / 100)))
            else:
                proposals.append(int(start * (1 - policy.value / 100)))
        furthest, least = (max, min) if up else (min, max)
        return furthest(proposals) if rules.select_policy == "max" else least(proposals)

    def _forget_old_events(self, now: float, state: _PoolState) -> None:
        up_keep = max(p.period_s for p in self.scale_up.policies)
        down_keep = max(p.period_s for p in self.scale_down.policies)
        state.scale_ups = [(at, c) for at, c in state.scale_ups if at > now - up_keep]
        state.scale_downs = [(at, c) for at, c in state.scale_downs if at > now - down_keep]
