"""Differential and invariant fuzzing of the engine (issue 39).

A scenario is a small random cluster and workload, a JSON-able dict drawn from one seed:

    {"seed", "category", "dimensions", "profile", "kv_bytes_per_token",
     "cluster", "router", "simulation", "rows", "stop_s"}

It is run three ways:

  A. fast-forward on, `simulation.check` on (the invariant checker after every step);
  B. fast-forward off, check off (one step at a time: the reference);
  C. fast-forward on, check off (the same config again: determinism, and the checker must
     not perturb the run).

Findings: an exception or invariant failure in any run; requests, instance samples or
router events that differ between B and C or between A and C (exactly); a summary value
that differs (within 1e-12 relative: busy time is summed per step in B and per run in C);
and a request that did not end as it must (every request finishes, is rejected with a
reason, never arrives behind a predecessor that did not finish, or is left unfinished only
by a `drain_limit_s` cut; anything unfinished at `stop_s`, far beyond serving every request
one at a time, is a livelock).

What is drawn is a registry of dimensions (`DIMENSIONS`): each adds one feature to a
scenario's draft (a mixed fleet, P/D disaggregation, KV tiers, asynchronous scheduling, a
small KV pool, closed-loop sessions, a drain-limit cut, instances started and drained by a
`schedule` autoscaler, crashes with retries). A category (`CATEGORIES`) names the
dimensions it combines; the seed picks the category (seed % number of categories) unless
one is asked for. A new engine feature is a new `@dimension` function and a category using
it. The fleet categories (`scaling`, `crashes`, `fleet`) also compare `fleet_events` and
accept a request that `failed` with its `end_reason`.

Step times on the dyadic profiles are binary fractions and arrivals fall on multiples of
2^-10 s, so arrivals, step ends, transfers and loads tie exactly: the orderings that
fast-forward must reproduce.

`tests/test_fuzz.py` runs a few hundred scenarios in CI, and the sentinels saved in
tests/fixtures/fuzz_sentinels/ (scenarios that exposed past defects); thousands on demand:

    LMSIM_FUZZ_SCENARIOS=5000 python -m pytest tests/test_fuzz.py -q
    python tests/engine_fuzz.py 5000 [--start S] [--category pd] [--save DIR]

The script prints each scenario with findings and can save it as JSON for `--replay`.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import signal
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
if __name__ == "__main__":  # run as a script: this checkout's lmsim and the test factories
    sys.path[:0] = [str(HERE.parent), str(HERE)]

from conftest import make_trace  # noqa: E402
from lmsim.config import validate  # noqa: E402
from lmsim.engine.results import Results  # noqa: E402
from lmsim.engine.simulation import Simulation  # noqa: E402
from lmsim.policies.disagg import colocated_policy_names  # noqa: E402
from lmsim.study.compose import build_simulation  # noqa: E402

BLOCK = 16
COLOCATED = sorted(colocated_policy_names())
TIER_AWARE = ("dynamo", "llmd_scorer", "lmetric")
# Policies that route a routable subset of the instances by position today (stateless per
# instance); the others join once every policy keys its state by instance id.
_DYADIC = {"kind": "linear", "step_base_s": 2**-7, "per_prefill_token_s": 2**-10,
           "per_decode_seq_s": 0.0, "per_context_token_s": 0.0}
# Symbolic profiles, resolved when a scenario is built (a saved scenario names no path).
PROFILES: dict[str, Any] = {
    "dyadic": _DYADIC,
    "dyadic_fast": {**_DYADIC, "step_base_s": 2**-8, "per_prefill_token_s": 2**-11},
    "dyadic_ctx": {**_DYADIC, "per_decode_seq_s": 2**-12, "per_context_token_s": 2**-20},
    "dyadic_host": {**_DYADIC, "host_step_s": 2**-9},
    "linear": {"kind": "linear", "step_base_s": 0.010, "per_prefill_token_s": 0.001,
               "per_decode_seq_s": 0.0001, "per_context_token_s": 1e-6},
    "linear_host": {"kind": "linear", "step_base_s": 0.010, "per_prefill_token_s": 0.001,
                    "per_decode_seq_s": 0.0001, "host_step_s": 0.004},
    "tiny": str(HERE / "fixtures" / "profiles" / "tiny"),
    "h20": "h20/qwen3-30b-a3b",
    "h100": "h100/qwen3-30b-a3b",
}
# Fields that measure the simulator rather than the simulated system (tests/golden.py).
UNCOMPARED_SUMMARY = {"wall_time_s", "router_us_per_decision", "requests_per_wall_s", "num_step_events"}


# -- drafting a scenario --------------------------------------------------------------------


@dataclass
class Draft:
    """A scenario while its dimensions shape it."""

    seed: int
    category: str
    rng: random.Random
    profile: str
    kv_bytes: int
    cluster: dict[str, Any]
    router: dict[str, Any] = field(default_factory=dict)
    simulation: dict[str, Any] = field(default_factory=dict)
    blocks: tuple[int, int] = (6, 48)  # num_gpu_blocks range
    closed_p: float = 0.15  # chance a request follows the one before (closed loop)
    outputs: tuple[int, ...] = (10, 60, 200, 600)
    tiers: bool = False
    shared_prefixes: bool = False  # families of requests reuse prefixes (tiers hit)
    sections: dict[str, Any] = field(default_factory=dict)  # fleet, autoscaler, faults

    @property
    def dyadic(self) -> bool:
        return self.profile.startswith("dyadic")


Dimension = Callable[[Draft], None]
DIMENSIONS: dict[str, Dimension] = {}


def dimension(name: str) -> Callable[[Dimension], Dimension]:
    def register(fn: Dimension) -> Dimension:
        DIMENSIONS[name] = fn
        return fn

    return register


# Each category's dimensions, applied in order; the topology (`single`, `mixed`, `pd`) comes
# before what is laid over it.
CATEGORIES: dict[str, tuple[str, ...]] = {
    "engine": ("single",),
    "mixed": ("mixed",),
    "pd": ("pd",),
    "tiers": ("tiers", "single"),
    "pd_tiers": ("tiers", "pd"),
    "mixed_tiers": ("tiers", "mixed"),
    "async_pd": ("async", "small_pool", "pd"),
    "preempt": ("small_pool", "single"),
    "closed": ("closed_loop", "single"),
    "cut": ("any_topology", "drain_cut"),
    "scaling": ("colocated", "scaling"),
    "crashes": ("colocated", "crashes"),
    "fleet": ("colocated", "closed_loop", "scaling", "crashes"),
    "pd_scaling": ("pd", "scaling"),
    "pd_crashes": ("pd", "crashes"),
    "frontend": ("any_topology", "closed_loop", "front_end"),
}


def _engine_fields(r: random.Random) -> dict[str, Any]:
    """An engine preset and, sometimes, explicit settings over it."""
    out: dict[str, Any] = {}
    preset = r.choice(["vllm-0.11", "vllm-0.33", None])
    if preset:
        out["engine"] = preset
    if r.random() < 0.25:
        out["async_scheduling"] = r.random() < 0.5
    if r.random() < 0.3:
        out["admission"] = r.choice(["first_chunk", "full_sequence", "whole_prompt_watermark"])
        if out["admission"] == "whole_prompt_watermark":
            out["watermark_blocks_fraction"] = r.choice([0.0, 0.01, 0.1, 0.25])
    if r.random() < 0.15:
        out["free_queue_order"] = r.choice(["release", "content_free_first"])
    if r.random() < 0.15:
        out["waive_long_prefill_when_alone"] = r.random() < 0.5
    return out


def _limits(d: Draft, keep: float) -> dict[str, Any]:
    r = d.rng
    drawn = {
        "num_gpu_blocks": r.randint(*d.blocks),
        "max_num_batched_tokens": r.choice([16, 32, 48, 128, 512, 8192]),
        "max_num_seqs": r.randint(1, 8),
        "long_prefill_token_threshold": r.choice([0, 0, 20, 64]),
    }
    return {k: v for k, v in drawn.items() if r.random() < keep}


def _view(r: random.Random, tiers: bool) -> dict[str, Any]:
    """The router's view of the cluster: exact, scraped load, KV events, approximate KV."""
    if r.random() < 0.55:
        return {}
    kind = r.choice(["scraped", "events", "approximate", "both"])
    out: dict[str, Any] = {}
    if kind in ("scraped", "both"):
        out.update(load_view="scraped", scrape_interval_s=r.choice([2**-6, 0.01, 0.05, 0.1]))
    if kind in ("events", "both"):
        out.update(kv_view="events", kv_event_delay_s=r.choice([0.0, 2**-8, 0.005, 0.02, 0.05]))
    if kind == "approximate" and not tiers:
        out["kv_view"] = "approximate"
    return out


