"""The routable subset (FLEET_DESIGN.md, "Routable subset"): a router's view may list only
some of the allocated instances; `choose` answers a position in that list and every policy
keys its own per-instance state by `InstanceView.instance_id`.

The check, for every registered policy: a 5-instance run whose router never lists one
instance routes the same trace exactly as a 4-instance run of the same seed, once the ids are
renumbered (ids above the hidden one move down by one). The unlisted instance never gets a
request, so it stays idle and the other four evolve as the four of the smaller cluster do;
a policy that keys state by position instead books a request routed to id 3 on position 3
(id 4) and scores the next request with the wrong instance's counts, which moves its
choices. The policy draws the same random numbers in both runs: it sees four instances in
both, so it draws per listed instance.

Disaggregated policies: 2 prefill + 3 decode with a decode instance hidden, and 3 prefill +
2 decode with a prefill instance hidden, against 2 + 2; the side policies see role-local
ids (`lmsim.policies.disagg.PoolView`).

Then: every policy answers a position among the listed instances while the listed set
changes (hand-built views with ids up to 10, and engine runs where instances leave the list
and come back), and two hand-computed cases (round robin continuing by id, Preble not
exploiting a GPU that is not listed).
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd
import pytest

from fakes import FakeCluster, FakeContext, FakeInstance, hashes, make_request
from lmsim.config import validate
from lmsim.policies import POLICIES
from lmsim.study.compose import build_simulation
from lmsim.study.experiment import load_workload_trace
from lmsim.workload.generators import generate

HIDDEN = 2  # the instance the 5-instance run never lists

WORKLOAD = {"generator": {"name": "chatbot", "params": {"duration_s": 12, "rate": 14, "max_output_tokens": 200}},
            "rate": 14}
PROFILE = "h20/qwen3-30b-a3b"
# small KV pools so that caches evict and prefix hits differ between instances
ENGINE = {"num_gpu_blocks": 3000}

_HOTSPOT = {"min_window_requests": 5, "top_k": 4, "window_s": 4.0, "refresh_s": 0.5, "log_interval_s": 2.0}
_EPP_ACTIVE_COMPLETE = {
    "plugins": [{"type": "active-request-scorer", "parameters": {"requestTimeout": "5s"}},
                {"type": "queue-scorer"}, {"type": "load-aware-scorer"},
                {"type": "prefix-cache-scorer", "parameters": {"lruCapacityPerServer": 400}},
                {"type": "max-score-picker"}, {"type": "single-profile-handler"}],
    "schedulingProfiles": [{"name": "default", "plugins": [
        {"pluginRef": "active-request-scorer", "weight": 1}, {"pluginRef": "queue-scorer", "weight": 1},
        {"pluginRef": "load-aware-scorer", "weight": 1}, {"pluginRef": "prefix-cache-scorer", "weight": 2},
        {"pluginRef": "max-score-picker"}]}],
}

# (policy, params): every registered colocated policy with its defaults, plus the variants
# that keep per-instance state differently
COLOCATED: list[tuple[str, dict[str, Any]]] = [
    ("round_robin", {}),
    ("random", {}),
    ("least_tokens", {}),
    ("vllm", {}),
    ("vllm", {"stale_view_s": 0.1, "w_wait": 4}),
    ("vllm", {"start_index": 2}),
    ("bailian", {}),
    ("dynamo", {}),
    ("dynamo", {"temperature": 0.5, "assume_kv_reuse": False}),
    ("llmd", {}),
    ("llmd", {"noise_rel": 0.12}),
    ("llmd_scorer", {}),
    ("llmd_epp", {}),
    ("llmd_epp", {"preset": "random"}),
    ("llmd_epp", {"preset": "load"}),
    ("llmd_epp", {"preset": "estimate-prefix-cache_load"}),
    ("llmd_epp", {"preset": "precise-prefix-cache_load"}),
    ("llmd_epp", {"preset": "precise-prefix-cache_load@v0.3"}),
    ("llmd_epp", {"preset": "default-scheduling"}),
    ("llmd_epp", _EPP_ACTIVE_COMPLETE),
    ("lmetric", {}),
    ("lmetric", {"bs_source": "inflight", "tie_break": "rotate"}),
    ("lmetric", {"p_token": "request", "bs_plus_one": False, "tie_break": "first"}),
    ("lmetric_hotspot", _HOTSPOT),
    ("lmetric_hotspot", {**_HOTSPOT, "bs_source": "inflight", "class_by": "class_id"}),
    ("sglang", {}),
    ("sglang", {"miss_policy": "min_load", "balance_abs_threshold": 2, "max_tree_size": 4096,
                "eviction_interval_secs": 1.0}),
    ("aibrix", {}),
    ("aibrix", {"imbalance_abs_count": 1}),
    ("polyserve", {}),
    ("polyserve", {"slo_classes": [{"ttft_s": 0.5, "tpot_s": 0.05}, {"ttft_s": 2.0, "tpot_s": 0.2}],
                   "default_slo_class": 1}),
    ("preble", {}),
    ("preble", {"rebalance_after_per_gpu": 2, "include_request_prefill": True, "window_s": 3.0}),
]

DISAGGREGATED: list[tuple[str, dict[str, Any]]] = [
    ("pd", {}),
    ("pd", {"prefill_policy": "lmetric", "decode_policy": "llmd"}),
    ("pd", {"prefill_policy": "preble", "prefill_params": {"rebalance_after_per_gpu": 2},
            "decode_policy": "dynamo"}),
    ("pd", {"prefill_policy": "sglang", "decode_policy": "aibrix", "decode_params": {"imbalance_abs_count": 1}}),
    ("pd", {"prefill_policy": "round_robin", "decode_policy": "lmetric",
            "decode_params": {"bs_source": "inflight"}, "decode_choice": "after_prefill"}),
    ("pd", {"prefill_policy": "llmd_epp", "prefill_params": {"preset": "estimate-prefix-cache_load"},
            "decode_policy": "llmd_epp", "decode_params": _EPP_ACTIVE_COMPLETE}),
    ("pd", {"prefill_policy": "polyserve", "decode_policy": "vllm", "decode_params": {"stale_view_s": 0.1}}),
    ("dynamo_disagg", {}),
    ("dynamo_disagg", {"conditional_disagg": True, "decode_choice": "at_arrival"}),
    ("llmd_pd", {}),
    ("llmd_pd", {"prefix_index": "router", "non_cached_tokens": 64}),
]


def _label(case: tuple[str, dict[str, Any]]) -> str:
    name, params = case
    parts = [k if isinstance(v, dict | list) else f"{k}={v}" for k, v in params.items()]
    return "-".join([name, *parts])


def _trace() -> Any:
    if not hasattr(_trace, "cached"):
        _trace.cached = load_workload_trace(_config({"num_instances": 4}, "round_robin", {}))  # type: ignore[attr-defined]
    return _trace.cached  # type: ignore[attr-defined]


def _config(cluster: dict[str, Any], policy: str, params: dict[str, Any], view: dict[str, Any] | None = None) -> Any:
    raw = {
        "name": "subset",
        "seed": 5,
        "workload": WORKLOAD,
        "cluster": {"profile": PROFILE, **ENGINE, **cluster},
        "router": {"policy": policy, "params": params, "view": view or {}},
        "simulation": {"check": True},
        "output": {"figures": False},
    }
    return validate(json.loads(json.dumps(raw)), where="test_policy_subset")


class OmittingView:
    """The engine's cluster view with one instance never listed: `instances` and the
    per-instance lookups skip it (what the `fleet` engine's router view will do)."""

    def __init__(self, base: Any, hidden: int) -> None:
        self._base = base
        self._keep = [k for k, v in enumerate(base.instances) if v.instance_id != hidden]
        self.instances = [base.instances[k] for k in self._keep]
        self.block_size = base.block_size
        self.has_kv_tiers = base.has_kv_tiers

    @property
    def now(self) -> float:
        return self._base.now

    def cached_prefix_tokens(self, request: Any) -> list[int]:
        full = self._base.cached_prefix_tokens(request)
        return [full[k] for k in self._keep]

    def cached_prefix_tokens_by_tier(self, request: Any) -> list[tuple[int, int, int]]:
        full = self._base.cached_prefix_tokens_by_tier(request)
        return [full[k] for k in self._keep]

    def catch_up_kv_tiers(self) -> None:
        self._base.catch_up_kv_tiers()


class PositionsToIds:
    """The router's side of the contract: `choose` answers a position in the listed
    instances; the engine dispatches to that instance's id. Hooks pass through (global ids)."""

    def __init__(self, policy: Any) -> None:
        self._policy = policy
        self.positions: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._policy, name)

    def choose(self, request: Any, cluster: Any) -> int:
        k = self._policy.choose(request, cluster)
        assert 0 <= k < len(cluster.instances), f"position {k} outside the {len(cluster.instances)} listed"
        self.positions.append(int(k))
        return cluster.instances[k].instance_id


