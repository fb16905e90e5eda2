"""Cluster capacity: the highest arrival rate a trace can be replayed at without the cluster
falling behind, found offline as the study does, so `workload.load: 0.5` means "half of the
maximum rate".

Search. The workload (after its window and limit, before any rescaling) is replayed under
the `vllm` policy at rates `r` obtained by time-scaling it; the rate is bracketed by
doubling or halving from the trace's own rate, then bisected until the bracket is within
`rel_tol`. Only the first `probe_requests` requests are replayed per probe, which keeps a
search to a few seconds per probe.

Sustainability criterion (documented in the README): a rate is sustainable when
1. throughput keeps up: the probe drains soon after its last arrival: every request has
   finished within `drain_factor` x the longest isolated service time of any probe request
   (its prefill alone on an idle instance plus its decode steps at batch size 1) after the
   last arrival the trace would have on an idle cluster (a closed-loop step arrives its
   think time after its predecessor would finish if served alone); and
2. the queue does not grow: the mean TTFT of the requests arriving in the last quarter of
   the span is at most `growth_factor` x that of the second quarter plus `growth_slack_s`.
At an overloaded rate the backlog grows over the run, so TTFT grows and the drain takes
far longer than any single request; below capacity TTFT is flat and the drain is short.

Results are cached in `cache_path()` (`$XDG_CACHE_HOME/lmsim/capacity.json`, by default
`~/.cache/lmsim/capacity.json`) and shipped for the bundled
experiments in `experiments/capacity.json` (`lmsim capacity --bundle EXP ...` adds them).
The key is a digest of what DEFINES the measurement, never of the generated numbers (whose
last bits may differ between numpy builds): the workload's identity (generator name,
version, parameters and seed, or a trace file's content digest and format; plus the
window and sampling that shape it), the cluster fields that affect service, the profile's
identity (name and a digest of its tables), the search parameters, `CRITERION_VERSION`
and the reference policy. A cluster field left at None is omitted, so adding an optional
field to the schema does not invalidate every shipped capacity.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lmsim.config import ENGINE_SETTING_FIELDS, ExperimentConfig
from lmsim.errors import ConfigError
from lmsim.shipped import BUNDLED_CAPACITIES
from lmsim.workload.scaling import mean_rate, scale_to_rate
from lmsim.workload.trace import Trace


def cache_path() -> Path:
    """The user's capacity cache: `$XDG_CACHE_HOME/lmsim/capacity.json`, or
    `~/.cache/lmsim/capacity.json` when XDG_CACHE_HOME is unset or not absolute (the XDG
    base directory specification ignores a relative one). Read at each use, so the
    environment of the command that runs decides."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    root = Path(base) if os.path.isabs(base) else Path.home() / ".cache"
    return root / "lmsim" / "capacity.json"


BUNDLED_PATH = BUNDLED_CAPACITIES
CRITERION_VERSION = 4


@dataclass(frozen=True)
class CapacitySearch:
    probe_requests: int = 8000
    rel_tol: float = 0.03
    drain_factor: float = 2.0
    drain_slack_s: float = 1.0
    growth_factor: float = 1.5
    growth_slack_s: float = 0.5
    max_probes: int = 24


@dataclass
class Probe:
    rate: float
    sustainable: bool
    reason: str


@dataclass
class Capacity:
    """A resolved capacity: `rate` (None when not known and no search was allowed) and where
    it came from: `shipped` (experiments/capacity.json), `cached` (the user cache),
    `searched` (measured now) or `missing`."""

    rate: float | None
    source: str
    key: str
    probes: list[Probe] = field(default_factory=list)


def reference_policy(config: ExperimentConfig) -> tuple[str, dict[str, Any]]:
    """The policy whose sustainable rate "capacity" means: `capacity.policy` (vllm unless
    set). A disaggregated cluster needs a pair: a colocated capacity policy routes both roles
    under `pd` (by default `pd` with vllm on the prefill and on the decode instances)."""
    from lmsim.policies import POLICIES

    cap = config.capacity
    if not config.cluster.is_disaggregated or getattr(POLICIES.get(cap.policy), "disaggregated", False):
        return cap.policy, dict(cap.params)
    side = {"prefill_policy": cap.policy, "decode_policy": cap.policy}
    if cap.params:
        side.update(prefill_params=dict(cap.params), decode_params=dict(cap.params))
    return "pd", side