def _colocated_router(d: Draft) -> dict[str, Any]:
    r = d.rng
    policy = r.choice(TIER_AWARE) if d.tiers and r.random() < 0.7 else r.choice(COLOCATED)
    params: dict[str, Any] = {}
    if policy == "dynamo" and r.random() < 0.4:
        params = {"host_cache_hit_weight": r.choice([0.0, 0.75, 1.0]),
                  "disk_cache_hit_weight": r.choice([0.0, 0.25, 1.0]),
                  "temperature": r.choice([0.0, 0.0, 0.5])}
    if policy == "llmd_scorer" and r.random() < 0.4:
        params = {"cpu_weight": r.choice([0.0, 0.8, 1.0]), "disk_weight": r.choice([0.0, 1.0])}
    return {"policy": policy, "params": params, "view": _view(r, d.tiers)}


def _bandwidth(d: Draft) -> float:
    """Bytes/s of a link or lane: 2^6 .. 2^16 tokens' KV per second (dyadic), else 100 .. 1e5."""
    r = d.rng
    if d.dyadic:
        return float(d.kv_bytes * 2 ** r.randint(6, 16))
    return float(d.kv_bytes * r.choice([100, 1e3, 1e4, 1e5]))


def _latency(d: Draft) -> float:
    r = d.rng
    return r.choice([0.0, 0.0, 2**-10, 2**-7]) if d.dyadic else r.choice([0.0, 0.0, 1e-4, 0.003])


