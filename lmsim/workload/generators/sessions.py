"""The closed-loop multi-turn client of zxuhan/llm-router's cloud benchmark (points.csv
A14: 4 x A100, vLLM 0.6.4, four routers, 4-24 concurrent sessions).

Read from zxuhan/llm-router: the trace generator `internal/trace/trace.go` (`Generate`),
the replayer `internal/trace/replay.go` (`Replayer.Replay`) and the cloud script
`bench/scripts/cloud-vllm.sh` (SESSIONS, TURNS 8, SYS_LEN 6144, MAX_TOKENS 64).

- Session i starts at a uniform offset in [0, `start_jitter_s`] (`SessionStartJitterMs`)
  and sends `turns` requests one after another: the replayer runs each session's turns in
  order in one goroutine and fires turn t at max(its scheduled offset start + t x
  `turn_gap_s` + U(0, 50 ms), the end of turn t-1). A 64-token answer takes far longer
  than the 40 ms gap, so turn t is sent when turn t-1's answer has been read: here
  `after_id` = the previous turn, delay 0 (lmsim's closed-loop rows; the estimate in
  `arrival_s` is the schedule).
- Messages: a system prompt `"system: be helpful and concise. "` padded with "s" to
  `system_chars` characters, shared by every session; in a `code_session_share` of the
  sessions a second system message `"// code context\\n"` padded with "c" to
  `code_context_chars`; turn t appends a user message `"turn t: "` + `user_chars` random
  characters, with probability `tool_loop_prob` an assistant "calling tool[t]" and a
  64-character tool result, sends the whole history, then appends the assistant message
  "ack t<t>": the history carries a placeholder, not the model's real answer, so a turn's
  answer is never re-sent. Run it with `cluster.cache_generated_blocks: false`, or lmsim
  would let the next turn hit blocks named after the answer that it does not contain.
- `max_tokens` output tokens per request (64 in the cloud runs; the model may stop earlier,
  which the published results do not say).

Token counts come from `lmsim.workload.text_tokens` over the messages, except for the
padding runs: a run of one repeated letter is one pre-tokenizer piece, which a BPE
vocabulary splits into many multi-letter tokens; the estimate cannot see that, so a run
counts `padding_chars_per_token` characters a token (4 by default: UNVERIFIED, no
tokenizer at hand). The published upstream prefix-cache share under prefix-aware routing
(94 %, `docs/results-cloud.md`) is what this choice can be checked against.
`Request.prompt_text` carries the real text (the padding unabridged).
"""

from __future__ import annotations

import numpy as np

from lmsim.errors import ConfigError
from lmsim.workload.generators.base import on_time_grid
from lmsim.workload.generators.benchmarks import _whole
from lmsim.workload.generators.registry import GENERATORS
from lmsim.workload.text_tokens import TokenStream
from lmsim.workload.trace import Trace

SYSTEM_HEAD = "system: be helpful and concise. "
CODE_HEAD = "// code context\n"