def describe_reference(config: ExperimentConfig) -> str:
    policy, params = reference_policy(config)
    if policy == "pd" and not config.capacity.params and not getattr(_policy_class(config.capacity.policy), "disaggregated", False):
        return f"pd ({params['prefill_policy']} on the prefill and on the decode instances)"
    return repr(policy)


def _policy_class(name: str) -> Any:
    from lmsim.policies import POLICIES

    return POLICIES.get(name)


def probe_config(config: ExperimentConfig) -> ExperimentConfig:
    """The experiment as the search replays it: the reference policy (`reference_policy`),
    exact views, no checks."""
    policy, params = reference_policy(config)
    router = config.router.model_copy(update={"policy": policy, "params": params, "view": {}})
    sim = config.simulation.model_copy(update={"check": False, "drain_limit_s": None})
    return config.model_copy(update={"router": router, "simulation": sim})


def isolated_service_time(cost_model: Any, input_tokens: int, output_tokens: int, budget: int) -> float:
    """Seconds one request takes alone on an idle instance: chunked prefill, then its
    decode steps at batch size 1 (context taken at the end of the prompt)."""
    total = 0.0
    done = 0
    while done < input_tokens:
        q = min(budget, input_tokens - done)
        total += cost_model.step_time([(q, done)], 0, 0)
        done += q
    if output_tokens > 1:
        total += (output_tokens - 1) * cost_model.step_time((), 1, input_tokens + 1)
    return total


def idle_arrivals(trace: Trace, service: dict[tuple[int, int], float]) -> np.ndarray:
    """Arrival times on an idle cluster: open-loop rows at their timestamps, a closed-loop
    step `delay_s` after its predecessor would finish if served alone."""
    after = trace.column("after_id")
    if not (after >= 0).any():
        return trace.arrival_s
    delay = trace.column("delay_s")
    arrive = trace.arrival_s.copy()
    inputs, outputs = trace.input_tokens, trace.output_tokens
    for row in np.flatnonzero(after >= 0).tolist():
        parent = int(after[row])
        done = arrive[parent] + service[(int(inputs[parent]), int(outputs[parent]))]
        arrive[row] = done + delay[row]
    return arrive


def is_sustainable(
    trace: Trace, config: ExperimentConfig, search: CapacitySearch
) -> tuple[bool, str]:
    from lmsim.profile import kv_bytes_per_token
    from lmsim.study.compose import build_simulation

    span = float(trace.arrival_s[-1] - trace.arrival_s[0])
    pools = _pool_models(config)
    transfer = config.cluster.transfer if config.cluster.is_disaggregated else None
    bytes_per_token = max((kv_bytes_per_token(m) or 0.0) for m, _ in pools)

    def alone(i: int, o: int) -> float:
        # the slowest pool serving it all, plus a whole-prompt transfer when disaggregated:
        # a bound for the drain deadline, not a prediction
        t = max(isolated_service_time(m, i, o, budget) for m, budget in pools)
        if transfer is not None:
            t += transfer.latency_s + i * bytes_per_token / transfer.bandwidth_bytes_s
        return t

    service = {key: alone(*key) for key in {(int(i), int(o)) for i, o in zip(trace.input_tokens, trace.output_tokens)}}
    drain = search.drain_factor * max(service.values()) + search.drain_slack_s
    cfg = probe_config(config)
    cfg = cfg.model_copy(update={"simulation": cfg.simulation.model_copy(update={"drain_limit_s": drain})})
    # Lateness is judged against the last arrival the trace would have on an idle cluster:
    # in a closed-loop trace an overloaded cluster also delays the arrivals themselves, so
    # "after the last arrival" measured in the run would move with the overload it is meant
    # to detect. Whatever is unfinished at the deadline fails the probe, so the run stops.
    deadline = float(idle_arrivals(trace, service).max()) + drain
    results = build_simulation(cfg, trace).run(stop_at_s=deadline)
    req = results.requests
    finished = req["finished_at"].to_numpy()
    late = int((np.isnan(finished) | (finished > deadline)).sum())
    if late:
        return False, f"{late} requests not finished {drain:.1f}s after the nominal last arrival"
    t0 = float(trace.arrival_s[0])
    pos = (req["arrived_at"].to_numpy() - t0) / span if span > 0 else np.zeros(len(req))
    ttft = req["ttft_s"].to_numpy()
    second = ttft[(pos >= 0.25) & (pos < 0.5)]
    last = ttft[pos >= 0.75]
    if len(second) and len(last):
        q2, q4 = float(np.mean(second)), float(np.mean(last))
        if q4 > search.growth_factor * q2 + search.growth_slack_s:
            return False, f"TTFT grows: {q2:.2f}s in the 2nd quarter, {q4:.2f}s in the last"
    return True, "ok"


