"""Every invariant that `simulation.check` (`--check`) asserts really fires.

Each test corrupts the engine's state on purpose (a monkeypatched scheduler method, a
reordered timestamp, a leaked block) and asserts the exact message: it names the instance
and the request, the step that just ended and the simulated time.

Hand-checkable times on the linear profile (conftest): a step costs 10 ms + 1 ms per
prefill token + 0.1 ms per decode, so a lone 100-token prompt ends its prefill (step 0) at
t = 0.110 s and each decode step takes 10.1 ms.
"""

from __future__ import annotations

import re

import pytest

from conftest import LINEAR, make_config, make_trace
from lmsim.cli import main
from lmsim.config import SimulationConfig
from lmsim.engine.invariants import check_end
from lmsim.engine.metrics import FINISHED
from lmsim.engine.request import RequestState
from lmsim.engine.scheduler import InstanceScheduler
from lmsim.engine.simulation import Simulation
from lmsim.errors import InvariantError
from lmsim.profile.base import LinearCostModel
from lmsim.study.compose import build_simulation

HASHED = make_trace([0.0], [100], [10], [[1, 2, 3, 4, 5, 6]])


def build(trace, **sections) -> Simulation:
    return build_simulation(make_config(**sections), trace)


def fails_with(sim: Simulation, message: str) -> None:
    with pytest.raises(InvariantError) as info:
        sim.run()
    assert str(info.value) == message


def after_commit(monkeypatch, scheduler: InstanceScheduler, corrupt, *, at_call: int = 1) -> None:
    """Run `corrupt(scheduler, outcome)` right after the `at_call`-th commit of one
    scheduler, before the step-end invariants look at it."""
    real = scheduler.commit
    calls = {"n": 0}

    def commit(plan, now):
        outcome = real(plan, now)
        calls["n"] += 1
        if calls["n"] == at_call:
            corrupt(scheduler, outcome)
        return outcome

    monkeypatch.setattr(scheduler, "commit", commit)


def test_checking_is_off_by_default_and_on_in_the_test_factories():
    assert SimulationConfig().check is False
    assert make_config().simulation.check is True


# -- request conservation -------------------------------------------------------------------


def test_a_request_dropped_from_the_waiting_queue_is_reported_lost(monkeypatch):
    # max_num_seqs=1: request 0 runs alone (10 + 10 = 20 ms) while 1 and 2 wait.
    sim = build(make_trace([0, 0, 0], [10, 10, 10], [1, 1, 1]), cluster={"max_num_seqs": 1})
    after_commit(monkeypatch, sim.instances[0].scheduler, lambda s, _o: s.waiting.pop())
    fails_with(sim, "instance 0, step 0, t=0.020000s: request 2 arrived and is not done but is on no instance")


def test_a_request_queued_on_two_instances_is_reported_twice(monkeypatch):
    # Round robin: 0, 2, 4 go to instance 0 and 1, 3, 5 to instance 1. With one running slot
    # each, both first steps end at 0.020 s; instance 0 commits first and admits request 2,
    # so request 4 is waiting there when instance 1's step ends and gets a second copy.
    sim = build(
        make_trace([0] * 6, [10] * 6, [1] * 6),
        cluster={"num_instances": 2, "max_num_seqs": 1},
    )
    inst0 = sim.instances[0].scheduler
    after_commit(monkeypatch, sim.instances[1].scheduler, lambda s, _o: s.waiting.append(inst0.waiting[0]))
    fails_with(sim, "instance 1, step 0, t=0.020000s: request 4 listed twice (instances 0 and 1)")


def test_a_request_on_another_instance_than_it_was_routed_to(monkeypatch):
    def corrupt(s, _o):
        s.running[0].instance_id = 5

    sim = build(HASHED)
    after_commit(monkeypatch, sim.instances[0].scheduler, corrupt)
    fails_with(sim, "instance 0, step 0, t=0.110000s: request 0 routed to instance 5 but queued on 0")


