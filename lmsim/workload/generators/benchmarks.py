"""The shared-prefix workloads of the benchmark clients real-cluster results were measured
with: inference-perf's `shared_prefix`, SGLang's `generated-shared-prefix` and vLLM's
`prefix_repetition`. Each builds its prompts as text (random-token text, see
`lmsim.workload.generators.prompt_text`), so `Request.prompt_text` carries what the client
sent and token counts come from re-tokenising that text where the client does not force
them, as on a real server.

Every request is its own session (no request continues another: a repeated prompt is a
new request whose prefix the cache may hold, not a next turn).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from lmsim.errors import ConfigError
from lmsim.workload.arrivals import arrivals_for_count, check_rate
from lmsim.workload.generators.base import on_time_grid
from lmsim.workload.generators.prompt_text import exact_rows, random_token_text, rows_from_prompts
from lmsim.workload.generators.registry import GENERATORS
from lmsim.workload.ladder import (
    DEFAULT_INTERVAL_S,
    check_load_type,
    ladder,
    parse_stages,
    stage_meta,
)
from lmsim.workload.trace import Trace


def _whole(where: str, name: str, value: Any, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ConfigError(f"{where}: {name} must be a whole number >= {lo}, got {value!r}")
    return value


def prompt_trace(
    *, prompt_of_row: np.ndarray, texts: list[str], lengths: np.ndarray, blocks: list[np.ndarray],
    arrival: np.ndarray, output_tokens: np.ndarray, block_size: int, source: str,
    stage: np.ndarray | None = None, meta: dict[str, str] | None = None,
) -> Trace:
    """A trace whose row r sends prompt `prompt_of_row[r]` (of `texts`, with its token count
    and block ids) at `arrival[r]`; rows must already be in arrival order."""
    counts = np.array([len(b) for b in blocks], dtype=np.int64)[prompt_of_row]
    offsets = np.zeros(len(prompt_of_row) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    values = np.concatenate([blocks[p] for p in prompt_of_row.tolist()]) if len(prompt_of_row) else np.zeros(0, np.int64)
    trace = Trace(
        arrival_s=on_time_grid(arrival), input_tokens=lengths[prompt_of_row], output_tokens=output_tokens,
        hash_offsets=offsets, hash_values=values, block_size=block_size,
        session_id=np.arange(len(prompt_of_row)), stage=stage, text_id=prompt_of_row.astype(np.int64),
        prompt_texts=tuple(texts), source=source, meta=dict(meta or {}),
    )  # fmt: skip
    return trace.compact()


@GENERATORS.register("shared_prefix")
class SharedPrefixGenerator:
    """inference-perf's `shared_prefix` data with its load ladder (kubernetes-sigs/inference-perf).

    Prompts (`datagen/shared_prefix_datagen.py`, `SharedPrefixDataGenerator._generate_prompts`):
    `num_groups` system prompts of `system_prompt_len` random tokens, each with
    `num_prompts_per_group` questions of `question_len` random tokens; a prompt is
    `system + " " + question` as text, its length what re-tokenising it gives. The prompts
    are shuffled once (`random.shuffle`; here the seeded generator's permutation), and
    request n of a stage gets `prompts[n % len(prompts)]` (`load_lazy_data`: `data_index %
    len(self.prompts)`), n restarting at 0 every stage, so every stage walks the same
    permutation. `output_len` tokens are generated (ignore_eos, as the llm-d benchmarks set).
    Defaults are inference-perf's (`config.py` `SharedPrefix`: 10 groups x 10 prompts,
    system 100, question 50, output 50).

    `token_scale` multiplies the re-tokenised lengths: lmsim's synthetic text round-trips to
    its nominal length (`prompt_text`), a real tokenizer's does not. For Llama-3.1's
    tokenizer the llm-d "standard-scale-64p-cache-load" run counted 22,826,707 to 22,882,518
    input tokens over its 5,460 requests of nominally 3,500 + 512 tokens, one total per router
    (llm-d/llm-d-kv-cache-manager@c9ac9eef `analysis_metrics.csv`): x 1.042 to 1.045, 1.043 on
    average. Default 1 (no growth).

    Load (`loadgen/`, see `lmsim.workload.ladder`): `stages` `[{rate, duration}, ...]`,
    `load_type` `constant` (inference-perf's default) / `poisson` / `even`, `interval_s`
    between stages (1 s); with `barrier` (default, as inference-perf) a stage starts only
    when the previous one's requests are all done (`lmsim.engine.stages`). inference-perf
    has no default stages; here one stage of 1 req/s for 60 s.
    """

    version = 1

    def __init__(
        self,
        *,
        num_groups: int = 10,
        num_prompts_per_group: int = 10,
        system_prompt_len: int = 100,
        question_len: int = 50,
        output_len: int = 50,
        stages: Any = None,
        load_type: str = "constant",
        interval_s: float = DEFAULT_INTERVAL_S,
        barrier: bool = True,
        block_size: int = 16,
        token_scale: float = 1.0,
    ) -> None:
        where = "generator shared_prefix"
        self.num_groups = _whole(where, "num_groups", num_groups, 1)
        self.per_group = _whole(where, "num_prompts_per_group", num_prompts_per_group, 1)
        self.system_len = _whole(where, "system_prompt_len", system_prompt_len, 0)
        self.question_len = _whole(where, "question_len", question_len, 1)
        self.output_len = _whole(where, "output_len", output_len, 1)
        self.block_size = _whole(where, "block_size", block_size, 1)
        self.stages = parse_stages(stages if stages is not None else [{"rate": 1, "duration": 60}], where=where)
        self.load_type = check_load_type(load_type, where=where)
        if isinstance(interval_s, bool) or not isinstance(interval_s, int | float) or not 0 <= interval_s < math.inf:
            raise ConfigError(f"{where}: interval_s must be a finite number >= 0, got {interval_s!r}")
        if not isinstance(barrier, bool):
            raise ConfigError(f"{where}: barrier must be true or false, got {barrier!r}")
        self.interval_s, self.barrier = float(interval_s), barrier
        if isinstance(token_scale, bool) or not isinstance(token_scale, int | float) or not 0 < token_scale < math.inf:
            raise ConfigError(f"{where}: token_scale must be a finite number > 0, got {token_scale!r}")
        self.token_scale = float(token_scale)

    def generate(self, rng: np.random.Generator) -> Trace:
        texts = []
        for _ in range(self.num_groups):
            system = random_token_text(rng, self.system_len)
            texts.extend(system + " " + random_token_text(rng, self.question_len) for _ in range(self.per_group))
        order = rng.permutation(len(texts))
        texts = [texts[i] for i in order.tolist()]
        lengths, blocks = rows_from_prompts(texts, self.block_size, self.token_scale)
        arrival, stage, starts = ladder(rng, self.load_type, self.stages, self.interval_s)
        # request n of a stage: prompts[n % len(prompts)], n from 0 in every stage
        first = np.searchsorted(stage, stage, side="left")
        prompt_of_row = (np.arange(len(stage)) - first) % len(texts)
        meta = {**stage_meta(starts, self.interval_s, self.barrier), "stage_rates": ",".join(repr(s.rate) for s in self.stages)}
        return prompt_trace(
            prompt_of_row=prompt_of_row, texts=texts, lengths=lengths, blocks=blocks, arrival=arrival,
            output_tokens=np.full(len(stage), self.output_len), block_size=self.block_size,
            source="generator:shared_prefix", stage=stage, meta=meta,
        )  # fmt: skip


@GENERATORS.register("generated_shared_prefix")
class GeneratedSharedPrefixGenerator:
    """SGLang's `bench_serving --dataset-name generated-shared-prefix` (sgl-project/sglang,
    `python/sglang/bench_serving.py`, `sample_generated_shared_prefix_requests` and
    `get_request`).

    `num_groups` system prompts of `system_prompt_len` random tokens (`gen_prompt`: random
    vocabulary entries, decoded), `num_groups x prompts_per_group` questions of
    `question_len`; prompt = `system + "\\n\\n" + question`, its length the re-tokenised
    text's (`len(tokenizer.encode(full_prompt))`); every prompt is sent once, in one shuffled
    order (`random.shuffle(input_requests)`), each generating `output_len` tokens. Defaults
    are the script's `--gsp-*` defaults (64 groups x 16 prompts, system 2048, question 128,
    output 256). Arrivals (`get_request`): the first request at t = 0, then exponential gaps
    of mean 1/`rate` (no rescaling); `rate` inf (the default) sends all at t = 0.
    """

    version = 1

    def __init__(
        self,
        *,
        num_groups: int = 64,
        prompts_per_group: int = 16,
        system_prompt_len: int = 2048,
        question_len: int = 128,
        output_len: int = 256,
        rate: float = math.inf,
        block_size: int = 16,
    ) -> None:
        where = "generator generated_shared_prefix"
        self.num_groups = _whole(where, "num_groups", num_groups, 1)
        self.per_group = _whole(where, "prompts_per_group", prompts_per_group, 1)
        self.system_len = _whole(where, "system_prompt_len", system_prompt_len, 0)
        self.question_len = _whole(where, "question_len", question_len, 1)
        self.output_len = _whole(where, "output_len", output_len, 1)
        self.block_size = _whole(where, "block_size", block_size, 1)
        self.rate, _ = check_rate(rate, 1.0, where=where)

    def generate(self, rng: np.random.Generator) -> Trace:
        systems = [random_token_text(rng, self.system_len) for _ in range(self.num_groups)]
        texts = [
            systems[i // self.per_group] + "\n\n" + random_token_text(rng, self.question_len)
            for i in range(self.num_groups * self.per_group)
        ]
        texts = [texts[i] for i in rng.permutation(len(texts)).tolist()]
        lengths, blocks = rows_from_prompts(texts, self.block_size)
        n = len(texts)
        if math.isinf(self.rate):
            arrival = np.zeros(n)
        else:
            arrival = np.concatenate(([0.0], np.cumsum(rng.exponential(1.0 / self.rate, n - 1))))
        return prompt_trace(
            prompt_of_row=np.arange(n), texts=texts, lengths=lengths, blocks=blocks, arrival=arrival,
            output_tokens=np.full(n, self.output_len), block_size=self.block_size,
            source="generator:generated_shared_prefix",
        )  # fmt: skip


@GENERATORS.register("prefix_repetition")
class PrefixRepetitionGenerator:
    """vLLM's `bench serve --dataset-name prefix_repetition` (vllm-project/vllm,
    `vllm/benchmarks/datasets`, `PrefixRepetitionRandomDataset.sample`).

    `num_prefixes` random prefixes of `prefix_len` tokens, each followed by
    `num_requests // num_prefixes` random suffixes of `suffix_len` tokens (so up to
    num_prefixes - 1 fewer requests than asked, as vLLM); the list is shuffled
    (`random.shuffle`). vLLM adjusts the random ids until decode + re-encode gives exactly
    the target (`gen_prompt_decode_to_target_len`), so lengths here are exact:
    prefix_len + suffix_len. Defaults are vLLM's (256, 256, 10 prefixes, output 128,
    1000 prompts). Arrivals: vLLM's gamma gaps (`rate`, `burstiness`, `rescale`; see
    `lmsim.workload.arrivals`), `rate` inf by default.
    """

    version = 1

    def __init__(
        self,
        *,
        num_requests: int = 1000,
        prefix_len: int = 256,
        suffix_len: int = 256,
        num_prefixes: int = 10,
        output_len: int = 128,
        rate: float = math.inf,
        burstiness: float = 1.0,
        rescale: bool = True,
        block_size: int = 16,
    ) -> None:
        where = "generator prefix_repetition"
        self.num_requests = _whole(where, "num_requests", num_requests, 1)
        self.prefix_len = _whole(where, "prefix_len", prefix_len, 0)
        self.suffix_len = _whole(where, "suffix_len", suffix_len, 0)
        if self.prefix_len + self.suffix_len < 1:
            raise ConfigError(f"{where}: prefix_len + suffix_len must be >= 1")
        self.num_prefixes = _whole(where, "num_prefixes", num_prefixes, 1)
        if self.num_requests < self.num_prefixes:
            raise ConfigError(f"{where}: num_requests ({num_requests}) must be >= num_prefixes ({num_prefixes})")
        self.output_len = _whole(where, "output_len", output_len, 1)
        self.block_size = _whole(where, "block_size", block_size, 1)
        self.rate, self.burstiness = check_rate(rate, burstiness, where=where)
        self.rescale = bool(rescale)

    def generate(self, rng: np.random.Generator) -> Trace:
        per_prefix = self.num_requests // self.num_prefixes
        parts: list[list[tuple[str, int]]] = []
        for _ in range(self.num_prefixes):
            prefix = random_token_text(rng, self.prefix_len)
            for _ in range(per_prefix):
                parts.append([(prefix, self.prefix_len), (random_token_text(rng, self.suffix_len), self.suffix_len)])
        parts = [parts[i] for i in rng.permutation(len(parts)).tolist()]
        lengths, blocks = exact_rows([[seg for seg in p if seg[1]] for p in parts], self.block_size)
        texts = ["".join(text for text, _ in p) for p in parts]
        n = len(texts)
        arrival = arrivals_for_count(rng, n, self.rate, self.burstiness, rescale=self.rescale)
        return prompt_trace(
            prompt_of_row=np.arange(n), texts=texts, lengths=lengths, blocks=blocks, arrival=arrival,
            output_tokens=np.full(n, self.output_len), block_size=self.block_size,
            source="generator:prefix_repetition",
        )  # fmt: skip