@dimension("single")
def _single(d: Draft) -> None:
    """One pool of 1-3 instances."""
    d.cluster["num_instances"] = d.rng.randint(1, 3)
    d.cluster.update(_limits(d, keep=1.0))
    d.router = _colocated_router(d)


@dimension("mixed")
def _mixed(d: Draft) -> None:
    """A mixed fleet: two pools with different profiles, limits and engine settings."""
    r = d.rng
    other = r.choice(["dyadic_fast", "dyadic_ctx", "linear", "tiny", "h100", "dyadic_host"])
    pools = []
    for k, profile in enumerate((d.profile, other)):
        pool = {"name": f"m{k}", "num_instances": r.randint(1, 2), "profile": profile, **_limits(d, keep=0.7)}
        if r.random() < 0.5:
            pool.update(_engine_fields(r))
        pools.append(pool)
    d.cluster["pools"] = pools
    d.cluster.setdefault("num_gpu_blocks", r.randint(*d.blocks))
    d.router = _colocated_router(d)


@dimension("pd")
def _pd(d: Draft) -> None:
    """Prefill/decode disaggregation: a prefill and a decode pool, a KV link between them
    and one of the disaggregated policies."""
    r = d.rng
    pools = []
    for role in ("prefill", "decode"):
        pool: dict[str, Any] = {"name": role[0], "role": role, "num_instances": r.randint(1, 2), **_limits(d, keep=0.8)}
        if role == "decode" and r.random() < 0.6:  # a tight decode pool: backpressure
            pool.update(max_num_seqs=r.randint(1, 3), num_gpu_blocks=r.randint(d.blocks[0], 16))
        if r.random() < 0.25:
            pool.update(_engine_fields(r))
        if r.random() < 0.2:
            pool["profile"] = r.choice(["dyadic", "dyadic_fast", "linear", "tiny"])
        pools.append(pool)
    d.cluster["pools"] = pools
    d.cluster.setdefault("num_gpu_blocks", r.randint(*d.blocks))
    view = _view(r, d.tiers)
    family = r.choice(["pd", "pd", "dynamo_disagg", "llmd_pd"])
    decode_choices = ["at_arrival", "after_prefill"]
    if family == "pd":
        def side() -> str:
            return r.choice(TIER_AWARE) if d.tiers and r.random() < 0.5 else r.choice(COLOCATED)

        params: dict[str, Any] = {"prefill_policy": side(), "decode_policy": side()}
    elif family == "dynamo_disagg":
        params = {"conditional_disagg": r.random() < 0.5}
        if params["conditional_disagg"] and r.random() < 0.5:  # draws only when on, as before
            params.update(eff_isl_threshold=r.choice([16, 64, 2048]),
                          eff_isl_ratio_threshold=r.choice([0.3, 0.7, 1.0]))
    else:
        params = {"non_cached_tokens": r.choice([0, 16, 64, 256])} if r.random() < 0.5 else {}
        decode_choices = ["at_arrival"]
    if family != "llmd_pd":  # llm-d chooses both instances at arrival, always
        params["decode_choice"] = r.choice(decode_choices)
    d.router = {"policy": family, "params": params, "view": view}
    d.cluster["kv_transfer"] = {
        "bandwidth_bytes_s": _bandwidth(d), "latency_s": _latency(d),
        "sharing": r.choice(["fair", "fifo", "none"]),
        "tokens": r.choice(["destination_missing", "full_prompt"]),
    }
    if r.random() < 0.3:  # the old timing: landed KV usable at once, not at the next poll
        d.cluster["kv_connector_poll"] = "instant"


@dimension("tiers")
def _tiers(d: Draft) -> None:
    """Host memory (and sometimes a disk) below the GPU caches; requests reuse prefixes so
    the tiers are hit. Laid over the topology that follows (marks the draft only)."""
    d.tiers = True
    d.blocks = (6, 24)
    d.shared_prefixes = d.rng.random() < 0.6
    if d.rng.random() < 0.3:  # tier loads usable when they land, not at the next poll
        d.cluster["kv_connector_poll"] = "instant"
    if not d.dyadic and d.rng.random() < 0.5:  # loads that land exactly on step ends
        d.profile = d.cluster["profile"] = "dyadic"
        d.kv_bytes = 2 ** d.rng.randint(12, 20)


