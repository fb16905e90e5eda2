"""Vidur's trace CSV (`--format vidur`) and `workload.max_tokens`, Vidur's model-length clip."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import make_trace
from lmsim.config import validate
from lmsim.errors import ConfigError, TraceError
from lmsim.study.experiment import shape_workload
from lmsim.workload.clip import clip_to_max_tokens
from lmsim.workload.formats import infer_format, load_trace

SMALL = Path(__file__).parent / "fixtures" / "traces" / "vidur_small.csv"


def test_vidur_csv_loads_as_vidur_reads_it():
    assert infer_format(SMALL) == "vidur"
    t = load_trace(SMALL, format="vidur")
    assert t.arrival_s.tolist() == [0.0, 4.314579, 4.541877, 5.0, 6.5]
    # Vidur's trace-replay generator clips both lengths at 1.
    assert t.input_tokens.tolist() == [374, 396, 879, 4000, 1]
    assert t.output_tokens.tolist() == [44, 109, 55, 200, 1]
    assert len(t.hash_values) == 0


def test_vidur_csv_bad_rows_are_one_line(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,5\n1,ten,5\n")
    with pytest.raises(TraceError, match=r"bad.csv: line 3: num_prefill_tokens must be an integer"):
        load_trace(bad, format="vidur")
    bad.write_text("arrived_at,num_prefill_tokens\n0,10\n")
    with pytest.raises(TraceError, match="column num_decode_tokens is missing"):
        load_trace(bad, format="vidur")
    bad.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n2,10,5\n1,10,5\n")
    with pytest.raises(TraceError, match="line 3: timestamp goes backwards"):
        load_trace(bad, format="vidur")


def test_max_tokens_shortens_the_prompt_like_vidur():
    t = load_trace(SMALL, format="vidur")
    c = clip_to_max_tokens(t, 1000)
    # 879 + 55 = 934 fits; 4000 + 200 loses 3200 prompt tokens; outputs never change.
    assert c.input_tokens.tolist() == [374, 396, 879, 800, 1]
    assert c.output_tokens.tolist() == t.output_tokens.tolist()
    assert (c.input_tokens + c.output_tokens <= 1000).all()
    assert t.input_tokens[3] == 4000  # the input trace is untouched


def test_max_tokens_keeps_leading_hash_blocks():
    t = make_trace([0.0, 1.0], [64, 40], [10, 10], hashes=[[1, 2, 3, 4], [1, 2, 9]], block_size=16)
    c = clip_to_max_tokens(t, 50)
    assert c.input_tokens.tolist() == [40, 40]
    assert c.hash_ids(0).tolist() == [1, 2, 3] and c.hash_ids(1).tolist() == [1, 2, 9]
    c.validate()


def test_max_tokens_that_leaves_no_prompt_is_an_error():
    t = make_trace([0.0], [10], [100])
    with pytest.raises(ConfigError, match=r"workload\.max_tokens: request 0 has 100 output tokens"):
        clip_to_max_tokens(t, 100)


def test_max_tokens_in_an_experiment():
    cfg = validate({"workload": {"trace": str(SMALL), "format": "vidur", "max_tokens": 1000}}, where="t")
    shaped = shape_workload(load_trace(SMALL, format="vidur"), cfg)
    assert int(shaped.input_tokens[3]) == 800
    with pytest.raises(ConfigError, match="max_tokens"):
        validate({"workload": {"trace": "x.csv", "max_tokens": 0}}, where="t")
    assert np.array_equal(shape_workload(load_trace(SMALL), validate(
        {"workload": {"trace": str(SMALL)}}, where="t")).input_tokens, load_trace(SMALL).input_tokens)
