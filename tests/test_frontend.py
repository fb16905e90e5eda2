"""The client-side latency path (lmsim.engine.frontend): HTTP + gateway + tokenisation
before the router, streaming after the engine."""

from __future__ import annotations

import pytest

from conftest import make_config, make_trace, simulate
from lmsim.config import validate
from lmsim.errors import ConfigError
from lmsim.workload.ladder import stage_meta

FRONT = {"request_s": 0.1, "gateway_s": 0.05, "tokenize_s_per_token": 0.001, "stream_s": 0.02}


def test_front_end_adds_ingress_and_streaming_to_ttft_and_e2e():
    """One request of 10 prompt tokens sent at 0: ingress 0.1 + 0.05 + 10 x 0.001 = 0.16 s,
    so the router sees it at 0.16; the engine's linear steps give its first token 0.020 s
    later (0.18) and its second 0.0101 s after that (0.1901); the client reads each 0.02 s
    later: TTFT 0.20, E2E 0.2101, TPOT unchanged 0.0101."""
    res = simulate(make_trace([0.0], [10], [2]), frontend=FRONT)
    r = res.requests.iloc[0]
    assert r["arrived_at"] == 0.0
    assert r["routed_at"] == pytest.approx(0.16)
    assert r["ttft_s"] == pytest.approx(0.20)
    assert r["e2e_s"] == pytest.approx(0.2101)
    assert r["tpot_s"] == pytest.approx(0.0101)


def test_without_a_front_end_nothing_moves():
    """No `frontend:` section: TTFT is the engine's alone, 0.020 s (as before the model)."""
    res = simulate(make_trace([0.0], [10], [2]))
    assert res.requests["ttft_s"].iloc[0] == pytest.approx(0.020)
    assert "frontend" not in make_config().to_dict()


def test_closed_loop_successor_waits_for_the_client_side_finish():
    """Row 1 follows row 0 with 0.5 s think time. Row 0 (sent at 0): client finish at 0.2101
    (above); row 1 is sent at 0.7101, reaches the router at 0.8701."""
    trace = make_trace([0.0, 1.0], [10, 10], [2, 2], after_id=[-1, 0], delay_s=[0.0, 0.5], session_id=[0, 0])
    res = simulate(trace, frontend=FRONT)
    assert res.requests["arrived_at"].iloc[1] == pytest.approx(0.7101)
    assert res.requests["routed_at"].iloc[1] == pytest.approx(0.8701)


def test_stage_barrier_counts_the_client_side_finish():
    """Stage 0's one request finishes for the client at 0.2101; with a 1 s interval stage 1
    starts at 1.2101 and its request (offset 0.5 from its nominal start 2.0) is sent at
    1.7101."""
    trace = make_trace([0.0, 2.5], [10, 10], [2, 2], stage=[0, 1], session_id=[0, 1])
    trace.meta.update(stage_meta([0.0, 2.0], 1.0, True))
    res = simulate(trace, frontend=FRONT)
    assert res.requests["arrived_at"].iloc[1] == pytest.approx(1.7101)


def test_defaults_are_the_calibrated_api_server():
    """`frontend: {}` turns the model on with its defaults: 5 ms + 1 us/token in, 1 ms out;
    10 tokens: TTFT 0.005 + 0.00001 + 0.020 + 0.001 = 0.02601."""
    res = simulate(make_trace([0.0], [10], [2]), frontend={})
    assert res.requests["ttft_s"].iloc[0] == pytest.approx(0.02601)


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"request_s": -1}, "frontend.request_s: Input should be greater than or equal to 0"),
        ({"stream_ms": 1}, "frontend.stream_ms: unknown key"),
        ({"tokenize_s_per_token": "fast"}, "frontend.tokenize_s_per_token"),
        ({"gateway_bytes_per_s": 0}, "frontend.gateway_bytes_per_s: Input should be greater than 0"),
    ],
)
def test_bad_front_end_is_one_line(section, message):
    raw = {"workload": {"trace": "x.parquet"}, "frontend": section}
    with pytest.raises(ConfigError, match=message):
        validate(raw, where="exp.yaml")