def _pool_models(config: ExperimentConfig) -> list[tuple[Any, int]]:
    """(cost model bound to the pool's KV size, batch budget) of every pool."""
    from lmsim.profile import bind_kv_capacity, load_cost_model

    out = []
    for pool in config.cluster.pool_specs():
        engine = pool.engine
        model = load_cost_model(engine["profile"])
        blocks = engine["num_gpu_blocks"] or model.num_kv_blocks(config.cluster.block_size, engine["gpu_memory_utilization"])
        if blocks:
            model = bind_kv_capacity(model, blocks * config.cluster.block_size)
        out.append((model, engine["max_num_batched_tokens"]))
    return out


def trace_identity(trace: Trace) -> dict[str, Any]:
    """Identity of a trace known only by its content (library callers that pass a Trace):
    a digest of its columns. Prefer a workload identity (`study.experiment.workload_identity`),
    which does not depend on how the numbers were computed."""
    digest = hashlib.sha256()
    for array in (trace.arrival_s, trace.input_tokens, trace.output_tokens, trace.hash_offsets, trace.hash_values,
                  trace.column("after_id"), trace.column("delay_s")):
        # ids as int64 whether or not the trace is compact (Trace.compact): same digest
        digest.update(np.ascontiguousarray(array, dtype=np.float64 if array.dtype.kind == "f" else np.int64).tobytes())
    digest.update(str(trace.block_size).encode())
    return {"trace_sha256": digest.hexdigest()}


_KEYED_WHEN_CHANGED = {
    "cache_generated_blocks": True,
    # the synchronous engine's settings (vLLM 0.11, the default), added after shipping
    "async_scheduling": False,
    "free_queue_order": "release",
    "waive_long_prefill_when_alone": False,
    "kv_connector_poll": "step",  # issue 34
}


def key_payload(
    workload: dict[str, Any], config: ExperimentConfig, search: CapacitySearch
) -> dict[str, Any]:
    """Everything a capacity depends on, as plain data (stored beside bundled capacities)."""
    from lmsim.profile import profile_identity

    cluster = {k: v for k, v in config.cluster.model_dump(mode="json").items() if v is not None}
    # The engine enters as its resolved settings, so naming the default release or leaving it
    # unset gives one key; what a preset does is engine code, which the key does not cover.
    cluster.pop("engine", None)
    cluster.update(dataclasses.asdict(config.cluster.engine_settings()))
    for pool in cluster.get("pools") or ():
        for name in ("engine", *ENGINE_SETTING_FIELDS[1:]):  # settings added after pools shipped
            if pool.get(name) is None:
                pool.pop(name, None)
    cluster.pop("max_waiting", None)  # the probe replays without a queue cap
    cluster.pop("profile", None)
    # Fields added after capacities were shipped count only when moved off their default,
    # so the keys stored with the shipped capacities stay valid.
    for name, default in _KEYED_WHEN_CHANGED.items():
        if cluster.get(name) == default:
            del cluster[name]
    return {
        "workload": workload,
        "cluster": cluster,
        "profile": profile_identity(config.cluster.profile),
        "search": dict(search.__dict__),
        "criterion": CRITERION_VERSION,
        # the policy whose sustainable rate "capacity" means (capacity.policy; vllm's JSQ
        # by default, as the study); its params only when set, so default keys stay valid
        "policy": reference_policy(config)[0],
        **({"policy_params": reference_policy(config)[1]} if reference_policy(config)[1] else {}),
    }