def _tier_config(d: Draft) -> dict[str, Any]:
    r = d.rng
    host: dict[str, Any] = {"capacity_blocks": r.choice([0, 1, 2, 4, 8, 16, 16, 32, 32, 64, 64, 256])}
    if r.random() < 0.7:
        host.update(read_bytes_s=_bandwidth(d), write_bytes_s=_bandwidth(d), latency_s=_latency(d))
    tiers: dict[str, Any] = {"host": host, "store": r.choice(["write_through", "on_eviction"]),
                             "load": r.choice(["before_admission", "in_step"])}
    if r.random() < 0.3:
        tiers["store_scope"] = r.choice(["all", "prompt"])
    if r.random() < 0.4:
        tiers["sharing"] = r.choice(["fifo", "fair", "none"])
    if r.random() < 0.5:
        if r.random() < 0.6:
            host["capacity_blocks"] = r.choice([1, 2, 4, 8])  # small: blocks fall through to disk
        disk: dict[str, Any] = {"capacity_blocks": r.choice([0, 2, 8, 32, 32, 128, 128])}
        if r.random() < 0.7:
            disk.update(read_bytes_s=_bandwidth(d), write_bytes_s=_bandwidth(d), latency_s=_latency(d))
        tiers["disk"] = disk
    if r.random() < 0.3:
        tiers["kv_bytes_per_token"] = d.kv_bytes
    return tiers


def _lay_tiers(d: Draft) -> None:
    """The tiers on the whole cluster, or on one pool (the other maybe with its own)."""
    r = d.rng
    pools = d.cluster.get("pools")
    if pools and r.random() < 0.4:
        pools[r.randrange(len(pools))]["kv_tiers"] = _tier_config(d)
        if r.random() < 0.5:
            d.cluster["kv_tiers"] = _tier_config(d)
    else:
        d.cluster["kv_tiers"] = _tier_config(d)


@dimension("async")
def _async(d: Draft) -> None:
    """Asynchronous scheduling everywhere (pools may still turn it off)."""
    d.cluster["async_scheduling"] = True


@dimension("small_pool")
def _small_pool(d: Draft) -> None:
    """A KV pool of 4-16 blocks and long outputs: preemption, eviction, recompute."""
    d.blocks = (4, 16)
    d.outputs = (30, 100, 300)


@dimension("closed_loop")
def _closed_loop(d: Draft) -> None:
    """Half the requests follow the one before once it finishes (sessions, think time)."""
    d.closed_p = 0.5


@dimension("front_end")
def _front_end(d: Draft) -> None:
    """The client-side front end (lmsim.engine.frontend): per-request delays before the
    router and after each token, and often the gateway's FIFO body path, slow enough that
    requests queue in it while instances step. Binary fractions, so its hand-offs tie with
    step ends on the dyadic profiles."""
    r = d.rng
    section: dict[str, Any] = {
        "request_s": r.choice([0.0, 2.0**-8, 2.0**-5]), "gateway_s": r.choice([0.0, 2.0**-7]),
        "tokenize_s_per_token": r.choice([0.0, 2.0**-14]), "stream_s": r.choice([0.0, 2.0**-9]),
    }
    if r.random() < 0.7:
        section["gateway_bytes_per_s"] = 2.0 ** r.randint(14, 18)
        section["body_bytes_per_token"] = 2.0 ** r.randint(0, 2)
    d.sections["frontend"] = section


@dimension("any_topology")
def _any_topology(d: Draft) -> None:
    DIMENSIONS[d.rng.choice(["single", "single", "mixed", "pd"])](d)


@dimension("colocated")
def _colocated(d: Draft) -> None:
    DIMENSIONS[d.rng.choice(["single", "single", "mixed"])](d)


def _pools_of(d: Draft) -> list[tuple[str, int]]:
    pools = d.cluster.get("pools")
    if pools:
        return [(p["name"], p["num_instances"]) for p in pools]
    return [("default", d.cluster["num_instances"])]


