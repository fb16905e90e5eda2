"""Every request's outcome is explained, in one schema: rejected requests say why,
`cluster.max_model_len` behaves as vLLM's (reject prompt_len >= max_model_len in the input
processor, stop generation when prompt + output reaches it), and requests.parquet has the
same dtypes in every run, unknown always null."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from conftest import make_trace, simulate
from lmsim.cli import format_summary
from lmsim.study.rundir import load_run, save_run

EXPECTED_SCHEMA = {
    "request_id": pa.int64(), "arrived_at": pa.float64(), "routed_at": pa.float64(),
    "first_scheduled_at": pa.float64(), "first_token_at": pa.float64(), "finished_at": pa.float64(),
    "instance_id": pa.int64(), "input_tokens": pa.int64(), "output_tokens": pa.int64(),
    "cached_tokens": pa.int64(), "num_preemptions": pa.int64(),
    "lookup_tokens": pa.int64(), "lookup_hit_tokens": pa.int64(), "ttft_s": pa.float64(),
    "tpot_s": pa.float64(), "e2e_s": pa.float64(), "queue_s": pa.float64(),
    "predicted_ttft_s": pa.float64(), "session_id": pa.int64(), "class_id": pa.int64(),
    "status": pa.string(), "reject_reason": pa.string(),
}  # fmt: skip


def test_max_model_len_rejects_long_prompts_and_clips_outputs() -> None:
    # max_model_len 200: 100+50 fits; a 200-token prompt leaves no room (rejected, as
    # vLLM rejects prompt_len >= max_model_len); 150+100 stops at 200, i.e. 50 outputs.
    trace = make_trace([0.0, 10.0, 20.0], [100, 200, 150], [50, 10, 100])
    r = simulate(trace, cluster={"max_model_len": 200}, simulation={"check": True})
    req = r.requests
    assert list(req.status.astype(str)) == ["finished", "rejected", "finished"]
    assert list(req.reject_reason.astype(object).fillna("-")) == ["-", "prompt_too_long", "-"]
    assert list(req.output_tokens) == [50, 10, 50]
    assert req.instance_id.isna().tolist() == [False, True, False]  # refused before routing
    assert r.summary["num_rejected_prompt_too_long"] == 1
    assert r.summary["num_output_clipped"] == 1
    assert r.summary["max_model_len"] == 200
    # the clipped request runs exactly like one that asked for 50 tokens
    alone = simulate(make_trace([20.0], [150], [50]), simulation={"check": True}).requests
    assert req.e2e_s[2] == alone.e2e_s[0]


def test_without_max_model_len_nothing_is_clipped() -> None:
    r = simulate(make_trace([0.0], [150], [100]))
    assert r.summary["num_output_clipped"] == 0 and r.summary["max_model_len"] is None
    assert list(r.requests.output_tokens) == [100]


def test_queue_full_and_kv_rejections_carry_their_reason() -> None:
    # One instance, max_waiting 1, three arrivals at t=0: the first waits in the queue
    # (its step starts after the arrival events of that instant), the next two find the
    # queue full. The last needs ceil((1000 + 20000 - 1) / 16) = 1313 blocks of a 1000-block
    # pool: it could never finish, so it is refused.
    trace = make_trace([0.0, 0.0, 0.0, 5.0], [100, 100, 100, 1000], [10, 10, 10, 20000])
    r = simulate(trace, cluster={"max_waiting": 1, "num_gpu_blocks": 1000}, simulation={"check": True})
    reasons = list(r.requests.reject_reason.astype(object).fillna("-"))
    assert reasons == ["-", "queue_full", "queue_full", "exceeds_kv_cache"]
    assert r.summary["num_rejected"] == 3
    assert r.summary["num_rejected_queue_full"] == 2 and r.summary["num_rejected_exceeds_kv_cache"] == 1
    line = format_summary("t", r.summary).splitlines()[0]
    assert "3 rejected (exceeds_kv_cache 1, queue_full 2)" in line
    assert "0 never arrived" in line


def test_requests_parquet_has_one_schema(tmp_path: Path) -> None:
    # one finished, one rejected before routing: nulls where nothing happened
    trace = make_trace([0.0, 1.0], [100, 300], [5, 5])
    r = simulate(trace, cluster={"max_model_len": 300})
    save_run(r, tmp_path / "run", figure=False)
    table = pq.read_table(tmp_path / "run" / "requests.parquet")
    assert {f.name: f.type for f in table.schema} == EXPECTED_SCHEMA
    rows = table.to_pylist()
    assert rows[0]["instance_id"] == 0 and rows[0]["reject_reason"] is None
    assert rows[1]["instance_id"] is None and rows[1]["cached_tokens"] is None
    assert rows[1]["session_id"] is None and rows[1]["first_token_at"] is None
    assert rows[1]["status"] == "rejected" and rows[1]["reject_reason"] == "prompt_too_long"
    back = load_run(tmp_path / "run").requests
    assert str(back.instance_id.dtype) == "Int64" and str(r.requests.instance_id.dtype) == "Int64"
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["num_rejected_prompt_too_long"] == 1