def _renumbered(frame: pd.DataFrame, hidden: int) -> pd.DataFrame:
    out = frame.copy()
    for col in ("instance_id", "prefill_instance_id"):
        if col in out:
            ids = out[col]
            assert not (ids == hidden).any(), f"a request reached the unlisted instance {hidden}"
            out[col] = ids.where(~(ids > hidden), ids - 1)
    return out


def _compare(small: Any, large: Any, hidden: int) -> None:
    want = small.requests.reset_index(drop=True)
    got = _renumbered(large.requests, hidden).reset_index(drop=True)
    assert (want.status.astype(str) == "finished").mean() > 0.9
    pd.testing.assert_frame_equal(got, want, check_dtype=False)
    ev_want = small.router_events.reset_index(drop=True)
    ev_got = _renumbered(large.router_events, hidden).reset_index(drop=True)
    pd.testing.assert_frame_equal(ev_got, ev_want, check_dtype=False)


def _colocated_pair(
    name: str, params: dict[str, Any], trace: Any, view: dict[str, Any] | None = None
) -> tuple[Any, Any]:
    """(the 4-instance simulation, run; the 5-instance one with HIDDEN unlisted, run)."""
    small = build_simulation(_config({"num_instances": 4}, name, params, view), trace)
    small_results = small.run()
    sim = build_simulation(_config({"num_instances": 5}, name, params, view), trace)
    sim.router.cluster = OmittingView(sim.router.cluster, HIDDEN)
    shim = PositionsToIds(sim.router.policy)
    sim.router.policy = shim
    large = sim.run()
    assert len(shim.positions) == len(trace)
    _compare(small_results, large, HIDDEN)
    return small, sim


