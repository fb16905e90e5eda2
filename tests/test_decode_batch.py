"""A decode batch of mixed KV lengths (issue 34 item 7, `lmsim.profile.decode_batch`): the
`longest` form prices each sequence's own KV plus the longest one's shortfall, never less
than the batch's most expensive member alone; the `mean` form stays runnable."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import make_config, make_trace
from lmsim.errors import ProfileError
from lmsim.profile import PROFILES_DIR
from lmsim.profile.decode_batch import LongestDecode
from lmsim.profile.tables import TableCostModel, load_table_profile, read_profile, validate_profile
from lmsim.study.compose import build_simulation

TINY = Path(__file__).parent / "fixtures" / "profiles" / "tiny"
SHIPPED = ["h20/qwen2-7b", "h20/qwen3-30b-a3b", "h100/qwen2-7b", "h100/qwen3-30b-a3b",
           "h200/qwen2-7b", "h200/qwen3-30b-a3b"]

# A decode table that is exactly "bulk + shortfall": da(B, C) = R*C + T*C/B, i.e. each of B
# equal sequences of L = C/B tokens read at R s/token, plus one sequence's length at T s/token.
R, T = 1e-8, 2e-8


@pytest.fixture(scope="module")
def bulk_tail() -> TableCostModel:
    data = read_profile(TINY)
    batches = np.array([1.0, 2.0, 4.0])
    contexts = np.array([0.0, 1e6])
    da = np.array([[R * c + T * c / b for c in contexts] for b in batches])
    return TableCostModel(dataclasses.replace(data, da_b=batches, da_c=contexts, da=da))


def test_hand_priced_per_sequence_sum(bulk_tail):
    """Lengths 120,000 + 60,000 + 60,000: C = 240,000, M = 120,000, so the table is read at
    batch C/M = 2, a grid row: 0.020 s/Mtok x 0.24 Mtok = 4.8 ms, which is the hand sum of each
    sequence's own KV at the bulk rate, R x (120,000 + 60,000 + 60,000) = 2.4 ms, plus the
    longest's shortfall, T x 120,000 = 2.4 ms. The batch's other costs (tiny profile): fixed
    1 ms + GEMMs tokens(3) 10 ms + seqs(3) = 2 ms + 2 ms x 2/99. The mean form reads batch 3,
    half way between rows 2 and 4: (0.020 + 0.015)/2 x 0.24 = 4.2 ms, a shortfall of 1.8 ms,
    as if the longest sequence had 90,000 tokens."""
    per_sequence = R * (120_000 + 60_000 + 60_000) + T * 120_000
    assert per_sequence == pytest.approx(0.0048, rel=1e-12)
    batch = 0.001 + 0.010 + (0.002 + 0.002 * 2 / 99)
    assert bulk_tail.step_time((), 3, 240_000, 120_000) == pytest.approx(batch + per_sequence, rel=1e-12)
    mean = bulk_tail.with_decode_batch("mean")
    assert mean.step_time((), 3, 240_000, 120_000) == pytest.approx(batch + 0.0042, rel=1e-12)
    assert mean.step_time((), 3, 240_000) == bulk_tail.step_time((), 3, 240_000)


def test_hand_priced_long_and_short(bulk_tail):
    """120,000 + 100 tokens. Alone the long decode costs 1 + 10 + 2 ms + da(1, 120,000) =
    0.030 s/Mtok x 0.12 Mtok = 3.6 ms: 16.6 ms. With the short one, C = 120,100 and the batch
    is read at C/M = 1 + 1/1,200 (w = 1/1,200 of the way from row 1 to row 2):
    0.1201 x (0.030 (1 - w) + 0.020 w) = 3.602 ms, = R x 120,100 (each sequence's own KV) +
    T x 120,100 x (1 - w/2) (the longest's shortfall, 120,050 tokens' worth where the
    bilinear batch axis bends 1/B), and the step, with seqs(2) = 2 ms + 2 ms/99, 16.62 ms, at
    least the long decode alone. The mean form reads (2, 120,100): 0.020 x 0.1201 = 2.402 ms,
    a step of 15.42 ms, 7% below the long decode alone."""
    w = 100 / 120_000
    alone = 0.001 + 0.010 + 0.002 + 0.0036
    assert bulk_tail.step_time((), 1, 120_000, 120_000) == pytest.approx(alone, rel=1e-12)
    attention = R * 120_100 + T * 120_100 * (1 - w / 2)
    assert attention == pytest.approx(0.1201 * (0.030 * (1 - w) + 0.020 * w), rel=1e-12)
    pair = 0.001 + 0.010 + (0.002 + 0.002 / 99)
    assert bulk_tail.step_time((), 2, 120_100, 120_000) == pytest.approx(pair + attention, rel=1e-12)
    assert bulk_tail.step_time((), 2, 120_100, 120_000) >= alone
    mean = bulk_tail.with_decode_batch("mean").step_time((), 2, 120_100, 120_000)
    assert mean == pytest.approx(pair + 0.020 * 0.1201, rel=1e-12) and mean < alone


def test_long_decode_beside_a_short_one_on_h20_qwen2_7b():
    """The issue's case on h20/qwen2-7b: a 120,000-token decode (KV 120,001 with the token it
    computes) costs 17.02 ms alone; beside a 100-token one the mean form priced the pair at
    16.35 ms (-3.9%: the engine term 1 + u/(B h) at B = 2), the longest form at 17.03 ms."""
    model = load_table_profile("h20/qwen2-7b")
    assert model.decode_batch == "longest"
    alone = model.step_time((), 1, 120_001)
    pair = model.step_time((), 2, 120_001 + 101, 120_001)
    assert alone == pytest.approx(0.017015, abs=5e-6)
    assert pair == pytest.approx(0.017029, abs=5e-6)
    assert model.with_decode_batch("mean").step_time((), 2, 120_102, 120_001) == pytest.approx(0.016347, abs=5e-6)


def test_a_short_request_does_not_speed_up_a_long_one_in_the_engine():
    """End to end on h20/qwen2-7b: a 120,000-token request with 40 outputs, then a 100-token
    one arriving once the long one decodes. The short request's prefill step and its shared
    decode steps can only slow the long one down; under the mean form every shared step was
    0.67 ms cheaper than the long decode alone, and the long request finished earlier with
    company than without (this test fails on the code before the longest form)."""
    cluster = {"profile": "h20/qwen2-7b", "num_gpu_blocks": 20_000}
    alone = build_simulation(make_config(cluster=cluster), make_trace([0.0], [120_000], [40])).run().requests
    start = float(alone["first_token_at"].iloc[0])
    both = build_simulation(make_config(cluster=cluster), make_trace([0.0, start + 1e-3], [120_000, 100], [40, 20]))
    records = both.run().requests.set_index("request_id")
    assert records.loc[1, "finished_at"] < records.loc[0, "finished_at"]  # they overlapped
    assert records.loc[0, "finished_at"] >= float(alone["finished_at"].iloc[0])


lengths = st.lists(st.integers(1, 200_000), min_size=2, max_size=40)


@pytest.mark.parametrize("name", SHIPPED)
@settings(max_examples=60, deadline=None)
@given(kv=lengths)
def test_never_cheaper_than_its_longest_member_nor_for_an_extra_decode(name, kv):
    model = load_table_profile(name)
    total, longest = sum(kv), max(kv)
    step = model.step_time((), len(kv), total, longest)
    assert step >= model.step_time((), 1, longest)
    fewer = kv[:-1]
    assert step >= model.step_time((), len(fewer), sum(fewer), max(fewer))


@pytest.mark.parametrize("name", ["h20/qwen2-7b", "h100/qwen3-30b-a3b"])
@settings(max_examples=40, deadline=None)
@given(kv=lengths, steps=st.integers(1, 80))
def test_a_run_is_priced_with_the_bits_of_its_steps(name, kv, steps):
    model = load_table_profile(name)
    b, c0, m0 = len(kv), sum(kv), max(kv)
    run = model.decode_run_durations(b, c0, steps, m0)
    assert run == [model.step_time((), b, c0 + k * b, m0 + k) for k in range(steps)]
    assert model.decode_run_times(b, c0, steps, m0).tolist() == run


def test_equal_lengths_give_the_same_bits_in_both_forms():
    model = load_table_profile("h20/qwen3-30b-a3b")
    mean = model.with_decode_batch("mean")
    for b, length in [(1, 7), (3, 5_000), (64, 1_200), (500, 31_000)]:
        one = model.step_time([(512, 0)], b, b * length, length)
        assert one == mean.step_time([(512, 0)], b, b * length, length) == model.step_time([(512, 0)], b, b * length)
        assert model.decode_run_durations(b, b * length, 20, length) == mean.decode_run_durations(b, b * length, 20)


def test_mean_form_runs_end_to_end(tmp_path):
    """`step.decode_batch: mean` in a profile's yaml selects the old rule for a whole run."""
    folder = tmp_path / "qwen2-7b-mean"
    shutil.copytree(PROFILES_DIR / "h20" / "qwen2-7b", folder)
    meta = yaml.safe_load((folder / "profile.yaml").read_text())
    meta["step"]["decode_batch"] = "mean"
    (folder / "profile.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    model = load_table_profile(folder)
    assert model.decode_batch == "mean" and not model.prices_decode_longest
    trace = make_trace([0.0, 0.0, 0.5], [3000, 200, 50], [30, 60, 40])
    runs = {}
    for label, profile in (("mean", str(folder)), ("longest", "h20/qwen2-7b")):
        config = make_config(cluster={"profile": profile, "num_gpu_blocks": 2000})
        runs[label] = build_simulation(config, trace).run().requests["finished_at"].to_numpy()
    # the long request shares its decode steps with shorter ones: the mean form prices them lower
    assert runs["mean"].max() < runs["longest"].max()


def test_a_bad_decode_batch_is_one_line_naming_the_field(tmp_path):
    folder = tmp_path / "bad"
    shutil.copytree(TINY, folder)
    text = (folder / "profile.yaml").read_text().replace(
        "step: {fixed_s: 0.001, cpu_per_token_s: 0.0}", "step: {fixed_s: 0.001, cpu_per_token_s: 0.0, decode_batch: median}")
    (folder / "profile.yaml").write_text(text)
    with pytest.raises(ProfileError, match=r"profile.yaml: field 'step.decode_batch' must be one of longest, mean, got 'median'"):
        read_profile(folder)
    assert any("step.decode_batch" in p for p in validate_profile(folder))
    with pytest.raises(ProfileError, match="decode_batch must be one of"):
        load_table_profile(TINY).with_decode_batch("median")


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(st.tuples(st.booleans(), st.integers(-50, 50)), max_size=300))
def test_longest_decode_tracks_the_maximum_of_a_multiset(ops):
    tracker, held = LongestDecode(), []
    for insert, value in ops:
        if insert or not held:
            tracker.add(value)
            held.append(value)
        else:
            gone = held.pop(value % len(held))
            tracker.remove(gone)
        if held:
            assert tracker.longest() == max(held)
        assert len(tracker) == len(held)