@dimension("scaling")
def _scaling(d: Draft) -> None:
    """A `schedule` autoscaler with random targets per pool (0 to 2 above the initial
    count): instances start (some warm up), are cancelled while starting, drain (some hand
    back what they hold after a timeout); a target of 0 rejects arrivals (no_instance)."""
    r = d.rng
    quantum = 2**-10 if d.dyadic else 0.001
    fleet = d.sections.setdefault("fleet", {})
    pools: dict[str, Any] = {}
    replicas: dict[str, Any] = {}
    for name, n in _pools_of(d):
        high = n + r.randint(0, 2)
        pool: dict[str, Any] = {"max_replicas": high, "min_replicas": r.randint(0, min(1, n)),
                                "startup_s": r.choice([0.0, 8 * quantum, 64 * quantum, 512 * quantum])}
        if r.random() < 0.3:
            pool["warmup_s"] = r.choice([quantum, 32 * quantum])
        pools[name] = pool
        times = sorted({r.randint(0, 2048) * quantum for _ in range(r.randint(1, 4))})
        replicas[name] = [[t, r.randint(0, high)] for t in times]
    fleet["pools"] = pools
    disaggregated = any(p.get("role", "both") != "both" for p in d.cluster.get("pools", []))
    if r.random() < 0.4 and not disaggregated:  # P/D: no hand-back yet (lmsim.engine.fleet)
        fleet["drain_timeout_s"] = r.choice([quantum, 16 * quantum, 256 * quantum])
    d.sections["autoscaler"] = {
        "name": "schedule", "interval_s": r.choice([16 * quantum, 128 * quantum, 256 * quantum]),
        "metrics_delay_s": r.choice([0.0, 0.0, 4 * quantum, 300 * quantum]), "params": {"replicas": replicas},
    }


@dimension("crashes")
def _crashes(d: Draft) -> None:
    """Instances crash (at given times, or at random with an MTBF), with their requests
    retried or failed, restarts or not, and a detection delay in which the router still
    sends to the dead instance."""
    r = d.rng
    quantum = 2**-10 if d.dyadic else 0.001
    fleet = d.sections.setdefault("fleet", {})
    fleet["detection_delay_s"] = r.choice([0.0, 4 * quantum, 128 * quantum])
    fleet["dead_view"] = r.choice(["frozen", "empty"])
    fleet.setdefault("startup_s", r.choice([0.0, 16 * quantum, 256 * quantum]))
    total = sum(fleet.get("pools", {}).get(name, {}).get("max_replicas", n) for name, n in _pools_of(d))
    faults: dict[str, Any] = {
        "crashes": [{"time_s": r.randint(0, 2048) * quantum, "instance": r.randrange(total)}
                    for _ in range(r.randint(1, 3))],
        "in_flight": r.choice(["retry", "retry", "fail"]),
        "retry_after_s": r.choice([0.0, quantum, 64 * quantum]),
        "max_retries": r.randint(0, 3),
    }
    if r.random() < 0.6:
        faults["restart_s"] = r.choice([0.0, 8 * quantum, 256 * quantum])
    if r.random() < 0.25:
        faults["mtbf_s"] = r.choice([0.5, 2.0])
        faults["seed"] = r.randint(0, 9)
        faults["restart_s"] = faults.get("restart_s", 32 * quantum)  # or every instance dies for good
    d.sections["faults"] = faults


@dimension("drain_cut")
def _drain_cut(d: Draft) -> None:
    """`drain_limit_s` cuts the run while requests are in flight."""
    d.simulation["drain_limit_s"] = d.rng.choice([2**-5, 0.05, 0.5, 5.0])