@pytest.mark.parametrize("case", COLOCATED, ids=_label)
def test_an_unlisted_instance_routes_like_a_cluster_without_it(case):
    _colocated_pair(*case, _trace())


VIEWS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("sglang", {}, {"kv_view": "approximate", "approx_ttl_s": None}),
    ("dynamo", {}, {"kv_view": "approximate", "approx_ttl_s": 5.0}),
    ("dynamo", {}, {"kv_view": "events", "kv_event_delay_s": 0.05}),
    ("llmd_scorer", {}, {"kv_view": "events", "kv_event_delay_s": 0.05, "load_view": "scraped"}),
    ("aibrix", {}, {"load_view": "scraped", "scrape_interval_s": 0.2}),
    ("lmetric", {}, {"metrics_path": "llm-d"}),
    ("llmd", {}, {"load_view": "scraped", "scrape_interval_s": 0.1}),
    ("llmd_epp", {"preset": "precise-prefix-cache_load"}, {"kv_view": "events", "metrics_path": "llm-d"}),
]


@pytest.mark.parametrize("case", VIEWS, ids=lambda c: f"{c[0]}-{'-'.join(f'{k}={v}' for k, v in c[2].items())}")
def test_an_unlisted_instance_routes_alike_through_the_router_view(case):
    """The router's view of KV (approximate index, KV events) and load (scraped) in front
    of the policy answers per listed instance too (`lmsim.engine.views.ViewAdapter`)."""
    name, params, view = case
    _colocated_pair(name, params, _trace(), view)


