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
not modelled: each delay is per request, independent of load, except on the gateway's
body path below.

The gateway's body path (`gateway_bytes_per_s`, off unless set). In llm-d and the Gateway
API Inference Extension (GIE) the endpoint picker (EPP) sits in Envoy's ext_proc chain: Envoy
streams the request body to the EPP in chunks, and the EPP decides only once it has the whole
body and has parsed it (GIE `pkg/epp/handlers/server.go`, `StreamingServer.Process`). That
path is a shared server whose cost grows with the body: GIE issue #2928 (kubernetes-sigs/
gateway-api-inference-extension, 2026-05; the same measurement as llm-d/llm-d-router #1109)
drove EPP v1.5.0 behind an Istio gateway with 4 near-instant `llm-d-inference-sim` backends
and 220 KB prompts on a 24-CPU KIND host: throughput stayed at 121-133 req/s from
concurrency 20 to 200 while mean TTFT grew 154 -> 1,453 ms, i.e. concurrency / throughput
(Little's law for a closed loop against one bottleneck); the EPP's own scheduling took ~11 ms
of it, body streaming the rest. lmsim models it as one FIFO server whose service time is
the body's bytes over `gateway_bytes_per_s`: 220 KB x 129 req/s = 28.4e6 bytes/s
reproduces that plateau (a test pins the arithmetic), and the same server at concurrency 20
gives 20 / 129 = 155 ms. The issue gives no point at low concurrency, so no fixed per-request
share is split out (`gateway_s` adds one, unqueued). A body is the prompt text's UTF-8 bytes,
or `body_bytes_per_token` x prompt tokens without text. On llm-d's 37-capacity ladder (points.csv
A2: 9,000-token random-token prompts, ~40 KB, 1.4 ms each; at most 20 req/s, so the server is
at most 3% busy) switching it on raised lmsim's mean TTFT by 1.3-1.4 ms per stage (precise
scorer, 3 to 20 req/s): the ~0.2 s by which that cluster's TTFT exceeds lmsim's is not this
path (docs/explanation/real-clusters.md traces it).

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
~0.2 s by which the llm-d "37-capacity" cluster's low-load TTFT exceeds lmsim's (points.csv
A2, precise scorer: 242-304 ms measured, 51-95 ms in lmsim with this front end and the
gateway body path below). The gateway's body path is measured and small there; the report's
own streams say where the rest is: see docs/explanation/real-clusters.md, A2.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class FrontEnd:
    """Per-request delays, plus the gateway body path's queue; the defaults are
    `lmsim.config.FrontEndConfig`'s (see above). One per simulation: it holds that queue."""

    request_s: float
    gateway_s: float
    tokenize_s_per_token: float
    stream_s: float
    gateway_bytes_per_s: float | None = None
    body_bytes_per_token: float = 4.0
    _gateway_free_at: float = field(default=0.0, init=False, repr=False)

    @classmethod
    def from_config(cls, section: Any) -> FrontEnd | None:
        """The front end a config's `frontend:` section describes, or None when it is absent
        (the default: no client-side latency, as before)."""
        if section is None:
            return None
        return cls(
            section.request_s, section.gateway_s, section.tokenize_s_per_token, section.stream_s,
            section.gateway_bytes_per_s, section.body_bytes_per_token,
        )

    def ingress_s(self, input_tokens: int) -> float:
        """Send to router without the gateway's queue: HTTP handling, gateway hop, tokenisation."""
        return self.request_s + self.gateway_s + self.tokenize_s_per_token * input_tokens

    def body_bytes(self, input_tokens: int, prompt_text: str = "") -> float:
        """The request body the gateway streams: the prompt's UTF-8, or its tokens' estimate."""
        if prompt_text:
            return float(len(prompt_text.encode()))
        return self.body_bytes_per_token * input_tokens

    def routed_at(self, sent_at: float, input_tokens: int, prompt_text: str = "") -> float:
        """When the router sees a request the client sends at `sent_at`. Calls must come in
        send order (the arrival process's), which is the gateway queue's FIFO order."""
        ready = sent_at
        if self.gateway_bytes_per_s is not None:
            start = max(sent_at, self._gateway_free_at)
            ready = self._gateway_free_at = start + self.body_bytes(input_tokens, prompt_text) / self.gateway_bytes_per_s
        return ready + self.ingress_s(input_tokens)