def test_a_request_recorded_finished_while_still_running(monkeypatch):
    sim = build(HASHED)

    def corrupt(s, _o):
        sim.recorder.status[0] = FINISHED

    after_commit(monkeypatch, sim.instances[0].scheduler, corrupt)
    fails_with(sim, "instance 0, step 0, t=0.110000s: request 0 is finished but still on instance 0")


def test_a_live_counter_out_of_step_with_the_instances(monkeypatch):
    sim = build(HASHED)

    def corrupt(s, _o):
        sim.live += 1

    after_commit(monkeypatch, sim.instances[0].scheduler, corrupt)
    fails_with(sim, "instance 0, step 0, t=0.110000s: the live counter says 2 but 1 arrived requests are not done")


# -- KV block accounting --------------------------------------------------------------------


def test_a_leaked_block_breaks_used_plus_free_equals_total(monkeypatch):
    # 100 tokens fill 7 blocks; the patched allocation takes one more that nobody holds.
    real = InstanceScheduler._allocate_chunk

    def leaky(self, request, q, new_blocks):
        real(self, request, q, new_blocks)
        self.cache.allocate_anonymous_run(1)

    monkeypatch.setattr(InstanceScheduler, "_allocate_chunk", leaky)
    fails_with(build(HASHED), "instance 0, step 0, t=0.110000s: KV: used blocks 8 != blocks held by requests 7 - shared 0")


def test_a_negative_reference_count_is_reported(monkeypatch):
    sim = build(HASHED)

    def corrupt(s, _o):
        s.cache._extra[1] = -2  # reference count 1 + extra holders

    after_commit(monkeypatch, sim.instances[0].scheduler, corrupt)
    with pytest.raises(InvariantError) as info:
        sim.run()
    message = str(info.value)
    assert message.startswith("instance 0, step 0, t=0.110000s: KV: ")
    assert "block 1 has reference count -1" in message.split("; ")


def test_a_block_both_free_and_in_use_is_reported(monkeypatch):
    sim = build(HASHED)

    def corrupt(s, _o):
        s.cache._segments.append([1])  # hash 1 is held by request 0
        s.cache._num_free_entries += 1

    after_commit(monkeypatch, sim.instances[0].scheduler, corrupt)
    with pytest.raises(InvariantError) as info:
        sim.run()
    parts = str(info.value).removeprefix("instance 0, step 0, t=0.110000s: KV: ").split("; ")
    assert parts == [
        "used blocks 6 != blocks held by requests 7 - shared 0",
        "block 1 is both free and in use",
        "6 cache entries but 7 hashed blocks",
    ]


def test_a_waiting_request_holding_blocks_is_reported(monkeypatch):
    sim = build(make_trace([0, 0], [10, 10], [1, 1]), cluster={"max_num_seqs": 1})

    def corrupt(s, _o):
        s.waiting[0].block_keys = [-99]

    after_commit(monkeypatch, sim.instances[0].scheduler, corrupt)
    fails_with(sim, "instance 0, step 0, t=0.020000s: waiting request 1 holds blocks")


# -- timestamps -----------------------------------------------------------------------------


def test_first_token_before_first_scheduled_is_reported_at_the_first_token(monkeypatch):
    sim = build(HASHED)

    def corrupt(s, outcome):
        for request in outcome.first_tokens:
            request.first_token_at = -0.05

    after_commit(monkeypatch, sim.instances[0].scheduler, corrupt)
    fails_with(sim, "instance 0, step 0, t=0.110000s: request 0 first_token_at -0.050000s before first_scheduled_at 0.000000s")


def test_routed_before_arrival_is_reported(monkeypatch):
    sim = build(HASHED)
    real = sim.instances[0].submit

    def submit(request):
        request.routed_at = request.arrived_at - 1.0
        real(request)

    monkeypatch.setattr(sim.instances[0], "submit", submit)
    fails_with(sim, "instance 0, step 0, t=0.110000s: request 0 routed_at -1.000000s before arrived_at 0.000000s")