GATEWAY = {"request_s": 0.0, "tokenize_s_per_token": 0.0, "stream_s": 0.0,
           "gateway_bytes_per_s": 100_000.0, "body_bytes_per_token": 1000.0}


def test_gateway_body_path_is_one_fifo_server():
    """Three requests of 10 tokens sent together, no text: bodies of 10 x 1000 = 10,000 bytes,
    served one at a time at 100,000 bytes/s = 0.1 s each, so the router sees them at 0.1,
    0.2 and 0.3 s; a fourth sent at 1.0, after the queue emptied, waits only its own 0.1 s."""
    trace = make_trace([0.0, 0.0, 0.0, 1.0], [10] * 4, [2] * 4)
    res = simulate(trace, frontend=GATEWAY)
    assert res.requests.sort_values("request_id")["routed_at"].tolist() == pytest.approx([0.1, 0.2, 0.3, 1.1])


def test_gateway_body_is_the_prompt_texts_utf8_bytes():
    """With text the body is its UTF-8: 'héllo' is 6 bytes (é takes two), whatever the token
    count; without text 5 tokens x 4 bytes = 20."""
    from lmsim.engine.frontend import FrontEnd

    front = FrontEnd(0.0, 0.0, 0.0, 0.0, gateway_bytes_per_s=2.0)
    assert front.body_bytes(5, "héllo") == 6.0
    assert front.body_bytes(5) == 20.0
    assert front.routed_at(0.0, 5, "héllo") == 3.0  # 6 bytes at 2 bytes/s


def test_gateway_reproduces_the_measured_epp_plateau():
    """GIE issue #2928: 220 KB prompts through the EPP plateau at ~129 req/s whatever the
    concurrency (121-133 from 20 to 200). At 28.4e6 bytes/s a 220,000-byte body takes
    7.746 ms, so a closed loop of 20 clients against an instant backend completes
    1 / 0.007746 = 129.1 req/s, and each request waits 20 x 7.746 = 154.9 ms (measured:
    154 ms mean at concurrency 20); at 60 clients 464.8 ms (measured 426)."""
    import heapq

    from lmsim.engine.frontend import FrontEnd

    for clients, expected_wait in ((20, 0.15493), (60, 0.46479)):
        front = FrontEnd(0.0, 0.0, 0.0, 0.0, gateway_bytes_per_s=28.4e6, body_bytes_per_token=1.0)
        sends = [(0.0, c) for c in range(clients)]
        heapq.heapify(sends)
        waits, done = [], 0
        while done < 40 * clients:
            sent, client = heapq.heappop(sends)
            seen = front.routed_at(sent, 220_000)
            if done >= 20 * clients:  # past the start-up transient
                waits.append(seen - sent)
            heapq.heappush(sends, (seen, client))
            done += 1
        assert sum(waits) / len(waits) == pytest.approx(expected_wait, rel=1e-3)
        assert done / seen == pytest.approx(129.1, rel=1e-3)  # requests through per second



def test_a_request_inside_the_front_end_is_where_it_should_be():
    """The engine checks its invariants after every step. Request 0 is sent at 0 and routed
    at 0.1; its first step ends at 0.12, while request 1 (sent at 0.05) is still in the front
    end until 0.15: that is a live request on no instance, which the check accepts (it failed
    the run with 'arrived ... but is on no instance' before it counted the front end)."""
    trace = make_trace([0.0, 0.05], [10, 10], [2, 2])
    res = simulate(trace, frontend={"request_s": 0.1, "tokenize_s_per_token": 0.0, "stream_s": 0.0},
                   simulation={"check": True})
    assert res.requests.sort_values("request_id")["routed_at"].tolist() == pytest.approx([0.1, 0.15])