def test_an_overlapped_profile_prices_runs_with_the_bits_of_its_steps():
    """SGLang's overlap scheduler (`host_overlap`): max(host, GPU), the GPU part with the
    longest form's attention; a run keeps the steps' bits."""
    from lmsim.profile.analytic import AnalyticModel, tabulate

    model = TableCostModel(tabulate(AnalyticModel.build("h20", "qwen2-7b", engine="sglang-0.4"), date="-"))
    assert model.prices_decode_longest and model._overlap
    b, c0, m0 = 3, 90_000 + 200 + 50, 90_000
    run = model.decode_run_durations(b, c0, 12, m0)
    assert run == [model.step_time((), b, c0 + k * b, m0 + k) for k in range(12)]
    assert run[0] > model.with_decode_batch("mean").step_time((), b, c0, m0)
    assert run[0] >= model.step_time((), 1, m0)


@pytest.mark.parametrize("name", SHIPPED)
def test_a_large_batch_with_one_long_sequence(name):
    """1,000 decodes of 10 tokens beside one of 200,000 (C/M = 1.05): at least the long one
    alone, and at least the 1,000 short ones without it."""
    model = load_table_profile(name)
    step = model.step_time((), 1001, 200_000 + 10_000, 200_000)
    assert step >= model.step_time((), 1, 200_000)
    assert step >= model.step_time((), 1000, 10_000, 10)


