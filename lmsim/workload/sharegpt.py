"""ShareGPT conversations as requests, the way vLLM's benchmarks sample them.

The input is a JSON list (or JSON lines) of `{"id": ..., "conversations": [{"from":
"human", "value": "..."}, {"from": "gpt", "value": "..."}, ...]}`. Read from vLLM
(vllm-project/vllm): `vllm/benchmarks/datasets/sharegpt.py` (`ShareGPTDataset`: entries
with fewer than two messages dropped, the rest shuffled with Python's `random` seeded by
`--seed`, message 0 the prompt and message 1's length the output length, whatever their
roles; `is_valid_sequence` drops pairs with a prompt or output under 4 tokens, a prompt over
1,024 or a total over 2,048), and `benchmarks/multi_turn/convert_sharegpt_to_openai.py`
(roles: human/user are the user, gpt/bing/chatgpt/bard the assistant; a conversation
opening with another role skips that message).

`turns: first` (default) is vLLM's `bench serve --dataset-name sharegpt`: one request per
conversation. `turns: all` makes every (user, reply) pair a request whose prompt is the
whole history up to and including that user message, so prefix caching applies across
turns; a conversation stops at the first message out of the user/assistant alternation.
Turn k+1 is sent `think_time_s` after turn k finishes (closed loop, as vLLM's multi-turn
benchmark client sends the next turn on the answer); its `arrival_s` is only the estimate
start + k * think_time_s. In both modes the length filters apply to every request, and
in `turns: all` a failing turn ends its conversation (every later turn carries it).

Lengths and block ids come from `lmsim.workload.text_tokens` (no tokenizer: a measured
estimate). A prompt is its messages' text alone, without a chat template (a chat endpoint
adds a few tokens per message). Block ids are numbered densely in order of first
appearance, conversation by conversation in the (shuffled) order. Arrivals: conversation
starts (`turns: first`: requests) follow `lmsim.workload.arrivals` with `rate` and
`burstiness`, drawn from numpy's generator seeded by `seed`, on a microsecond grid.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from lmsim.errors import ConfigError
from lmsim.workload.arrivals import arrivals_for_count, check_rate
from lmsim.workload.generators.base import on_time_grid
from lmsim.workload.text_tokens import TokenStream, estimate_tokens
from lmsim.workload.trace import Trace

USER_ROLES = frozenset({"human", "user"})
ASSISTANT_ROLES = frozenset({"gpt", "bing", "chatgpt", "bard", "assistant"})
Bad = Callable[[int, str, str], None]  # (line, problem, where): raises unless skipping


class ShareGPTOptions:
    """The `sharegpt` format's parameters (`workload.format: {name: sharegpt, params: {...}}`,
    `lmsim trace convert --param K=V`):

    - `turns`: `first` (one request per conversation, vLLM's) or `all` (every turn)
    - `rate` (req/s, or conversations/s with `turns: all`; default inf: all at t = 0),
      `burstiness` (1 = Poisson), `rescale` (last start at count/rate, as vLLM), `seed`
    - `shuffle`: shuffle conversations with Python's `random.Random(seed)`, as vLLM does
      (so `workload.limit: N` takes vLLM's `--num-prompts N` sample)
    - `min_tokens` 4, `max_prompt_tokens` 1024, `max_total_tokens` 2048: vLLM's filter;
      null disables one (a request still needs at least one prompt and one output token)
    - `output_len`: every output this long instead of the reply's length (vLLM's
      `--sharegpt-output-len`; `turns: first` only, as later turns hold the real reply)
    - `think_time_s`: gap between a reply and the next turn (`turns: all`)
    - `token_scale`: multiplies the token estimate (1.0: Qwen's vocabulary; see
      `lmsim.workload.text_tokens` for Llama-2's factors)
    - `block_size`: tokens per block id (16, the engine's block)
    """

    def __init__(
        self, *, turns: str = "first", rate: float = math.inf, burstiness: float = 1.0,
        rescale: bool = True, seed: int = 0, shuffle: bool = True, min_tokens: int | None = 4,
        max_prompt_tokens: int | None = 1024, max_total_tokens: int | None = 2048,
        output_len: int | None = None, think_time_s: float = 0.0, token_scale: float = 1.0,
        block_size: int = 16,
    ) -> None:  # fmt: skip
        where = "format sharegpt"
        if turns not in ("first", "all"):
            raise ConfigError(f"{where}: turns must be 'first' or 'all', got {turns!r}")
        self.rate, self.burstiness = check_rate(rate, burstiness, where=where)
        for name, value in (("min_tokens", min_tokens), ("max_prompt_tokens", max_prompt_tokens),
                            ("max_total_tokens", max_total_tokens), ("output_len", output_len)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(f"{where}: {name} must be a whole number >= 1 or null, got {value!r}")
        for name, value in (("seed", seed), ("block_size", block_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < (1 if name == "block_size" else 0):
                raise ConfigError(f"{where}: {name} must be a whole number, got {value!r}")
        if output_len is not None and turns == "all":
            raise ConfigError(f"{where}: output_len applies to turns: first only (a later turn's history holds the real reply)")
        if not (isinstance(think_time_s, int | float) and think_time_s >= 0):
            raise ConfigError(f"{where}: think_time_s must be >= 0, got {think_time_s!r}")
        if not (isinstance(token_scale, int | float) and token_scale > 0):
            raise ConfigError(f"{where}: token_scale must be > 0, got {token_scale!r}")
        self.turns, self.rescale, self.seed, self.shuffle = turns, bool(rescale), seed, bool(shuffle)
        self.min_tokens = max(min_tokens or 1, 1)
        self.max_prompt, self.max_total = max_prompt_tokens, max_total_tokens
        self.output_len, self.think_time_s = output_len, float(think_time_s)
        self.scale, self.block_size = float(token_scale), block_size

    def keeps(self, prompt: int, output: int) -> bool:
        """vLLM's `is_valid_sequence` (min output waived with a fixed `output_len`)."""
        if prompt < self.min_tokens or (output < self.min_tokens and self.output_len is None) or output < 1:
            return False
        if self.max_prompt is not None and prompt > self.max_prompt:
            return False
        return self.max_total is None or prompt + output <= self.max_total


def read_conversations(entries: Iterable[tuple[int, int, Any]], bad: Bad, *, first_only: bool) -> tuple[list[list[tuple[str, str]]], int]:
    """(conversations as [(role, text)], number with fewer than two messages). Entries are
    (line, index, parsed JSON value); a malformed one goes to `bad`."""
    kept: list[list[tuple[str, str]]] = []
    short = 0
    for line, index, entry in entries:
        where = f"entry {index}"
        if not isinstance(entry, dict):
            bad(line, f"must be a JSON object, got {type(entry).__name__}", where)
            continue
        messages = entry.get("conversations")
        if not isinstance(messages, list):
            bad(line, "conversations is missing or not a list", where)
            continue
        parsed: list[tuple[str, str]] = []
        for k, m in enumerate(messages[:2] if first_only else messages):
            if not (isinstance(m, dict) and isinstance(m.get("from"), str) and isinstance(m.get("value"), str)):
                bad(line, f"conversations[{k}] needs string fields 'from' and 'value'", where)
                break
            parsed.append((m["from"], m["value"]))
        else:
            if len(parsed) < 2:
                short += 1
            else:
                kept.append(parsed)
    return kept, short


def _turns(messages: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The messages from the first user message on, while they alternate user/assistant,
    cut to whole (user, reply) pairs."""
    start = next((i for i, (role, _) in enumerate(messages) if role in USER_ROLES), len(messages))
    out: list[tuple[str, str]] = []
    for role, text in messages[start:]:
        wanted = USER_ROLES if len(out) % 2 == 0 else ASSISTANT_ROLES
        if role not in wanted:
            break
        out.append(("user" if len(out) % 2 == 0 else "assistant", text))
    return out[: len(out) // 2 * 2]


def conversations_to_trace(
    conversations: list[list[tuple[str, str]]], opt: ShareGPTOptions, *, source: str, too_short: int,
) -> Trace:
    if opt.shuffle:
        random.Random(opt.seed).shuffle(conversations)
    ids: dict[bytes, int] = {}
    inp: list[int] = []
    out: list[int] = []
    turn: list[int] = []
    conv: list[int] = []
    names: list[list[int]] = []
    filtered = 0
    sessions = 0
    for messages in conversations:
        used = [("", messages[0][1])] if opt.turns == "first" else _turns(messages)
        if not used:
            too_short += 1
            continue
        stream = TokenStream(used, opt.scale)
        pairs = 1 if opt.turns == "first" else len(used) // 2
        for k in range(pairs):
            prompt = stream.message_ends[2 * k] if opt.turns == "all" else stream.total
            if opt.output_len is not None:
                reply = opt.output_len
            elif opt.turns == "all":
                reply = stream.message_ends[2 * k + 1] - prompt
            else:
                reply = estimate_tokens(messages[1][1], opt.scale).count
            if not opt.keeps(prompt, reply):
                filtered += pairs - k if opt.turns == "all" else 1
                break
            inp.append(prompt)
            out.append(reply)
            turn.append(k)
            conv.append(sessions)
            names.append([ids.setdefault(name, len(ids)) for name in stream.block_names(prompt, opt.block_size)])
        if conv and conv[-1] == sessions:  # this conversation made at least one request
            sessions += 1
    n = len(inp)
    if n == 0:
        raise ConfigError(f"{source}: no ShareGPT request passes the filters "
                          f"({len(conversations)} conversations, {too_short} too short, {filtered} requests filtered)")
    turn_a, conv_a = np.asarray(turn, dtype=np.int64), np.asarray(conv, dtype=np.int64)
    starts = arrivals_for_count(np.random.default_rng(opt.seed), int(conv_a[-1]) + 1, opt.rate, opt.burstiness,
                                rescale=opt.rescale)
    arrival = on_time_grid(starts[conv_a] + turn_a * opt.think_time_s)
    previous = np.where(turn_a > 0, np.arange(n) - 1, -1)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum([len(x) for x in names], out=offsets[1:])
    trace = Trace(
        arrival_s=arrival, input_tokens=np.asarray(inp), output_tokens=np.asarray(out),
        hash_offsets=offsets, hash_values=np.fromiter((x for row in names for x in row), dtype=np.int64, count=int(offsets[-1])),
        block_size=opt.block_size, session_id=conv_a,
        parent_id=previous if opt.turns == "all" else None,
        after_id=previous if opt.turns == "all" else None,
        delay_s=np.where(turn_a > 0, opt.think_time_s, 0.0) if opt.turns == "all" else None,
        source=source,
    )  # fmt: skip
    trace = trace.take(np.argsort(trace.arrival_s, kind="stable"))
    trace.meta.update({
        "conversations": str(len(conversations)), "conversations_too_short": str(too_short),
        "requests_filtered": str(filtered), "turns": opt.turns, "seed": str(opt.seed),
        "token_estimate": f"text_tokens pieces, scale {opt.scale}",
    })  # fmt: skip
    return trace