@pytest.mark.parametrize("fast_forward", [True, False])
def test_finished_before_first_token_names_the_step_that_just_ended(monkeypatch, fast_forward):
    # 3 outputs: first token at the end of step 0 (0.110 s), then decode steps 1 and 2
    # (10.1 ms each); it finishes at the end of step 2, 0.1302 s. Fast-forward plans steps
    # 1-2 as one run; the message still names step 2.
    sim = build(make_trace([0.0], [100], [3]), simulation={"fast_forward": fast_forward})

    def corrupt(s, outcome):
        for request in outcome.finished:
            request.finished_at = 0.1

    scheduler = sim.instances[0].scheduler
    after_commit(monkeypatch, scheduler, corrupt, at_call=2 if fast_forward else 3)
    fails_with(sim, "instance 0, step 2, t=0.130200s: request 0 finished_at 0.100000s before first_token_at 0.110000s")


def test_a_timestamp_in_the_future_is_reported(monkeypatch):
    sim = build(HASHED)

    def corrupt(s, outcome):
        outcome.first_tokens[0].first_token_at = 7.0

    after_commit(monkeypatch, sim.instances[0].scheduler, corrupt)
    fails_with(sim, "instance 0, step 0, t=0.110000s: request 0 first_token_at 7.000000s is in the future")


# -- step composition -----------------------------------------------------------------------


def test_a_step_over_the_token_budget_is_reported():
    # The scheduler is handed a larger budget than the experiment allows: it prefills all
    # 100 tokens in one step where the config allows 64.
    sim = build(HASHED, cluster={"max_num_batched_tokens": 64})
    sim.instances[0].scheduler.max_num_batched_tokens = 1000
    fails_with(sim, "instance 0, step 0, t=0.110000s: scheduled 100 tokens > budget 64")


def test_a_step_over_max_num_seqs_is_reported():
    # three 10-token prompts in one step: 10 + 30 = 40 ms
    sim = build(make_trace([0, 0, 0], [10, 10, 10], [2, 2, 2]), cluster={"max_num_seqs": 2})
    sim.instances[0].scheduler.max_num_seqs = 10
    fails_with(sim, "instance 0, step 0, t=0.040000s: scheduled 3 sequences > max_num_seqs 2")


def test_a_plan_whose_token_counter_disagrees_with_its_chunks(monkeypatch):
    real = InstanceScheduler.plan

    def plan(self, now):
        p = real(self, now)
        if p is not None:
            p.num_tokens -= 1
        return p

    monkeypatch.setattr(InstanceScheduler, "plan", plan)
    fails_with(build(HASHED), "instance 0, step 0, t=0.110000s: plan reports 99 tokens but its chunks and decodes add to 100")


def test_a_chunk_over_the_long_prefill_threshold_is_reported():
    # two requests, so the threshold applies (it is waived for a request alone)
    two = make_trace([0.0, 0.0], [100, 100], [10, 10], [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]])
    sim = build(two, cluster={"long_prefill_token_threshold": 32})
    sim.instances[0].scheduler.long_prefill_token_threshold = 0
    # one step of 10 + 200 ms
    fails_with(sim, "instance 0, step 0, t=0.210000s: request 0 got a prefill chunk of 100 tokens")


def test_ttft_below_the_idle_prefill_time_is_reported():
    # The engine is secretly priced at half the per-token cost: 10 + 50 = 60 ms, below the
    # 110 ms the experiment's own profile needs on an idle engine.
    sim = build(HASHED)
    sim.instances[0].scheduler.cost_model = LinearCostModel(step_base_s=0.010, per_prefill_token_s=0.0005)
    fails_with(sim, "instance 0, step 0, t=0.060000s: request 0 TTFT 0.060000s below its idle prefill time 0.110000s")