def _fraction(where: str, name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise ConfigError(f"{where}: {name} must be a number in [0, 1], got {value!r}")
    return float(value)


def _seconds(where: str, name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < float("inf"):
        raise ConfigError(f"{where}: {name} must be a finite number >= 0, got {value!r}")
    return float(value)


@GENERATORS.register("llm_router_sessions")
class LlmRouterSessionsGenerator:
    """zxuhan/llm-router's closed-loop multi-turn sessions (see the module docstring)."""

    version = 1

    def __init__(
        self,
        *,
        sessions: int = 12,
        turns: int = 8,
        system_chars: int = 6144,
        user_chars: int = 80,
        max_tokens: int = 64,
        code_context_chars: int = 1536,
        code_session_share: float = 0.4,
        tool_loop_prob: float = 0.3,
        start_jitter_s: float = 0.2,
        turn_gap_s: float = 0.04,
        padding_chars_per_token: float = 4.0,
        block_size: int = 16,
    ) -> None:
        where = "generator llm_router_sessions"
        self.sessions = _whole(where, "sessions", sessions, 1)
        self.turns = _whole(where, "turns", turns, 1)
        self.system_chars = _whole(where, "system_chars", system_chars, 0)
        self.user_chars = _whole(where, "user_chars", user_chars, 1)
        self.max_tokens = _whole(where, "max_tokens", max_tokens, 1)
        self.code_chars = _whole(where, "code_context_chars", code_context_chars, 0)
        self.block_size = _whole(where, "block_size", block_size, 1)
        self.code_share = _fraction(where, "code_session_share", code_session_share)
        self.tool_prob = _fraction(where, "tool_loop_prob", tool_loop_prob)
        self.jitter_s = _seconds(where, "start_jitter_s", start_jitter_s)
        self.gap_s = _seconds(where, "turn_gap_s", turn_gap_s)
        if isinstance(padding_chars_per_token, bool) or not isinstance(padding_chars_per_token, int | float) \
                or not padding_chars_per_token >= 1:
            raise ConfigError(f"{where}: padding_chars_per_token must be a number >= 1, got {padding_chars_per_token!r}")
        self.pad_per_token = float(padding_chars_per_token)

    def _padded(self, head: str, length: int, filler: str) -> tuple[str, str]:
        """(the text, what the token estimate reads): the padding run as words of
        `padding_chars_per_token` letters, one piece (about one token) each."""
        if len(head) >= length:
            return head, head
        pad = length - len(head)
        word = max(1, round(self.pad_per_token))
        proxy = head + " ".join(filler * word for _ in range(max(1, round(pad / self.pad_per_token))))
        return head + filler * pad, proxy

    def _random_chars(self, rng: np.random.Generator, n: int, filler: str) -> str:
        # llm-router's makeRandomString: filler XOR a random 6-bit value, per character
        return "".join(chr(ord(filler) ^ k) for k in rng.integers(0, 64, n).tolist())

    def generate(self, rng: np.random.Generator) -> Trace:
        system, system_proxy = self._padded(SYSTEM_HEAD, self.system_chars, "s")
        code, code_proxy = self._padded(CODE_HEAD, self.code_chars, "c")
        ids: dict[bytes, int] = {}
        rows: list[tuple[float, int, int]] = []  # (estimated send time, session, turn)
        texts: list[str] = []
        lengths: list[int] = []
        blocks: list[np.ndarray] = []
        for i in range(self.sessions):
            use_code = rng.random() < self.code_share
            start = float(rng.integers(0, round(self.jitter_s * 1000) + 1)) / 1000
            real: list[tuple[str, str]] = [("system", system)]
            proxy: list[tuple[str, str]] = [("system", system_proxy)]
            if use_code:
                real.append(("system", code))
                proxy.append(("system", code_proxy))
            for t in range(self.turns):
                user = f"turn {t}: " + self._random_chars(rng, self.user_chars, chr(ord("u") + i % 6))
                real.append(("user", user))
                proxy.append(("user", user))
                if rng.random() < self.tool_prob:
                    tool = [("assistant", f"calling tool[{t}]"), ("tool", self._random_chars(rng, 64, "t"))]
                    real.extend(tool)
                    proxy.extend(tool)
                stream = TokenStream(proxy)
                names = stream.block_names(stream.total, self.block_size)
                blocks.append(np.array([ids.setdefault(n, len(ids)) for n in names], dtype=np.int64))
                lengths.append(stream.total)
                # roles marked as a chat template would (the text routers hash)
                texts.append("".join(f"<|{role}|>{text}" for role, text in real))
                scheduled = start + t * self.gap_s + float(rng.integers(0, 50)) / 1000
                sent = max(scheduled, rows[-1][0]) if t else scheduled  # turns are serial
                rows.append((sent, i, t))
                ack = ("assistant", f"ack t{t}")
                real.append(ack)
                proxy.append(ack)
        # rows in order of their estimated send time; a session's turns keep their order
        order = sorted(range(len(rows)), key=lambda r: (rows[r][0], rows[r][1], rows[r][2]))
        position = {r: k for k, r in enumerate(order)}
        after = np.full(len(rows), -1, dtype=np.int64)
        for k, r in enumerate(order):
            _, _, t = rows[r]
            if t:
                after[k] = position[r - 1]  # generation order: turn t-1 is the row before
        counts = np.array([len(blocks[r]) for r in order], dtype=np.int64)
        offsets = np.zeros(len(order) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        session = np.array([rows[r][1] for r in order], dtype=np.int64)
        return Trace(
            arrival_s=on_time_grid(np.array([rows[r][0] for r in order])),
            input_tokens=np.array([lengths[r] for r in order], dtype=np.int64),
            output_tokens=np.full(len(order), self.max_tokens, dtype=np.int64),
            hash_offsets=offsets, hash_values=np.concatenate([blocks[r] for r in order]),
            block_size=self.block_size, session_id=session,
            parent_id=after.copy(), after_id=after, delay_s=np.zeros(len(order)),
            text_id=np.arange(len(order), dtype=np.int64), prompt_texts=tuple(texts[r] for r in order),
            source="generator:llm_router_sessions",
        ).compact()
