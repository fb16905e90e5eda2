"""KV that reaches an instance from outside becomes usable when vLLM learns of it (issue 34):
at the end of the first step whose connector poll (`get_finished`, right after the step's
forward is launched) comes at or after the landing, not at the landing
(lmsim/engine/instance.py, `cluster.kv_connector_poll`).

Profile (conftest LINEAR): a step costs 10 ms + 1 ms per prefill token + 0.1 ms per decode
sequence; P/D KV is 1 MB a token over a 1 GB/s link with 2 ms first-byte latency.

Busy decode instance (1 prefill + 1 decode). A: 16 tokens, 100 outputs, at 0: prefilled on
P in 10 + 16 = 26 ms; its 1 block (16 MB) lands on the idle decode instance at 0.026 +
0.002 + 0.016 = 0.044, which polls at once (vLLM runs empty steps while a request waits for
its KV); its last token there takes 11 ms: first token 0.055, then one 10.1 ms decode step
after another, ending at 0.055 + n x 0.0101. B: 160 tokens (10 blocks), 1 output, at 0.1:
prefill 0.100-0.270; it joins the decode queue then and the decode instance starts the
read at its next step boundary, 0.055 + 22 x 0.0101 = 0.2772; 160 MB land at 0.2772 +
0.162 = 0.4392, inside the step 0.4388-0.4489. B's first token is the end of the 11.1 ms
step (A's decode + B's last token) that admits it:

* on landing (lmsim before, Dynamo's mocker): admitted at 0.4489, first token 0.4600;
* synchronous vLLM: the step planned at 0.4489 polls it, its end (0.4590) applies it, the
  next step admits it: 0.4701 (+10.1 ms, one step);
* asynchronous vLLM: the step planned at 0.4388 (when 0.4287's step ended) does not see
  it; the one planned at 0.4489 polls it and ends at 0.4691, and the plan made then is for
  the step after the one already planned (0.4691-0.4792): 0.4792 + 0.0111 = 0.4903 (+20.2
  ms, two steps; with `instant` the async engine admits it at 0.4590 + 0.0111 = 0.4701).
"""

from __future__ import annotations

import pytest
from test_disagg import LINK, PROFILE, blocks

from conftest import make_config, make_trace
from lmsim.study.compose import build_simulation

PD_ROUTER = {"policy": "pd", "params": {"prefill_policy": "round_robin", "decode_policy": "round_robin"}}


def pd_run(trace, poll, *, asynchronous=False, fast_forward=True, prefill_pool=None):
    cluster = {
        "profile": PROFILE,
        "kv_connector_poll": poll,
        "pools": [
            {"name": "prefill", "role": "prefill", "num_instances": 1, "async_scheduling": asynchronous,
             **(prefill_pool or {})},
            {"name": "decode", "role": "decode", "num_instances": 1, "async_scheduling": asynchronous},
        ],
        "kv_transfer": LINK,
    }
    config = make_config(cluster=cluster, router=PD_ROUTER, simulation={"check": True, "fast_forward": fast_forward})
    return build_simulation(config, trace).run().requests


BUSY_DECODE = make_trace([0.0, 0.1], [16, 160], [100, 1], [blocks(1, 1), blocks(2)])


@pytest.mark.parametrize("fast_forward", [True, False])
@pytest.mark.parametrize(("poll", "asynchronous", "first_token"), [
    ("instant", False, 0.4600),
    ("step", False, 0.4701),
    ("instant", True, 0.4701),
    ("step", True, 0.4903),
])
def test_a_transfer_landing_on_a_busy_decode_instance_waits_for_its_poll(poll, asynchronous, first_token, fast_forward):
    r = pd_run(BUSY_DECODE, poll, asynchronous=asynchronous, fast_forward=fast_forward)
    a, b = r.iloc[0], r.iloc[1]
    assert a.first_token_at == pytest.approx(0.055)  # the idle decode instance polls at once
    assert b.kv_transfer_start_at == pytest.approx(0.2772)
    assert b.kv_transfer_start_at + b.kv_transfer_s == pytest.approx(0.4392)  # the bytes' landing is unchanged
    assert b.first_token_at == pytest.approx(first_token)


