"""The `random` workload of vLLM's benchmark tools: synthetic prompts of fixed or drawn
lengths, an optional prefix shared by every prompt, and gamma arrivals (rate, burstiness).

Read from vLLM (vllm-project/vllm): `vllm/benchmarks/datasets/random.py` (`RandomDataset`:
lengths uniform around a mean by `range_ratio`, a random prefix of `prefix_len` tokens
prepended to every prompt) and `vllm/benchmarks/serve.py` (`get_request`: gamma gaps,
rescaled to count/rate; here `lmsim.workload.arrivals`). The explicit distributions follow
the `"distribution"` objects of vLLM's multi-turn benchmark
(`benchmarks/multi_turn/README.md`: constant, uniform, lognormal) plus the normal
mean/stddev that NVIDIA genai-perf's synthetic prompts use.

No tokenizer is involved: vLLM subtracts the tokenizer's special tokens from the input
length and re-tokenizes the decoded prompt, which moves lengths by a token or two; here a
prompt is exactly `prefix_len` + the drawn input length.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from lmsim.errors import ConfigError
from lmsim.workload.arrivals import arrivals_for_count, arrivals_for_duration, check_rate
from lmsim.workload.generators.base import Plan, build_trace, exp
from lmsim.workload.generators.registry import GENERATORS
from lmsim.workload.trace import Trace

DISTRIBUTIONS = {
    "constant": ("value",),
    "uniform": ("min", "max"),
    "lognormal": ("median", "sigma"),
    "normal": ("mean", "std"),
}


_NO_MAX = 1 << 40  # no request has a trillion tokens


class LengthSpec:
    """A token-length distribution: a fixed length L spread uniformly by `range_ratio` r
    over the integers [floor(L(1-r)), ceil(L(1+r))] (vLLM's `--random-range-ratio`), or a
    mapping `{distribution: NAME, ...}`:

    - `constant`: `value`
    - `uniform`: integers `min`..`max`, both included
    - `lognormal`: rint(`median` * exp(`sigma` * z)), z standard normal
    - `normal`: rint(`mean` + `std` * z)

    The drawn kinds are clipped to [`min`, `max`] where given (`min` defaults to `lowest`: 1,
    or 0 for an input behind a shared prefix); so is a range_ratio interval's low end,
    where vLLM would refuse a prompt that can come out empty."""

    def __init__(self, spec: Any, range_ratio: float, *, name: str, lowest: int) -> None:
        if isinstance(spec, bool) or not isinstance(spec, int | float | dict):
            raise ConfigError(f"generator random: {name} must be a token count or a "
                              f"{{distribution: ...}} mapping, got {spec!r}")
        if not isinstance(spec, dict):
            if spec != int(spec) or spec < 0:
                raise ConfigError(f"generator random: {name} must be a whole number >= 0, got {spec}")
            if not 0 <= range_ratio < 1:
                raise ConfigError(f"generator random: range_ratio must be in [0, 1), got {range_ratio}")
            self.kind = "uniform"
            self.args = {"min": max(math.floor(spec * (1 - range_ratio)), lowest),
                         "max": max(math.ceil(spec * (1 + range_ratio)), lowest)}
            self.clip = (self.args["min"], self.args["max"])
            return
        if range_ratio:
            raise ConfigError(f"generator random: range_ratio applies to a fixed {name}, not to a distribution")
        spec = dict(spec)
        kind = spec.pop("distribution", None)
        if kind not in DISTRIBUTIONS:
            raise ConfigError(f"generator random: {name}.distribution must be one of "
                              f"{', '.join(DISTRIBUTIONS)}, got {kind!r}")
        allowed = set(DISTRIBUTIONS[kind]) | ({"min", "max"} if kind in ("lognormal", "normal") else set())
        for key in spec:
            if key not in allowed:
                raise ConfigError(f"generator random: {name} ({kind}) has no field {key!r} "
                                  f"(fields: {', '.join(sorted(allowed))})")
        for key in DISTRIBUTIONS[kind]:
            if key not in spec:
                raise ConfigError(f"generator random: {name} ({kind}) needs {key!r}")
        for key, value in spec.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ConfigError(f"generator random: {name}.{key} must be a finite number, got {value!r}")
        self.kind, self.args = kind, spec
        if kind == "constant":
            lo = hi = int(spec["value"])
        else:
            lo, hi = int(spec.get("min", lowest)), int(spec.get("max", _NO_MAX))
        if lo < lowest or hi < lo:
            raise ConfigError(f"generator random: {name} needs {lowest} <= min <= max, got min {lo}, max {hi}")
        spread = DISTRIBUTIONS[kind][-1]
        if kind in ("lognormal", "normal") and spec[spread] < 0:
            raise ConfigError(f"generator random: {name}.{spread} must be >= 0")
        if kind == "lognormal" and spec["median"] <= 0:
            raise ConfigError(f"generator random: {name}.median must be > 0")
        self.clip = (lo, hi)

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        a = self.args
        if self.kind == "constant":
            return np.full(n, int(a["value"]), dtype=np.int64)
        if self.kind == "uniform":
            return rng.integers(int(a["min"]), int(a["max"]) + 1, size=n, dtype=np.int64)
        z = rng.standard_normal(n)
        x = a["median"] * exp(a["sigma"] * z) if self.kind == "lognormal" else a["mean"] + a["std"] * z
        return np.clip(np.rint(x), *self.clip).astype(np.int64)


@GENERATORS.register("random")
class RandomGenerator:
    """Synthetic requests as `vllm bench serve --dataset-name random` makes them.

    - `input_len` / `output_len`: a token count (vLLM's `--random-input-len` 1024 and
      `--random-output-len` 128), drawn uniformly from [floor(L(1-r)), ceil(L(1+r))] with
      `range_ratio` r (`--random-range-ratio`, default 0: fixed), or a distribution
      mapping (see `LengthSpec`), e.g. `{distribution: lognormal, median: 800, sigma: 1.0}`.
    - `prefix_len` (`--random-prefix-len`): tokens every prompt starts with, in addition to
      the drawn input length. Its full blocks have the same ids in every request, so
      prefix caching applies to them; every other block of every prompt has an id no
      other request uses.
    - `num_requests` (default 1000, vLLM's `--num-prompts`) or `duration_s`.
    - `rate` (req/s; `inf`, vLLM's default, sends every request at t = 0) and `burstiness`
      (gamma gaps, shape = burstiness, mean 1/rate; 1 = Poisson): see
      `lmsim.workload.arrivals`. `rescale` stretches the arrivals so the last one lands at
      num_requests/rate, as vLLM does (no effect with `duration_s`).
    Every request is its own session, so no request continues another (see
    `lmsim.workload.trace.continuation_rows`).
    """

    version = 1

    def __init__(
        self,
        *,
        num_requests: int | None = None,
        duration_s: float | None = None,
        input_len: Any = 1024,  # vLLM --random-input-len
        output_len: Any = 128,  # vLLM --random-output-len
        range_ratio: float = 0.0,  # vLLM --random-range-ratio
        prefix_len: int = 0,  # vLLM --random-prefix-len
        rate: float = math.inf,  # vLLM --request-rate
        burstiness: float = 1.0,  # vLLM --burstiness
        rescale: bool = True,
        block_size: int = 16,
    ) -> None:
        where = "generator random"
        if num_requests is not None and duration_s is not None:
            raise ConfigError(f"{where}: give only one of num_requests and duration_s")
        if num_requests is None and duration_s is None:
            num_requests = 1000
        if num_requests is not None and (isinstance(num_requests, bool) or not isinstance(num_requests, int) or num_requests < 1):
            raise ConfigError(f"{where}: num_requests must be a whole number >= 1, got {num_requests!r}")
        if duration_s is not None and not duration_s > 0:
            raise ConfigError(f"{where}: duration_s must be > 0, got {duration_s}")
        if isinstance(prefix_len, bool) or not isinstance(prefix_len, int) or prefix_len < 0:
            raise ConfigError(f"{where}: prefix_len must be a whole number >= 0, got {prefix_len!r}")
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ConfigError(f"{where}: block_size must be a whole number >= 1, got {block_size!r}")
        self.rate, self.burstiness = check_rate(rate, burstiness, where=where)
        self.input = LengthSpec(input_len, range_ratio, name="input_len", lowest=0 if prefix_len else 1)
        self.output = LengthSpec(output_len, range_ratio, name="output_len", lowest=1)
        self.num_requests, self.duration_s = num_requests, duration_s
        self.prefix_len, self.rescale, self.block_size = prefix_len, bool(rescale), block_size

    def generate(self, rng: np.random.Generator) -> Trace:
        if self.num_requests is not None:
            arrival = arrivals_for_count(rng, self.num_requests, self.rate, self.burstiness, rescale=self.rescale)
        else:
            arrival = arrivals_for_duration(rng, float(self.duration_s), self.rate, self.burstiness)
        n = len(arrival)
        inp = self.prefix_len + self.input.draw(rng, n)
        out = self.output.draw(rng, n)
        shared = self.prefix_len // self.block_size  # only whole blocks of it are identical
        plan = Plan(
            arrival=arrival, input_tokens=inp, output_tokens=out,
            chain=np.arange(n), keep=np.full(n, shared),
            chain_prefix_base=np.zeros(n, dtype=np.int64), chain_prefix_blocks=np.full(n, shared),
            session=np.arange(n), first_fresh_id=shared,
        )  # fmt: skip
        return build_trace(
            plan, block_size=self.block_size, start_s=0.0, end_s=self.duration_s,
            num_requests=self.num_requests, source="generator:random",
        )  # fmt: skip