def test_the_hotspot_detector_filters_alike_with_an_unlisted_instance():
    """A burst of one shared prefix (the `hotspot` generator) that the detector alarms on,
    so the filtered picks over M-bar are compared too, not only plain LMetric."""
    trace = generate("hotspot", {"duration_s": 60, "burst_start_min": 0.25, "burst_duration_s": 30, "rate": 3.0,
                                 "burst_rate": 12.0, "max_output_tokens": 150}, seed=1)
    params = {"window_s": 10.0, "min_window_requests": 5, "log_interval_s": 5.0, "p_token": "request"}
    small, large = _colocated_pair("lmetric_hotspot", params, trace)
    assert small.policy.filtered_decisions > 20  # 52 on this trace
    assert large.policy.filtered_decisions == small.policy.filtered_decisions


def _pd(prefill: int, decode: int, name: str, params: dict[str, Any]) -> Any:
    pools = [{"name": "prefill", "role": "prefill", "num_instances": prefill},
             {"name": "decode", "role": "decode", "num_instances": decode}]
    return _config({"pools": pools}, name, params)


@pytest.mark.parametrize("role", ["decode", "prefill"])
@pytest.mark.parametrize("case", DISAGGREGATED, ids=_label)
def test_an_unlisted_instance_of_a_role_routes_like_a_cluster_without_it(case, role):
    name, params = case
    trace = _trace()
    small = build_simulation(_pd(2, 2, name, params), trace).run()
    # 2P+3D hides the middle decode instance (id 3); 3P+2D the middle prefill one (id 1)
    shape, hidden = ((2, 3), 3) if role == "decode" else ((3, 2), 1)
    sim = build_simulation(_pd(*shape, name, params), trace)
    sim.router.cluster = OmittingView(sim.router.cluster, hidden)
    large = sim.run()
    _compare(small, large, hidden)


# ---------------------------------------------------------------- positions, not ids
# listed out of 11 allocated, changing every 10 decisions (instances leave and come back)
SUBSETS = [[1, 4, 6, 9], [0, 4, 9], [1, 2, 3, 6, 9, 10]]