def test_the_idle_prefill_floor_counts_chunks_and_cached_tokens():
    # budget 64: 100 uncached tokens take two steps, (10 + 64) + (10 + 36) = 120 ms;
    # with per_context_token_s the second chunk also pays for its 64 tokens of context.
    from lmsim.engine.invariants import idle_prefill_time

    sim = build(HASHED, cluster={"max_num_batched_tokens": 64})
    assert idle_prefill_time(sim, 100, 0) == pytest.approx(0.120)
    assert idle_prefill_time(sim, 52, 48) == pytest.approx(0.062)
    sim = build(HASHED, cluster={"profile": {**LINEAR, "per_context_token_s": 1e-5}, "max_num_batched_tokens": 64})
    assert idle_prefill_time(sim, 100, 0) == pytest.approx(0.120 + 1e-5 * (64 + 100))


# -- disaggregated serving: the two legs of a request ------------------------------------------

# 1 prefill + 1 decode instance (tests/test_disagg.py): 160 tokens prefill in 170 ms, 160 MB
# move at 1 GB/s after 2 ms (162 ms), the last token takes 11 ms: first token at 0.343 s.
PD_PROFILE = {**LINEAR, "kv_bytes_per_token": 1e6}
PD_TRACE = make_trace([0.0], [160], [3], [list(range(1, 11))])


def build_pd(trace=PD_TRACE) -> Simulation:
    cluster = {"profile": PD_PROFILE, "pools": [
        {"name": "p", "role": "prefill", "num_instances": 1}, {"name": "d", "role": "decode", "num_instances": 1}],
        "kv_transfer": {"bandwidth_bytes_s": 1e9, "latency_s": 0.002}}
    return build(trace, cluster=cluster, router={"policy": "pd"})


def test_a_transfer_faster_than_the_link_breaks_the_disaggregated_ttft_floor():
    # The NICs secretly move 10 GB/s: 16 + 2 ms instead of 162; the floor is prefill 170 +
    # transfer 162 + last token 11 ms = 0.343 s.
    sim = build_pd()
    for channel in [*sim.disagg.egress.values(), *sim.disagg.ingress.values()]:
        channel.bandwidth_bytes_s = 1e10
    fails_with(sim, "instance 1, step 0, t=0.199000s: request 0 TTFT 0.199000s below its idle prefill time 0.343000s")


def test_a_prefill_instance_that_frees_kv_before_it_is_read_is_reported(monkeypatch):
    sim = build_pd()
    after_commit(monkeypatch, sim.instances[0].scheduler, lambda s, o: s.release_held(o.finished[0]))
    fails_with(sim, "instance 0, step 0, t=0.170000s: request 0 is past its prefill but instance 0 does not hold its KV")


def test_a_request_on_its_decode_instance_while_still_prefilling_is_reported_twice(monkeypatch):
    # Two requests: B's 320-token prefill (0.170-0.510 s after A's, two steps under a
    # 160-token budget) is still running when A's first token ends a step on the decode
    # instance; B queued there too is a request on two instances.
    trace = make_trace([0.0, 0.0], [160, 320], [3, 3], [list(range(1, 11)), list(range(21, 41))])
    sim = build_pd(trace)
    sim.instances[0].scheduler.max_num_batched_tokens = 160

    def corrupt(s, _o):
        client = sim.disagg.handoffs[1].client
        client.state = RequestState.WAITING
        s.waiting.append(client)

    after_commit(monkeypatch, sim.instances[1].scheduler, corrupt)
    fails_with(sim, "instance 1, step 0, t=0.343000s: request 1 listed twice (instances 0 and 1)")