@pytest.mark.parametrize("fast_forward", [True, False])
@pytest.mark.parametrize(("poll", "e_admitted"), [("instant", 0.340), ("step", 0.366)])
def test_the_prefill_instance_frees_a_read_request_at_its_next_poll(poll, e_admitted, fast_forward):
    """P (21 blocks, 160 tokens a step) keeps computing while A's KV is read. A (160
    tokens, 10 blocks) is prefilled 0-0.170 and held; C (176 tokens, 11 blocks, at 0.1)
    prefills its first 160 tokens 0.170-0.340 (10 blocks: 20 of 21 used) and its last 16
    0.340-0.366 (the 21st block); E (16 tokens, 1 block, at 0.2) waits for room. A's read
    lands at 0.170 + 0.162 = 0.332, inside C's first chunk. On landing P frees A's blocks
    then and admits E beside C's last chunk at 0.340 (10 + 32 ms: E done at 0.382); vLLM's P
    learns of it at the poll of the step planned at 0.340 (`finished_sending`), frees the
    blocks when that step ends, 0.366, and E runs alone then: done at 0.392."""
    trace = make_trace([0.0, 0.1, 0.2], [160, 176, 16], [1, 1, 1], [blocks(1), blocks(2, 11), blocks(3, 1)])
    r = pd_run(trace, poll, fast_forward=fast_forward, prefill_pool={"num_gpu_blocks": 21, "max_num_batched_tokens": 160})
    a, c, e = r.iloc[0], r.iloc[1], r.iloc[2]
    assert a.kv_transfer_start_at + a.kv_transfer_s == pytest.approx(0.332)
    assert e.first_scheduled_at == pytest.approx(e_admitted)
    assert e.prefill_done_at == pytest.approx(0.392 if poll == "step" else 0.382)
    assert c.prefill_done_at == pytest.approx(0.366 if poll == "step" else 0.382)


A, B = list(range(1, 11)), list(range(100, 115))


@pytest.mark.parametrize("fast_forward", [True, False])
@pytest.mark.parametrize(("poll", "asynchronous", "first_token"), [
    ("instant", False, 2.0381),
    ("step", False, 2.0482),
    ("instant", True, 2.0482),
    ("step", True, 2.0684),
])
def test_a_host_tier_load_on_a_busy_instance_waits_for_its_poll(poll, asynchronous, first_token, fast_forward):
    """vLLM's OffloadingConnector reports finished loads through the same per-step poll
    (`OffloadingConnectorWorker.get_finished`). 16-block GPU pool, host tier of 100 blocks
    read at 1e7 B/s, 1,000 B/token. A (160 tokens) at 0 and B (240 tokens, 15 blocks) at 1
    leave A's 10 blocks in host memory only (B's prefill evicts them from the GPU); X (16
    tokens, 30 outputs) at 1.9 takes the last GPU block that held A's first one, and
    decodes from its first token at 1.926 in 10.1 ms steps. A2 (A's prompt) at 2.0 is
    admitted at the next boundary, 1.926 + 8 x 0.0101 = 2.0068, with a load of its 10 blocks
    (160,000 B: 16 ms) that lands at 2.0228, inside the step 2.0169-2.0270. The step that
    admits it computes X's decode and A2's last token, 11.1 ms: on landing, from 2.0270
    (2.0381); synchronous vLLM polls it at 2.0270 and admits it at 2.0371 (2.0482);
    asynchronous vLLM: the step planned at 2.0169 (running 2.0270-2.0371) does not see it,
    the one planned at 2.0270 (running 2.0371-2.0472) polls it, its end applies it, and the
    plan made then is for the step after the one already planned (2.0472-2.0573): 2.0573 +
    0.0111 = 2.0684."""
    trace = make_trace([0.0, 1.0, 1.9, 2.0], [160, 240, 16, 160], [1, 1, 30, 1], [A, B, [500], A])
    cluster = {
        "num_gpu_blocks": 16, "kv_connector_poll": poll, "async_scheduling": asynchronous,
        "kv_tiers": {"host": {"capacity_blocks": 100, "read_bytes_s": 1e7, "write_bytes_s": 1e9},
                     "kv_bytes_per_token": 1000},
    }
    config = make_config(cluster=cluster, simulation={"check": True, "fast_forward": fast_forward})
    a2 = build_simulation(config, trace).run().requests.iloc[3]
    assert (a2.cached_tokens, a2.kv_hit_tokens_host, a2.kv_load_s) == (0, 160, pytest.approx(0.016))
    assert a2.first_token_at == pytest.approx(first_token)