@pytest.mark.parametrize("steps", [6, 700])
@pytest.mark.parametrize("kv", [[50] + [1] * 9, [20] + [1] * 9, [3000, 20, 20, 5], [100_000] + [7] * 63, [2] * 4 + [3]])
def test_a_run_crossing_batch_rows_keeps_the_bits_of_its_steps(kv, steps):
    """In a run C/M climbs towards B ([50, 1 x 9]: from 1.18 through rows 2-5 by step 50;
    [20, 1 x 9]: row 2 at step 2) while the context crosses columns: a short run walks the
    cells step by step, a long one prices each cell's steps at once, both with the bits of
    the steps priced one by one."""
    model = load_table_profile("h20/qwen3-30b-a3b")
    b, c0, m0 = len(kv), sum(kv), max(kv)
    run = model.decode_run_durations(b, c0, steps, m0)
    assert run == [model.step_time((), b, c0 + k * b, m0 + k) for k in range(steps)]


def test_the_invariant_check_recounts_the_longest_decode(monkeypatch):
    """`simulation.check` recounts the decoding requests' longest offset every step: a tracker
    that forgets removals (a finished long decode still counted) is caught, naming it."""
    from lmsim.errors import InvariantError

    trace = make_trace([0.0, 0.0], [3000, 100], [5, 40])
    cluster = {"profile": "h20/qwen2-7b", "num_gpu_blocks": 2000}
    build_simulation(make_config(cluster=cluster), trace).run()  # consistent: passes
    monkeypatch.setattr(LongestDecode, "remove", lambda self, value: None)
    with pytest.raises(InvariantError, match="longest decode offset"):
        build_simulation(make_config(cluster=cluster), trace).run()