def _rows(d: Draft, pool_tokens: int) -> list[dict[str, Any]]:
    """The workload: arrivals on the clock's quantum (ties with step ends), prompts from
    families of shared prefixes, multi-turn continuations (a turn's prompt extends the turn
    before, named as its child or left to the engine to guess from the session), sessions,
    closed-loop successors, and rarely a prompt larger than the smallest pool (rejected)."""
    r = d.rng
    quantum = 2**-10 if d.dyadic else 0.001
    family_blocks = [r.randint(1, 10) for _ in range(r.randint(1, 3))]
    sessions = r.random() < 0.6
    next_session = 1
    rows: list[dict[str, Any]] = []
    names: list[list[int]] = []
    t = 0.0
    for i in range(r.randint(4, 16) if d.tiers else r.randint(2, 14)):
        t += r.choice([0, 0, 1, 3, 8, 20, 60, 300]) * quantum * r.choice([1, 8])
        family = r.randint(0 if d.shared_prefixes else -1, len(family_blocks) - 1)
        prev = rows[-1] if rows else None
        limit = min(pool_tokens, 300)
        if r.random() < 0.04:
            limit = pool_tokens + 64
        turn = prev is not None and r.random() < 0.3 and prev["input"] + prev["output"] < limit
        if turn:
            assert prev is not None
            prompt = r.randint(prev["input"] + prev["output"], limit)
        else:
            prompt = r.randint(1, limit)
            if family >= 0 and r.random() < (0.5 if d.shared_prefixes else 0.25):
                prompt = max(1, min(family_blocks[family] * BLOCK, limit))
        output = r.randint(1, max(1, min(pool_tokens - prompt + 1, r.choice(d.outputs))))
        ids: list[int] = []
        if turn:
            assert prev is not None
            kept = names[-1][: prev["input"] // BLOCK]
            ids = kept + [1_000_000 + 1000 * i + j for j in range(len(kept), -(-prompt // BLOCK))]
        elif r.random() < 0.85:
            ids = [1000 * (family + 1) + j if family >= 0 and j < family_blocks[family] else 1_000_000 + 1000 * i + j
                   for j in range(-(-prompt // BLOCK))]
        follows = i > 0 and r.random() < d.closed_p
        session = -1
        if sessions:
            if (turn or follows) and prev is not None and prev["session"] >= 0:
                session = prev["session"]
            else:
                session, next_session = next_session, next_session + 1
        parent = i - 1 if turn and not (sessions and r.random() < 0.3) else -1
        rows.append({"at": t, "input": prompt, "output": output, "ids": ids,
                     "after": i - 1 if follows else -1,
                     "delay": r.choice([0.0, 2**-6, 0.02, 0.15]) if follows else 0.0,
                     "parent": parent, "session": session})
        names.append(ids)
    return rows


def _stop_s(scenario: dict[str, Any]) -> float:
    """A simulated time far beyond serving every request one at a time, over the slowest
    link or lane at the largest KV size a profile here has: a run still going then is a
    livelock."""
    bandwidths, latencies = [1e10], [1e-4]

    def scan(node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if k in ("bandwidth_bytes_s", "read_bytes_s", "write_bytes_s"):
                    bandwidths.append(float(v))
                elif k == "latency_s":
                    latencies.append(float(v))
                else:
                    scan(v)
        elif isinstance(node, list):
            for v in node:
                scan(v)

    scan(scenario["cluster"])
    per_token = 4 * max(float(scenario["kv_bytes_per_token"]), 98304.0) / min(bandwidths)
    work = sum(0.05 + row["input"] * (0.004 + per_token) + 4 * max(latencies) + row["output"] * 0.06 + row["delay"]
               for row in scenario["rows"])
    last = max((row["at"] for row in scenario["rows"]), default=0.0)
    if "sections" in scenario:  # every request may run 1 + max_retries times, after restarts
        work *= 1 + scenario["sections"].get("faults", {}).get("max_retries", 0)
        last += 10.0
        front = scenario["sections"].get("frontend")
        if front is not None:  # every request through the front end, one body at a time
            work += sum(0.1 + row["input"] * (1e-3 + front.get("body_bytes_per_token", 4.0)
                                              / front.get("gateway_bytes_per_s", 1e12))
                        for row in scenario["rows"])
    return round(last + 20 * work + 60.0, 3)


def generate(seed: int, category: str | None = None) -> dict[str, Any]:
    """The scenario of `seed` (in `category`, else the seed's own)."""
    names = list(CATEGORIES)
    category = category or names[seed % len(names)]
    r = random.Random(f"{category}:{seed}")
    profile = r.choice(["dyadic", "dyadic", "dyadic_ctx", "dyadic_host", "linear", "linear_host", "tiny", "h20"])
    kv_bytes = 2 ** r.randint(12, 20) if profile.startswith("dyadic") else r.choice([1024, 65536, 1_000_000])
    cluster: dict[str, Any] = {"profile": profile, "enable_prefix_caching": r.random() < 0.85, **_engine_fields(r)}
    if r.random() < 0.1:
        cluster["max_model_len"] = r.randint(40, 400)
    if r.random() < 0.08:
        cluster["max_waiting"] = r.choice([1, 2, 4])
    if r.random() < 0.1:
        cluster["cache_generated_blocks"] = False
    d = Draft(seed, category, r, profile, kv_bytes, cluster,
              simulation={"sample_interval_s": r.choice([2**-5, 0.1, 1.0])})
    for name in CATEGORIES[category]:
        DIMENSIONS[name](d)
    if d.tiers:
        _lay_tiers(d)
    # what fits the smallest pool fits everywhere
    blocks = [cluster.get("num_gpu_blocks") or 48]
    blocks += [p.get("num_gpu_blocks", cluster.get("num_gpu_blocks", 48)) for p in cluster.get("pools", [])]
    scenario = {
        "seed": seed, "category": category, "dimensions": list(CATEGORIES[category]),
        "profile": d.profile, "kv_bytes_per_token": d.kv_bytes,
        "cluster": cluster, "router": d.router, "simulation": d.simulation,
        "rows": _rows(d, min(blocks) * BLOCK),
    }
    if d.sections:
        scenario["sections"] = d.sections
    scenario["stop_s"] = _stop_s(scenario)
    return scenario


# -- running and comparing ---------------------------------------------------------------------


def _resolve_profiles(node: Any, kv_bytes: int) -> Any:
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            if k == "profile" and isinstance(v, str) and v in PROFILES:
                spec = PROFILES[v]
                out[k] = {**spec, "kv_bytes_per_token": kv_bytes} if isinstance(spec, dict) else spec
            else:
                out[k] = _resolve_profiles(v, kv_bytes)
        return out
    if isinstance(node, list):
        return [_resolve_profiles(x, kv_bytes) for x in node]
    return node


def build(scenario: dict[str, Any], *, fast_forward: bool, check: bool) -> Simulation:
    raw = {
        "name": f"fuzz-{scenario['category']}-{scenario['seed']}",
        "workload": {"trace": "unused.parquet"},
        "cluster": _resolve_profiles(copy.deepcopy(scenario["cluster"]), scenario["kv_bytes_per_token"]),
        "router": copy.deepcopy(scenario["router"]),
        "simulation": {**scenario["simulation"], "check": check, "fast_forward": fast_forward},
        **copy.deepcopy(scenario.get("sections", {})),
    }
    rows = scenario["rows"]
    trace = make_trace(
        [x["at"] for x in rows], [x["input"] for x in rows], [x["output"] for x in rows], [x["ids"] for x in rows],
        block_size=BLOCK,
        after_id=np.array([x["after"] for x in rows], dtype=np.int64),
        delay_s=np.array([x["delay"] for x in rows], dtype=float),
        parent_id=np.array([x["parent"] for x in rows], dtype=np.int64),
        session_id=np.array([x["session"] for x in rows], dtype=np.int64),
    )
    return build_simulation(validate(raw, where=raw["name"]), trace)


class _WallTimeout(Exception):
    pass


def _run(scenario: dict[str, Any], fast_forward: bool, check: bool,
         timeout_s: float | None) -> tuple[Results | None, str | None]:
    """(results, None) or (None, what went wrong)."""
    alarm = timeout_s is not None and hasattr(signal, "setitimer")
    if alarm:
        def expire(*_: Any) -> None:
            raise _WallTimeout

        previous = signal.signal(signal.SIGALRM, expire)
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return build(scenario, fast_forward=fast_forward, check=check).run(stop_at_s=scenario["stop_s"]), None
    except _WallTimeout:
        return None, f"hang: no end after {timeout_s} s of wall time"
    except Exception as exc:  # any failure is a finding
        return None, f"{type(exc).__name__}: {exc}"
    finally:
        if alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


def _frame_difference(a: pd.DataFrame, b: pd.DataFrame) -> str:
    """'' when identical (values and dtypes), else the first difference."""
    if list(a.columns) != list(b.columns) or len(a) != len(b):
        return f"columns/rows {list(a.columns)} x {len(a)} vs {list(b.columns)} x {len(b)}"
    for column in a.columns:
        x, y = a[column], b[column]
        if x.equals(y):
            continue
        xs, ys = x.astype(object).tolist(), y.astype(object).tolist()
        for i, (u, v) in enumerate(zip(xs, ys)):
            if not (u == v or (pd.isna(u) and pd.isna(v))):
                return f"{column}[{i}]: {u!r} vs {v!r}"
        return f"{column}: dtypes {x.dtype} vs {y.dtype}"
    return ""


def _summary_difference(a: dict[str, Any], b: dict[str, Any]) -> str:
    for key in sorted(set(a) | set(b)):
        if key in UNCOMPARED_SUMMARY:
            continue
        x, y = a.get(key), b.get(key)
        if x == y:
            continue
        if isinstance(x, float) and isinstance(y, float) and (
            (np.isnan(x) and np.isnan(y)) or abs(x - y) <= 1e-12 * max(1.0, abs(x))
        ):
            continue
        return f"{key}: {x!r} vs {y!r}"
    return ""


def compare(a: Results, b: Results) -> str:
    """'' when two runs of one scenario agree, else the first difference."""
    for table in ("requests", "instances", "router_events"):
        diff = _frame_difference(getattr(a, table), getattr(b, table))
        if diff:
            return f"{table} {diff}"
    if (a.fleet_events is None) != (b.fleet_events is None):
        return "fleet_events in one run only"
    if a.fleet_events is not None:
        diff = _frame_difference(a.fleet_events, b.fleet_events)
        if diff:
            return f"fleet_events {diff}"
    diff = _summary_difference(a.summary, b.summary)
    return f"summary {diff}" if diff else ""


def ending_problem(scenario: dict[str, Any], results: Results) -> str:
    """'' when every request ended as it must (module docstring), else the first that did
    not."""
    requests = results.requests
    status = requests["status"].astype(str).tolist()
    reasons = requests["reject_reason"].astype(object).tolist()
    cut = "drain_limit_s" in scenario["simulation"]
    for i, st in enumerate(status):
        after = scenario["rows"][i]["after"]
        if st == "finished":
            continue
        if st == "rejected":
            if pd.isna(reasons[i]):
                return f"request {i} rejected without a reason"
            continue
        if st == "failed":
            if pd.isna(requests["end_reason"].iloc[i]):
                return f"request {i} failed without a reason"
            continue
        if st == "not_arrived" and (cut or (after >= 0 and status[after] != "finished")):
            continue
        if st == "unfinished" and cut and results.summary["sim_time_s"] < scenario["stop_s"]:
            continue
        return f"request {i} {st} at {results.summary['sim_time_s']:.6f} s (stop {scenario['stop_s']} s)"
    return ""


@dataclass
class Verdict:
    findings: list[tuple[str, str]]  # (kind, detail); empty when the scenario passes
    covered: set[str]  # the engine paths the run went through (`coverage`)


def evaluate(scenario: dict[str, Any], timeout_s: float | None = None) -> Verdict:
    """Run the scenario three ways (module docstring) and judge it."""
    findings: list[tuple[str, str]] = []
    checked, error = _run(scenario, True, True, timeout_s)
    if error:
        findings.append(("checked run", error))
    stepped, error = _run(scenario, False, False, timeout_s)
    if error:
        findings.append(("stepping run", error))
    fast, error = _run(scenario, True, False, timeout_s)
    if error:
        findings.append(("fast-forward run", error))
    if stepped is not None and fast is not None:
        diff = compare(stepped, fast)
        if diff:
            findings.append(("fast-forward differs from stepping", diff))
    if checked is not None and fast is not None:
        diff = compare(checked, fast)
        if diff:
            findings.append(("the checked run differs", diff))
    reference = fast or stepped or checked
    if reference is None:
        return Verdict(findings, set())
    problem = ending_problem(scenario, reference)
    if problem:
        findings.append(("did not end", problem))
    return Verdict(findings, coverage(reference))


def coverage(results: Results) -> set[str]:
    """The engine paths a run went through (to tell that the fuzzer reaches them)."""
    s = results.summary
    seen = {name for name, key in (("preemption", "num_preemptions"), ("eviction", "num_evictions"),
                                   ("rejection", "num_rejected"), ("tier load", "kv_num_loads"),
                                   ("kv transfer", "num_kv_transfers"), ("not arrived", "num_not_arrived"),
                                   ("prefilled on decode", "num_prefilled_on_decode"),
                                   ("unfinished", "num_unfinished"))
            if (s.get(key) or 0) > 0}
    if s.get("prefix_hit_ratio_disk"):
        seen.add("disk hit")
    routed = results.requests["routed_at"].to_numpy(dtype=float, na_value=np.nan)
    if (routed > results.requests["arrived_at"].to_numpy(dtype=float)).any():
        seen.add("front end")
    fleet = s.get("fleet")
    if fleet is not None:
        events = set(results.fleet_events["event"])
        seen |= {name for name, event in (("scale up", "start"), ("drain", "drain"), ("crash", "crash"),
                                          ("restart", "restart"), ("drain stop", "stop")) if event in events}
        seen |= {name for name, key in (("retry", "num_retries"), ("failed", "num_failed"),
                                        ("no instance", "num_rejected_no_instance")) if fleet.get(key)}
    return seen


# -- the command line ---------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Fuzz the engine: fast-forward vs stepping, invariants, endings.")
    parser.add_argument("scenarios", type=int, nargs="?", default=500, help="how many seeds (default 500)")
    parser.add_argument("--start", type=int, default=0, help="first seed (default 0)")
    parser.add_argument("--category", choices=list(CATEGORIES), help="only this category")
    parser.add_argument("--save", type=Path, help="write each failing scenario here as JSON")
    parser.add_argument("--replay", type=Path, nargs="*", default=[], help="run saved scenarios instead")
    parser.add_argument("--timeout", type=float, default=60.0, help="wall seconds per run before a hang is reported")
    args = parser.parse_args(argv)
    if args.replay:
        scenarios = [json.loads(p.read_text()) for p in args.replay]
    else:
        scenarios = [generate(seed, args.category) for seed in range(args.start, args.start + args.scenarios)]
    started = time.perf_counter()
    failing = 0
    for scenario in scenarios:
        findings = evaluate(scenario, args.timeout).findings
        if not findings:
            continue
        failing += 1
        print(f"seed {scenario['seed']} [{scenario['category']}]: " + "; ".join(f"{k}: {v[:300]}" for k, v in findings),
              flush=True)
        if args.save:
            args.save.mkdir(parents=True, exist_ok=True)
            path = args.save / f"{scenario['category']}_{scenario['seed']}.json"
            path.write_text(json.dumps({**scenario, "findings": findings}, indent=1))
    print(f"{len(scenarios)} scenarios, {failing} with findings, {time.perf_counter() - started:.0f} s")
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