def cache_key(
    workload: dict[str, Any], config: ExperimentConfig, search: CapacitySearch
) -> str:
    payload = key_payload(workload, config, search)
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:32]


def _read_cache(path: Path | None = None) -> dict[str, Any]:
    path = path or cache_path()
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _write_cache(key: str, value: dict[str, Any], path: Path | None = None) -> None:
    path = path or cache_path()
    cache = _read_cache(path)
    cache[key] = value
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(cache, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


# Capacities a sweep's own process resolved and sent with its points (`remember_capacities`),
# so a worker on another machine, whose cache lacks them, does not search them again.
_sent: dict[str, Capacity] = {}


def remember_capacities(found: dict[str, Capacity]) -> None:
    _sent.update(found)


def lookup_capacity(key: str) -> Capacity | None:
    """What the sweep sent, then the user cache (a local re-measurement wins), then the
    shipped capacities."""
    if key in _sent:
        return _sent[key]
    for path, source in ((None, "cached"), (BUNDLED_PATH, "shipped")):
        entry = (_read_cache() if path is None else _read_cache(path)).get(key)
        if entry is not None:
            return Capacity(float(entry["rate"]), source, key, [Probe(**p) for p in entry.get("probes", [])])
    return None


def resolve_capacity(
    trace: Trace,
    config: ExperimentConfig,
    search: CapacitySearch | None = None,
    *,
    workload: dict[str, Any] | None = None,
    use_cache: bool = True,
    allow_search: bool = True,
    log: Callable[[str], None] | None = None,
) -> Capacity:
    """The capacity of `trace` on `config`'s cluster: looked up, else searched (announced
    through `log`, one line per probe), else `missing` when `allow_search` is False."""
    search = search or CapacitySearch()
    probe = trace.head(search.probe_requests)
    if len(probe) < 8:
        raise ConfigError("workload: capacity search needs at least 8 requests")
    key = cache_key(workload if workload is not None else trace_identity(probe), config, search)
    if use_cache:
        found = lookup_capacity(key)
        if found is not None:
            return found
    if not allow_search:
        return Capacity(None, "missing", key)
    if log is not None:
        log(f"capacity: none shipped or cached for this workload and cluster; searching "
            f"(up to {search.max_probes} probes of {len(probe)} requests under {describe_reference(config)})")
    base = mean_rate(probe)
    probes: list[Probe] = []

    def test(rate: float) -> bool:
        started = time.perf_counter()
        ok, reason = is_sustainable(scale_to_rate(probe, rate), config, search)
        probes.append(Probe(rate, ok, reason))
        if log is not None:
            log(f"capacity: probe {len(probes)} of at most {search.max_probes}: {rate:.4g} req/s "
                f"{'sustainable' if ok else 'NOT sustainable'} ({reason}; {time.perf_counter() - started:.0f}s)")
        return ok

    lo, hi = None, None
    rate = base
    while len(probes) < search.max_probes and (lo is None or hi is None):
        if test(rate):
            lo = rate
            rate *= 2
        else:
            hi = rate
            rate /= 2
    if lo is None or hi is None:
        raise ConfigError("workload: capacity search did not bracket the capacity")
    while hi / lo - 1 > search.rel_tol and len(probes) < search.max_probes:
        mid = (lo * hi) ** 0.5
        if test(mid):
            lo = mid
        else:
            hi = mid
    if use_cache:
        _write_cache(key, {"rate": lo, "probes": [p.__dict__ for p in probes]})
    if log is not None:
        log(f"capacity: {lo:.4g} req/s after {len(probes)} probes" + (f" (cached in {cache_path()})" if use_cache else ""))
    return Capacity(lo, "searched", key, probes)


def find_capacity(
    trace: Trace,
    config: ExperimentConfig,
    search: CapacitySearch | None = None,
    *,
    use_cache: bool = True,
    log: Any = None,
    workload: dict[str, Any] | None = None,
) -> tuple[float, list[Probe]]:
    """Maximum sustainable mean arrival rate (req/s) of `trace` on `config`'s cluster."""
    found = resolve_capacity(
        trace, config, search, workload=workload, use_cache=use_cache, log=log
    )
    assert found.rate is not None
    return found.rate, found.probes