def test_a_load_on_a_decode_instance_outside_any_transfer_is_reported(monkeypatch):
    # B (100 tokens, arrives at 0.2 s) ends its prefill at 0.310 s while A's KV is still
    # moving to the decode instance (0.170-0.332 s); A's handoff is then marked as waiting.
    from lmsim.engine.disagg import AWAITING

    trace = make_trace([0.0, 0.2], [160, 100], [3, 3], [list(range(1, 11)), list(range(21, 27))])
    sim = build_pd(trace)

    def corrupt(s, _o):
        sim.disagg.handoffs[0].state = AWAITING

    after_commit(monkeypatch, sim.instances[0].scheduler, corrupt, at_call=2)
    fails_with(sim, "instance 0, step 1, t=0.310000s: instance 1 loads request 0's KV outside a transfer")


# -- end of run -----------------------------------------------------------------------------


def test_check_end_reports_blocks_held_by_an_idle_instance():
    sim = build(HASHED)
    sim.run()
    sim.instances[0].cache.allocate_anonymous_run(2)
    with pytest.raises(InvariantError) as info:
        check_end(sim)
    # 10 steps: one prefill, nine decodes
    assert str(info.value) == f"instance 0, step 10, t={sim.env.now:.6f}s: idle at the end with 2 blocks still in use"


def test_check_end_reports_a_request_lost_before_the_run_stopped():
    sim = build(HASHED, simulation={"drain_limit_s": 0.05})
    sim.run()  # stopped at 0.05 s, mid-prefill: request 0 is still running
    sim.instances[0].scheduler.running.clear()
    with pytest.raises(InvariantError) as info:
        check_end(sim)
    assert str(info.value) == "step 0, t=0.050000s: request 0 arrived and is not done but is on no instance"


# -- the command line -----------------------------------------------------------------------


def _experiment(tmp_path, check: bool) -> str:
    HASHED.save(tmp_path / "trace.parquet")
    (tmp_path / "exp.yaml").write_text(
        "name: inv\n"
        "workload: {trace: trace.parquet}\n"
        "cluster:\n  num_instances: 1\n  num_gpu_blocks: 1000\n"
        f"  profile: {{kind: linear, step_base_s: 0.010, per_prefill_token_s: 0.001, per_decode_seq_s: 0.0001}}\n"
        "router: {policy: round_robin}\n"
        f"simulation: {{check: {str(check).lower()}}}\n"
    )
    return "exp.yaml"


def _leak(monkeypatch) -> None:
    real = InstanceScheduler._allocate_chunk

    def leaky(self, request, q, new_blocks):
        real(self, request, q, new_blocks)
        self.cache.allocate_anonymous_run(1)

    monkeypatch.setattr(InstanceScheduler, "_allocate_chunk", leaky)


def test_cli_check_flag_stops_the_run_with_one_line_and_exit_3(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    exp = _experiment(tmp_path, check=False)
    _leak(monkeypatch)
    code = main(["run", exp, "--check", "--out", "out", "--no-figure"])
    err = capsys.readouterr().err
    assert code == 3
    assert err.splitlines() == [
        "lmsim: invariant violated: instance 0, step 0, t=0.110000s: "
        "KV: used blocks 8 != blocks held by requests 7 - shared 0"
    ]
    assert not (tmp_path / "out").exists()


def test_cli_without_check_does_not_look(tmp_path, monkeypatch, capsys):
    # the same leak goes unnoticed when checking is off (the default): the run completes
    monkeypatch.chdir(tmp_path)
    exp = _experiment(tmp_path, check=False)
    _leak(monkeypatch)
    assert main(["run", exp, "--out", "out", "--no-figure"]) == 0
    assert re.search(r"1/1 finished", capsys.readouterr().out)


def test_cli_debug_reraises_the_invariant_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exp = _experiment(tmp_path, check=True)
    _leak(monkeypatch)
    with pytest.raises(InvariantError, match=r"^instance 0, step 0, t=0\.110000s: KV: "):
        main(["--debug", "run", exp, "--out", "out", "--no-figure"])