def _sparse_cluster(ctx: FakeContext, step: int) -> FakeCluster:
    insts = []
    for k, iid in enumerate(SUBSETS[(step // 10) % len(SUBSETS)]):
        v = FakeInstance(iid, num_running=(step + k) % 3, num_waiting=(step * k) % 4,
                         total_tokens=100 * ((step + 2 * k) % 5), pending_prefill_tokens=32 * ((step + k) % 3),
                         kv_usage=0.1 * k)
        v.blocks = set(hashes("sys", 4 + k))
        insts.append(v)
    return FakeCluster(insts, ctx)


@pytest.mark.parametrize("case", COLOCATED, ids=_label)
def test_a_policy_answers_a_position_among_the_listed_instances(case):
    """Ids up to 10 are listed in 3 to 6 positions, the set changing as the run goes: a
    policy that answers an id, or keeps state sized by the listed count and indexes it by id,
    goes out of range or fails here. Prompts share 8 of their 10 blocks, so prefix policies
    exploit where they sent the prefix before (preble's allocations, the trees, the LRUs)."""
    name, params = case
    ctx = FakeContext(num_instances=11, seed=1)
    policy = POLICIES.create(name, json.loads(json.dumps(params)))
    policy.bind(ctx)
    for step in range(90):
        ctx.advance(step * 0.25)
        cluster = _sparse_cluster(ctx, step)
        req = make_request(160, hashes("sys", 8) + hashes(("u", step), 2), arrived_at=ctx.t,
                           class_id=step % 3, slo_class=step % 2)
        k = policy.choose(req, cluster)
        assert isinstance(k, int) and 0 <= k < len(cluster.instances), k
        policy.on_routed(req, cluster.instances[k].instance_id)
        if step % 2:
            policy.on_finished(req)


def test_round_robin_continues_after_the_last_chosen_id():
    """Ids 0..3; it sends to 0 and 1, then id 1 leaves (listed 0, 2, 3): the next is id 2
    (position 1), not position 2 (id 3, which would skip id 2); with 1 back (0..3) the next
    is id 3, then it wraps to 0."""
    ctx = FakeContext(num_instances=4)
    policy = POLICIES.create("round_robin", {})
    policy.bind(ctx)
    full = FakeCluster([FakeInstance(i) for i in range(4)], ctx)
    without_1 = FakeCluster([FakeInstance(i) for i in (0, 2, 3)], ctx)
    picks = [policy.choose(make_request(32), c) for c in (full, full, without_1, full, full)]
    assert picks == [0, 1, 1, 3, 0]


def test_preble_does_not_exploit_an_allocation_on_an_unlisted_gpu():
    """A prefix routed while only GPU 2 was listed is allocated to GPU 2. When GPUs 0 and 1
    are listed instead, a request with that prefix (8 of 10 blocks cached: exploit) finds
    no listed GPU holding it and explores: both cost 0, the lowest id, position 0."""
    ctx = FakeContext(num_instances=3)
    policy = POLICIES.create("preble", {})
    policy.bind(ctx)
    only_2 = FakeCluster([FakeInstance(2)], ctx)
    for k in range(2):
        req = make_request(160, hashes("sys", 8) + hashes(("a", k), 2))
        assert policy.choose(req, only_2) == 0
        policy.on_routed(req, 2)
    req = make_request(160, hashes("sys", 8) + hashes("b", 2))
    assert policy.choose(req, FakeCluster([FakeInstance(0), FakeInstance(1)], ctx)) == 0


def test_a_pool_view_lists_the_roles_routable_instances_under_role_local_ids():
    """Decode ids 2..5 are role-local 0..3; the cluster lists ids 0, 2, 3, 5 (1 and 4 are not
    routable). The decode side sees positions 0, 1, 2 = local ids 0, 1, 3 (global 2, 3, 5),
    cluster positions 1, 2, 3, so its prefix hits are the cluster's entries 1..3."""
    from lmsim.policies.disagg import PoolView

    insts = [FakeInstance(i, num_waiting=10 * i) for i in (0, 2, 3, 5)]
    cluster = FakeCluster(insts)
    cluster.cached_override = [0, 16, 32, 48]
    local = {2: 0, 3: 1, 4: 2, 5: 3}
    wrapped: dict = {}
    view = PoolView(cluster, local, wrapped)
    assert [v.instance_id for v in view.instances] == [0, 1, 3]
    assert [v.num_waiting for v in view.instances] == [20, 30, 50]  # read through, live
    insts[3].num_waiting = 7
    assert view.instances[2].num_waiting == 7
    assert view.instances[2].pool == "default" and view.instances[2].max_num_seqs == 256
    assert view.cached_prefix_tokens(make_request(64)) == [16, 32, 48]
    again = PoolView(cluster, local, wrapped)
    assert all(a is b for a, b in zip(again.instances, view.instances))  # kept between decisions


# ---------------------------------------------------------------- a changing routable set
class ChangingView:
    """The engine's view with the listed set changing over the run: `hidden(now)` is the id
    not listed at that time (None: all listed). Requests already on a hidden instance run on."""

    def __init__(self, base: Any, hidden: Any) -> None:
        self._base = base
        self._hidden = hidden
        self.block_size = base.block_size
        self.has_kv_tiers = base.has_kv_tiers

    @property
    def now(self) -> float:
        return self._base.now

    @property
    def instances(self) -> list[Any]:
        h = self._hidden(self._base.now)
        return [v for v in self._base.instances if v.instance_id != h]

    def cached_prefix_tokens(self, request: Any) -> list[int]:
        h = self._hidden(self._base.now)
        full = self._base.cached_prefix_tokens(request)
        return [c for v, c in zip(self._base.instances, full) if v.instance_id != h]

    def cached_prefix_tokens_by_tier(self, request: Any) -> list[tuple[int, int, int]]:
        h = self._hidden(self._base.now)
        full = self._base.cached_prefix_tokens_by_tier(request)
        return [c for v, c in zip(self._base.instances, full) if v.instance_id != h]


def _hidden_over_time(first: int, second: int) -> Any:
    """`first` unlisted for the first 4 s, all listed until 8 s, then `second`."""
    return lambda now: first if now < 4.0 else (None if now < 8.0 else second)


class ListedOnly:
    """Checks every answer against what the view listed when it was given."""

    def __init__(self, policy: Any, view: ChangingView) -> None:
        self._policy = policy
        self._view = view

    def __getattr__(self, name: str) -> Any:
        return getattr(self._policy, name)

    def _listed(self) -> set[int]:
        return {v.instance_id for v in self._view.instances}

    def choose(self, request: Any, cluster: Any) -> int:
        k = self._policy.choose(request, cluster)
        assert 0 <= k < len(cluster.instances), f"position {k} outside the {len(cluster.instances)} listed"
        chosen = cluster.instances[k].instance_id
        assert chosen in self._listed(), (chosen, self._listed())
        return chosen

    def choose_pair(self, request: Any, cluster: Any) -> tuple[int | None, int | None]:
        pair = self._policy.choose_pair(request, cluster)
        assert {i for i in pair if i is not None} <= self._listed(), (pair, self._listed())
        return pair

    def choose_decode(self, request: Any, cluster: Any) -> int:
        d = self._policy.choose_decode(request, cluster)
        assert d in self._listed(), (d, self._listed())
        return d


def _defaults(cases: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    seen: dict[str, dict[str, Any]] = {}
    for name, params in cases:
        seen.setdefault(name, params)
    return list(seen.items())


_LEAVING = [(name, params, None) for name, params in _defaults(COLOCATED) + DISAGGREGATED] + VIEWS


@pytest.mark.parametrize("case", _LEAVING, ids=lambda c: _label(c[:2]) + ("-view" if c[2] else ""))
def test_instances_leaving_and_coming_back_are_routed_around(case):
    """Instance 1 is unlisted for the first 4 s, every one until 8 s, then instance 3: no
    request is sent where the view did not list, and every request finishes (the engine's
    invariants checked throughout). With a router view too: its scraped proxies and its
    KV indexes follow the listed set."""
    name, params, view = case
    disaggregated = name in {n for n, _ in DISAGGREGATED}
    cfg = _pd(2, 3, name, params) if disaggregated else _config({"num_instances": 5}, name, params, view)
    sim = build_simulation(cfg, _trace())
    view = ChangingView(sim.router.cluster, _hidden_over_time(1, 3))
    sim.router.cluster = view
    sim.router.policy = ListedOnly(sim.router.policy, view)
    results = sim.run()
    assert (results.requests.status.astype(str) == "finished").all()
    req = results.requests
    if not disaggregated:  # (ListedOnly checks the pairs; a decode id may come after routed_at)
        assert not ((req.routed_at < 4.0) & (req.instance_id == 1)).any()
        assert not ((req.routed_at >= 8.0) & (req.instance_id == 3)).any()


def test_the_scraped_router_view_follows_the_listed_instances_between_scrapes():
    """Scraped every 1 s: at t=0 the view lists ids 0, 1, 2 (waiting 5, 6, 7), and then
    their live counts become 50, 60, 70. Instance 1 leaves at t=0.5: the router's view
    lists 0 and 2 at once, with the t=0 scrape's counts 5 and 7; the scrape at t=1 reads
    50 and 70. An approximate index answers for the listed ones only: a prompt sent to
    instance 2 hits 3 blocks = 48 tokens there, 0 on instance 0."""
    from lmsim.engine.views import ViewAdapter

    ctx = FakeContext(num_instances=3)
    adapter = ViewAdapter(load_view="scraped", scrape_interval_s=1.0, kv_view="approximate")
    adapter.bind(ctx)
    insts = [FakeInstance(i, num_waiting=5 + i) for i in range(3)]
    base = FakeCluster(insts, ctx)
    assert [v.num_waiting for v in adapter.wrap(base).instances] == [5, 6, 7]
    for v in insts:
        v.num_waiting *= 10
    ctx.advance(0.5)
    base.instances = [insts[0], insts[2]]
    view = adapter.wrap(base)
    assert [v.instance_id for v in view.instances] == [0, 2]
    assert [v.num_waiting for v in view.instances] == [5, 7]
    ctx.advance(1.0)
    assert [v.num_waiting for v in adapter.wrap(base).instances] == [50, 70]
    sent = make_request(64, hashes("p", 4))
    adapter.on_routed(sent, 2)
    again = make_request(64, hashes("p", 4))
    view = adapter.wrap(base)
    assert view.cached_prefix_tokens(again) == [0, 48]
    assert [v.cached_prefix_tokens(again) for v in view.instances] == [0, 48]
