"""The table predictor: loading, interpolation rules, bitwise run/step agreement, bad input."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmsim.errors import ProfileError
from lmsim.profile import PROFILES_DIR, load_cost_model
from lmsim.profile.tables import TableCostModel, load_table_profile, read_profile

TINY = Path(__file__).parent / "fixtures" / "profiles" / "tiny"
SHIPPED = ["h20/qwen2-7b", "h20/qwen3-30b-a3b", "h100/qwen2-7b", "h100/qwen3-30b-a3b",
           "h200/qwen2-7b", "h200/qwen3-30b-a3b"]


@pytest.fixture(scope="module")
def tiny() -> TableCostModel:
    return load_table_profile(TINY)


def test_every_shipped_profile_loads_by_name():
    for name in SHIPPED:
        model = load_cost_model(name)
        assert isinstance(model, TableCostModel)
        assert model.name == name
        assert (PROFILES_DIR / name / "profile.yaml").is_file()


def test_tiny_profile_by_hand(tiny):
    # fixed 1 ms + tokens(1) 10 ms + seqs(1) 2 ms + decode attention(1, 1000) 1 ms
    assert tiny.step_time((), 1, 1000) == pytest.approx(0.014, rel=1e-12)
    # chunk (55, 500) sits mid-cell: attention = mean of 1, 2, 10, 30 ms = 10.75 ms
    assert tiny.step_time([(55, 500)], 0, 0) == pytest.approx(0.001 + 0.010 + 0.002 + 0.01075, rel=1e-12)
    # batch 5 is 4/9 of the way from row 1 to row 10; context 5500 is half way to 10000
    da = 0.5 * (0.001 * 5 / 9 + 0.002 * 4 / 9) + 0.5 * (0.010 * 5 / 9 + 0.020 * 4 / 9)
    seqs5 = 0.002 + (0.004 - 0.002) * 4 / 99
    assert tiny.step_time((), 5, 5500) == pytest.approx(0.001 + 0.010 + seqs5 + da, rel=1e-12)


def test_extrapolation_is_linear_beyond_the_grid_and_held_below(tiny):
    # tokens 2048 lies beyond the last grid point 1024: the 128..1024 segment is extended.
    slope = (0.102 - 0.021) / (1024 - 128)
    assert tiny._base(1, 2048) == pytest.approx(0.001 + 0.102 + slope * 1024 + 0.002, rel=1e-12)
    # below the first chunk grid point (10 tokens) the first row is held
    assert tiny._prefill_attention(2, 0) == tiny._prefill_attention(10, 0) == 0.001


def test_interpolation_exact_at_grid_points_and_between_neighbours():
    model = load_table_profile("h20/qwen3-30b-a3b")
    d = model.data
    rng = np.random.default_rng(7)
    for i in rng.integers(0, d.pa_q.size, 20):
        for j in rng.integers(0, d.pa_c.size, 5):
            assert model._prefill_attention(int(d.pa_q[i]), int(d.pa_c[j])) == d.pa[i, j]
    for i in range(d.da_b.size):
        for j in rng.integers(0, d.da_c.size, 5):
            assert model._decode_attention(int(d.da_b[i]), int(d.da_c[j])) == d.da[i, j]
    for i in range(0, d.tokens.size - 1, 7):
        lo, hi = d.tokens[i], d.tokens[i + 1]
        assert model._base(1, int(lo)) - model._base(1, 0) == pytest.approx(
            float(d.dense_s[i] + d.moe_s[i] - d.dense_s[0] - d.moe_s[0])
            + d.cpu_per_token_s * lo, rel=1e-13, abs=1e-15)  # float rounding at ~10 s
        if hi - lo >= 2:
            mid = int((lo + hi) // 2)
            v = model._base(1, mid)
            a, b = model._base(1, int(lo)), model._base(1, int(hi))
            assert min(a, b) - 1e-15 <= v <= max(a, b) + 1e-15
    # 2-D: inside a cell, the value lies between the cell's four corners
    for _ in range(200):
        i = int(rng.integers(0, d.pa_q.size - 1))
        j = int(rng.integers(0, d.pa_c.size - 1))
        q = int(rng.integers(d.pa_q[i], d.pa_q[i + 1] + 1))
        c = int(rng.integers(d.pa_c[j], d.pa_c[j + 1] + 1))
        corners = d.pa[i:i + 2, j:j + 2]
        v = model._prefill_attention(q, c)
        assert corners.min() * (1 - 1e-12) <= v <= corners.max() * (1 + 1e-12)


@settings(max_examples=300, deadline=None)
@given(
    name=st.sampled_from([*SHIPPED[:2], "tiny"]),
    batch=st.integers(0, 3000),
    first=st.integers(0, 50_000_000),
    steps=st.integers(1, 60),
)
def test_decode_run_times_equal_step_time_bit_for_bit(name, batch, first, steps):
    model = load_table_profile(TINY if name == "tiny" else name)
    run = model.decode_run_times(batch, first, steps)
    assert run.dtype == np.float64 and run.shape == (steps,)
    for k in range(steps):
        single = model.step_time((), batch, first + k * batch)
        assert run[k] == single, (k, run[k], single)


@settings(max_examples=300, deadline=None)
@given(
    name=st.sampled_from([*SHIPPED[:2], "tiny"]),
    chunks=st.lists(st.tuples(st.integers(0, 20_000), st.integers(0, 200_000)), max_size=4),
    batch=st.integers(0, 3000),
    context=st.integers(0, 50_000_000),
)
def test_step_time_equals_its_components_bit_for_bit(name, chunks, batch, context):
    """step_time inlines the component lookups; the components are the reference."""
    model = load_table_profile(TINY if name == "tiny" else name)
    t = model._base(batch + len(chunks), batch + sum(q for q, _ in chunks))
    if batch:
        t = t + model._decode_attention(batch, context)
    for q, c in chunks:
        t = t + model._prefill_attention(q, c)
    assert model.step_time(chunks, batch, context) == t


def _vectorised_run_times(model: TableCostModel, batch: int, first: int, steps: int) -> np.ndarray:
    """The numpy form `decode_run_durations` replaced: every step located by searchsorted."""
    from lmsim.profile.tables import _locate_vec

    if batch == 0:
        return np.full(steps, float(model._base(0, 0)))
    base, row, _ = model._decode_row(batch)
    row_arr = np.array(row)
    context = first + batch * np.arange(steps, dtype=np.int64)
    j, wc = _locate_vec(np.array(model._da_c), context.astype(np.float64))
    return base + (row_arr[j] * (1.0 - wc) + row_arr[j + 1] * wc)


@settings(max_examples=300, deadline=None)
@given(
    name=st.sampled_from([*SHIPPED[:2], "tiny"]),
    batch=st.integers(0, 3000),
    first=st.integers(0, 50_000_000),
    steps=st.integers(1, 200),
)
def test_run_durations_walk_equals_the_vectorised_reference(name, batch, first, steps):
    model = load_table_profile(TINY if name == "tiny" else name)
    walked = model.decode_run_durations(batch, first, steps)
    assert isinstance(walked, list) and len(walked) == steps
    assert walked == _vectorised_run_times(model, batch, first, steps).tolist()


def test_run_durations_cross_grid_points_below_and_above(tmp_path):
    """From below the first context point (held), across fractional grid points, past the
    last one (extrapolated), for strides that land on and between the points."""
    p = _copy_tiny(tmp_path)
    (p / "decode_attention.csv").write_text(
        "batch/total_context,100.5,1000,1003.25,10000\n1,0.0005,0.001,0.0011,0.010\n"
        "10,0.0007,0.002,0.0023,0.020\n"
    )
    model = TableCostModel(read_profile(p))
    cases = [(b, f, k) for b in (1, 3, 7, 10, 250) for f in (0, 99, 100, 101, 997, 1003, 9999)
             for k in (1, 2, 6, 7, 12_000 // b)]  # both sides of the short-run walk
    for batch, first, steps in cases:
        want = [model.step_time((), batch, first + batch * k) for k in range(steps)]
        assert model.decode_run_durations(batch, first, steps) == want, (batch, first, steps)
        assert want == _vectorised_run_times(model, batch, first, steps).tolist()


def _copy_tiny(tmp_path: Path) -> Path:
    dst = tmp_path / "bad"
    shutil.copytree(TINY, dst)
    return dst


def _expect_error(path: Path, *fragments: str) -> str:
    with pytest.raises(ProfileError) as exc:
        read_profile(path)
    msg = str(exc.value)
    assert "\n" not in msg
    for frag in fragments:
        assert frag in msg, msg
    return msg


def test_missing_field_names_file_and_field(tmp_path):
    p = _copy_tiny(tmp_path)
    text = (p / "profile.yaml").read_text().replace(" kv_bytes_per_token: 1024,", "")
    (p / "profile.yaml").write_text(text)
    _expect_error(p, "bad/profile.yaml", "model.kv_bytes_per_token")


def test_negative_time_names_file_and_column(tmp_path):
    p = _copy_tiny(tmp_path)
    (p / "seqs.csv").write_text("seqs,lm_head_s,cpu_s\n1,0.001,-0.001\n100,0.002,0.002\n")
    _expect_error(p, "seqs.csv", "cpu_s", "negative")


def test_negative_scalar_is_rejected(tmp_path):
    p = _copy_tiny(tmp_path)
    text = (p / "profile.yaml").read_text().replace("fixed_s: 0.001", "fixed_s: -0.001")
    (p / "profile.yaml").write_text(text)
    _expect_error(p, "profile.yaml", "step.fixed_s")


def test_non_monotone_grid_names_file_and_axis(tmp_path):
    p = _copy_tiny(tmp_path)
    (p / "prefill_attention.csv").write_text(
        "chunk_tokens/cached_context,0,1000\n100,0.01,0.03\n10,0.001,0.002\n")
    _expect_error(p, "prefill_attention.csv", "chunk_tokens", "not strictly increasing")
    (p / "prefill_attention.csv").write_text(
        "chunk_tokens/cached_context,1000,0\n10,0.001,0.002\n100,0.01,0.03\n")
    _expect_error(p, "prefill_attention.csv", "cached_context")


def test_unknown_profile_name():
    with pytest.raises(ProfileError) as exc:
        load_cost_model("h20/foo")
    msg = str(exc.value)
    assert "profiles/h20/foo/profile.yaml" in msg and "unknown profile 'h20/foo'" in msg
    assert "h20/qwen3-30b-a3b" in msg


def test_unknown_gpu_or_model_in_generate(tmp_path):
    from lmsim.cli.profile import generate_one

    with pytest.raises(ProfileError, match="unknown GPU 'b300'"):
        generate_one("b300/qwen2-7b", tmp_path)
    with pytest.raises(ProfileError, match="unknown model 'llama'"):
        generate_one("h20/llama", tmp_path)


def test_kv_blocks_by_hand(tiny):
    # 0.9 * 10 GiB - 1 GiB weights - 1 GiB overhead = 7 GiB; 16 tokens * 1 KiB per block
    assert tiny.num_kv_blocks(16, 0.9) == 7 * 2**30 // (16 * 1024)


def test_linear_spec_still_works():
    model = load_cost_model({"kind": "linear", "step_base_s": 0.01})
    assert model.step_time((), 1, 10) == pytest.approx(0.01)


def test_invalid_profile_yaml_is_one_line_naming_file_and_line(tmp_path):
    from lmsim.profile.tables import validate_profile

    folder = tmp_path / "gpu" / "model"
    folder.mkdir(parents=True)
    (folder / "profile.yaml").write_text("format: lmsim-profile/1\nhardware: [unclosed\n")
    with pytest.raises(ProfileError, match=r"profile\.yaml: invalid YAML at line 3$"):
        read_profile(folder)
    [problem] = validate_profile(folder)
    assert problem.endswith("profile.yaml: invalid YAML at line 3")
