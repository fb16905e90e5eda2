"""The client-side latency path: what lies between a benchmark client and the engine.

A client measures TTFT from sending the request to reading the first streamed token, so it
also counts the HTTP front end (the API server's request handling, a gateway hop and its
scheduler), tokenising the prompt before the engine sees it, and detokenising and streaming
each token back. lmsim's engine times none of that. `FrontEnd` adds it per request:

- ingress, before the router sees the request: `request_s` (API server: HTTP parse,
  request validation, handing the request to the engine) + `gateway_s` (an L7 gateway
  and its endpoint picker in front of the instances; 0 for clients that call the
  servers directly) + `tokenize_s_per_token` x prompt tokens;
- egress, after the engine produces a token: `stream_s` (detokenise, SSE framing, network)
  for every token, so the first token and the last reach the client `stream_s` late: TTFT
  and E2E grow by it, inter-token gaps do not.

So a request sent at t reaches the router at t + ingress; its recorded `arrived_at` is t
(the client's send time) and `routed_at` the router's (`queue_s` counts the ingress too); `first_token_at` and `finished_at`
are when the client sees them. A closed-loop client (sessions, a stage barrier) reacts to
the client-side finish. Queueing inside the front end (a saturated API-server process) is
not modelled: each delay is per request, independent of load.

Defaults (`frontend: {}` in an experiment; the vLLM/SGLang API server alone, no gateway), from the published single-instance
sweeps at their lowest rate against lmsim's own TTFT there (points.csv, kind b):

- SGLang 0.3, Llama-3.1-8B, 1 x A100-80GB, ShareGPT at 4 req/s (sgl-project/sglang
  `benchmark/benchmark_vllm_060/README.md`): TTFT p50 31.98 ms; lmsim (profile built by
  `lmsim profile new --model llama-3.1-8b --gpu a100 --engine sglang-0.4`, 220 in / 200 out
  at 4 req/s, Poisson) 25.8 ms, with TPOT 12.5 vs 13.17 ms measured (the engine timing
  agrees within 5 %): 6.2 ms unexplained.
- vLLM 0.22 V1, Qwen3-4B, RTX 5090, 1024 in / 128 out at 1 req/s (openinfer
  `docs/benchmarks/qwen3-4b-serving-vllm-rtx5090.md`): TTFT p50 57.8 ms; lmsim 71.3 ms on an
  uncalibrated RTX 5090 spec (TPOT 7.6 vs 6.65 ms measured: the engine is priced 14 % slow),
  scaled by that ratio 62.4 ms: no room for more than a few ms of front end. On the shipped,
  calibrated RTX 5090 with async scheduling (benchmarks/real_clusters B2, these defaults
  included) lmsim gives 56.8 ms at TPOT 6.89 ms: the same conclusion.
- NVIDIA NIM (TensorRT-LLM), Llama-3.3-70B FP8 TP2 on H100, concurrency 1: TTFT 47.77 ms
  at 500 input tokens and 406.77 ms at 5,000; the line through them meets 0 tokens at
  7.9 ms, which holds the fixed overhead and one step.

So the API server costs a few ms: `request_s` 5 ms, `stream_s` 1 ms, and tokenisation at
1 us a token (Hugging Face `tokenizers`' README: "less than 20 seconds to tokenize a GB of
text" on a server CPU, i.e. ~12M tokens/s over all cores; one request is tokenised on one
core, ~1M tokens/s), which is 0.2 ms for the 220-token prompts above and 9 ms for a
9,000-token prompt: together the 6 ms of the SGLang point. These defaults do NOT explain the
few hundred ms by which real llm-d clusters' low-load TTFT exceeds lmsim's; that gap lies
in the gateway path (`gateway_s`, which has no published per-hop measurement to default
from) or elsewhere in those deployments, and is left to be set per deployment. Measured on
the llm-d "37-capacity" ladder (points.csv A2: 83 x 3 prompts of 8,000 + 1,000 tokens,
output 1,000, constant stages 3-20 req/s with the barrier; 4 x Llama-3.1-70B on an H100 TP4
profile, 28,836 KV blocks a pod; `llmd_scorer` 2/1/1 with the events view and the llm-d
metrics path): with these defaults lmsim's per-stage mean TTFT is 52-94 ms against
242-270 ms measured for the precise scorer, while its output tok/s is within 6-14 % of the
measured (mean over stages 5,813 vs 5,381); a `gateway_s` near 0.19 s would close the TTFT
gap, which the published setup does not explain.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class FrontEnd:
    """Per-request delays; the defaults are `lmsim.config.FrontEndConfig`'s (see above)."""

    request_s: float
    gateway_s: float
    tokenize_s_per_token: float
    stream_s: float

    @classmethod
    def from_config(cls, section: Any) -> FrontEnd | None:
        """The front end a config's `frontend:` section describes, or None when it is absent
        (the default: no client-side latency, as before)."""
        if section is None:
            return None
        return cls(section.request_s, section.gateway_s, section.tokenize_s_per_token, section.stream_s)

    def ingress_s(self, input_tokens: int) -> float:
        """Send to router: the request's HTTP handling, gateway hop and tokenisation."""
        return self.request_s + self.gateway_s + self.tokenize_s_per_token * input_tokens
