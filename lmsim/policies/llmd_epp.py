"""llm-d's EndpointPicker (EPP) as llm-d runs it: an `EndpointPickerConfig` plugin list and its
scheduling profile, each scorer computed as its source computes it (issue 33, item 3).

`router: {policy: llmd_epp, params: <EndpointPickerConfig>}` takes the EPP's own YAML (paste
`plugins:` and `schedulingProfiles:`; `apiVersion`/`kind` may come along), or
`params: {preset: <name>}` for the configurations of a published benchmark (`PRESETS`).

Sources, at the versions the llm-d benchmarks of mid-2025 ran (the A2 "37-capacity" report,
`llm-d/llm-d-kv-cache-manager@edb766fd benchmarking/37-capacity/README.md`, configures
`prefix-cache-scorer` with `mode: cache_tracking`, a form llm-d-inference-scheduler accepted
only until its scorers were split on 2025-08-31 (`aecee68d`, #323); that tree pins
gateway-api-inference-extension (GIE) v0.5.1 and llm-d-kv-cache-manager v0.2.1):

* GIE v0.5.1 (`978c23bb`) `pkg/epp/scheduling/framework/scheduler_profile.go`
  `runScorerPlugins`: total_i = sum over scorers of weight * score_i (no division by the sum
  of weights); `plugins/picker/max_score_picker.go` `Pick`: shuffle, stable sort by score,
  first = uniformly random among the maxima; `random_picker.go`: uniformly random pod.
* Each scorer's source is cited on its class.

Measured against the llm-d reports with the presets (4 x H100 qwen2-7b standing in for
70B pods, the reports' KV per pod, workloads and stages as token-id traces, scraped load):
A2 (working set 37% of KV) mean TTFT precise 0.03 s < estimate 3.2 s < load 16.1 s ~ random
16.8 s, the report's order (0.26 < 25.3 < 40.7 ~ 40.9 s); A4 (working set 1.25x KV, rates
x6 to overload the smaller model as the 70B pods were) precise 21.7 s against 23.9-25.0 s
for the rest, 12% better than random as in the report (31.9 vs 36.0 s, the rest 36.0-38.0).

The weights are the profile's `weight`; a scorer without one weighs 1 (GIE v1.0
`pkg/epp/config/loader/defaults.go` `DefaultScorerWeight`; v0.5.1 refused the config).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from lmsim.engine.request import Request
from lmsim.policies._common import check_choice, check_number, id_bound, listed_ids, pick_min
from lmsim.policies.base import POLICIES, ClusterView, Policy, RouterContext

_HASH_BYTES = 8  # xxhash64 in GIE; blake2b-64 here: any stable 64-bit hash matches alike


class EppScorer:
    """One `Scorer` plugin: a score in [0, 1] per pod; router-local state via the hooks."""

    type_name = "?"
    # EPP parameter (YAML, camelCase) -> default; anything else is rejected.
    defaults: dict[str, Any] = {}

    def __init__(self, params: dict[str, Any], where: str) -> None:
        for key in params:
            if key not in self.defaults:
                known = ", ".join(sorted(self.defaults)) or "none"
                raise ValueError(f"{where}: {self.type_name} has no parameter {key!r} (known: {known})")
        self.p = {**self.defaults, **params}
        self.where = where

    def bind(self, ctx: RouterContext) -> None:
        self.ctx = ctx

    def score(self, request: Request, cluster: ClusterView) -> list[float]:  # pragma: no cover
        raise NotImplementedError

    def on_routed(self, request: Request, instance_id: int) -> None:
        pass

    def on_finished(self, request: Request) -> None:
        pass

    def _number(self, key: str, **limits: Any) -> Any:
        try:
            return check_number(key, self.p[key], **limits)
        except ValueError as exc:
            raise ValueError(f"{self.where}: {exc}") from None


# ---------------------------------------------------------------- approximate prefix scorer
def chars_blocks(text: bytes, block: int, max_blocks: int) -> list[bytes]:
    """GIE v1.0 `hashPrompt`'s blocks of the prompt bytes: truncated to `max_blocks * block`
    bytes, the first block whole or (a prompt shorter than one block) the whole prompt, then
    every further full block; a partial last block is dropped."""
    text = text[: block * max_blocks]
    first = [text[:block]]
    return first + [text[i : i + block] for i in range(block, len(text) - block + 1, block)]


def chained_hashes(blocks: list[bytes]) -> list[int]:
    """hash(0) = H(block 0); hash(i) = H(block i + hash(i-1)): a block's hash names the whole
    prefix through it (GIE `hashPrompt`)."""
    out: list[int] = []
    prev = b""
    for b in blocks:
        digest = hashlib.blake2b(b + prev, digest_size=_HASH_BYTES).digest()
        out.append(int.from_bytes(digest, "little"))
        prev = digest
    return out


def token_blocks_as_chars(
    request: Request, block_chars: int, max_blocks: int, chars_per_token: float, engine_block: int
) -> list[Any]:
    """Character-block names for a request without prompt text (token-id traces).

    The prompt is taken to be `chars_per_token` x input_tokens characters long (GIE's own
    sizing assumes 4 characters per token: `DefaultHashBlockSize` 64 = 16 tokens x 4). Block k
    covers characters [k·C, (k+1)·C), i.e. tokens up to t = ceil((k+1)·C / chars_per_token);
    it is named by the trace's chained name of the engine block holding token t, which is
    equal for two prompts iff they agree through that engine block, with k to tell apart
    character blocks inside one engine block. A block whose engine block the trace does not
    name is unique to the request. The approximation: two prompts that diverge inside an
    engine block share character blocks up to the divergence with text, and only up to the
    engine block before it here (at most one character block less matched)."""
    nchars = int(request.input_tokens * chars_per_token)
    nchars = min(nchars, block_chars * max_blocks)
    count = max(1, nchars // block_chars)
    names: list[Any] = []
    hashes = request.block_hashes
    for k in range(count):
        end_char = min(nchars, (k + 1) * block_chars)
        last_token = max(1, math.ceil(end_char / chars_per_token))
        j = (last_token - 1) // engine_block
        if j < len(hashes):
            names.append((hashes[j], k))
        else:
            names.append(("unique", request.request_id, k))
    return names


class PerServerLru:
    """GIE's prefix indexer (v0.5.1 `multi/prefix/indexer.go`): one LRU of block hashes per
    server (hashicorp golang-lru: `Add` of a present key makes it most recent; past capacity
    the least recent is evicted at once, and the eviction callback drops the server from the
    hash's pod set), plus hash -> servers for lookup. No TTL."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.lru: dict[int, OrderedDict[Any, None]] = {}
        self.holders: dict[Any, set[int]] = {}

    def add(self, hashes: list[Any], server: int) -> None:
        lru = self.lru.setdefault(server, OrderedDict())
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
                if len(lru) > self.capacity:
                    old, _ = lru.popitem(last=False)
                    pods = self.holders[old]
                    pods.discard(server)
                    if not pods:
                        del self.holders[old]
            self.holders.setdefault(h, set()).add(server)

    def match(self, hashes: list[Any], ids: Sequence[int]) -> list[int]:
        """GIE `matchLongestPrefix`: walk the blocks while ANY server holds the block, and
        credit every server holding it (no intersection: a server missing an earlier block
        still scores a later one it holds while another server keeps the walk going).
        Returns the counts of the servers `ids` (the listed ones), in their order. A server
        not listed still keeps the walk going: GIE's indexer is keyed by pod name and drops
        a pod's hashes only as its LRU evicts them, not when the pod leaves
        (`indexer.go` at `e7255c8f`: no removal path), and `Score` reads the candidates'
        counts only."""
        counts = [0] * id_bound(ids)
        n = len(counts)
        for h in hashes:
            pods = self.holders.get(h)
            if not pods:
                break
            for s in pods:
                if s < n:
                    counts[s] += 1
        return counts if type(ids) is range else [counts[i] for i in ids]


class ApproxPrefixScorer(EppScorer):
    """`prefix-cache-scorer` (estimate mode, the default): GIE's approximate prefix plugin.

    GIE v0.5.1 `pkg/epp/scheduling/framework/plugins/multi/prefix/plugin.go` (`Score`,
    `PostCycle`/v1.0 `PreRequest`, `matchLongestPrefix`, `hashPrompt`) and `indexer.go`:
    the prompt's bytes are cut into `hashBlockSize`-character blocks (only the first
    `maxPrefixBlocksToMatch` blocks), chained-hashed, and looked up in a per-server LRU of
    `lruCapacityPerServer` hashes that records where the router SENT prompts (after the
    decision, for the chosen pod; never the engine's real cache, no TTL).
    score_i = blocks credited to pod i / blocks of the request (0 for every pod if none).
    Defaults are the source's: 64, 256 (the first 16 KB), 31250.

    Hashing follows GIE v1.0 (`ad6be5a0`): the model name is folded into the first block.
    GIE v0.5.1 prepended a separate model-name block instead, which every pod that has
    served the model matches: +1 on every such pod's count and on the total, a shift that
    does not change the pick once every pod has served a request (not modelled).
    With `request.prompt_text` the bytes are the text's UTF-8; without text (token-id traces)
    they are derived from the trace's block names at `charsPerToken` characters per token
    (lmsim's only parameter here, see `token_blocks_as_chars`). It matters when the LRU is
    small: on the scaled A2 above (`ActiveRequestScorer`), the estimate preset (256-char
    blocks, 2,200 per server: ~140k tokens at 4 characters per token, against 461k of KV)
    gives mean / p90 TTFT 3.2 / 13.7 s and a 68% first-admission hit rate at 4 characters
    per token, 5.9 / 24.7 s and 61% at 6 (precise: 0.03 / 0.04 s, 98%; random 16.8 / 66.0 s,
    40%). Random-token prompts (inference-perf's) decode to more characters per token than
    prose, so replay them with their text.
    """

    type_name = "prefix-cache-scorer"
    defaults = {
        "hashBlockSize": 64,
        "maxPrefixBlocksToMatch": 256,
        "lruCapacityPerServer": 31250,
        "charsPerToken": 4.0,
    }

    def __init__(self, params: dict[str, Any], where: str) -> None:
        super().__init__(params, where)
        self.block = int(self._number("hashBlockSize", lo=1, integer=True))
        self.max_blocks = int(self._number("maxPrefixBlocksToMatch", lo=1, integer=True))
        self.capacity = int(self._number("lruCapacityPerServer", lo=1, integer=True))
        self.chars_per_token = float(self._number("charsPerToken", lo=0, lo_open=True))
        self.index = PerServerLru(self.capacity)
        self._last: tuple[int, list[Any]] | None = None
        self._text_memo: dict[str, list[int]] = {}

    def hashes(self, request: Request) -> list[Any]:
        last = self._last
        if last is not None and last[0] == request.request_id:
            return last[1]
        text = getattr(request, "prompt_text", "") or ""
        if text:
            out = self._text_memo.get(text)
            if out is None:
                out = chained_hashes(chars_blocks(text.encode(), self.block, self.max_blocks))
                if len(self._text_memo) > 4096:  # a benchmark re-sends a few hundred prompts
                    self._text_memo.clear()
                self._text_memo[text] = out
        else:
            out = token_blocks_as_chars(
                request, self.block, self.max_blocks, self.chars_per_token, self.ctx.block_size
            )
        self._last = (request.request_id, out)
        return out

    def score(self, request: Request, cluster: ClusterView) -> list[float]:
        hashes = self.hashes(request)
        total = len(hashes)
        if total == 0:
            return [0.0] * len(cluster.instances)
        return [m / total for m in self.index.match(hashes, listed_ids(cluster, self.ctx.num_instances))]

    def on_routed(self, request: Request, instance_id: int) -> None:
        self.index.add(self.hashes(request), instance_id)


# ---------------------------------------------------------------- precise prefix scorer
def min_max_over_hits(matched: list[int]) -> list[float]:
    """llm-d-inference-scheduler `pkg/plugins/scorer/utils.go`
    `indexedScoresToNormalizedScoredPods` (at `b9c56d36`, unchanged in the split-out
    `precise_prefix_cache.go`): the index reports only pods holding the first block (score
    >= 1); those are min-max normalised among themselves, (s - min)/(max - min); if they are
    all equal (one pod with a hit included) each gets 1.0; pods without a hit get 0."""
    hits = [m for m in matched if m > 0]
    if not hits:
        return [0.0] * len(matched)
    lo, hi = min(hits), max(hits)
    if lo == hi:
        return [1.0 if m > 0 else 0.0 for m in matched]
    return [(m - lo) / (hi - lo) if m > 0 else 0.0 for m in matched]


class PrecisePrefixScorer(EppScorer):
    """`precise-prefix-cache-scorer` (or `prefix-cache-scorer` with `mode: cache_tracking`,
    the pre-split form): llm-d's KV-event index.

    llm-d-inference-scheduler `pkg/plugins/scorer/prefix_cache_tracking.go` `Score` (at
    `b9c56d36`; `precise_prefix_cache.go` after `aecee68d`) asks llm-d-kv-cache-manager v0.2.1
    `Indexer.GetPodScores` for each pod's count of consecutive prompt blocks from block 0
    held in its KV cache (`kvblock_scorer.go` `LongestPrefixScorer.Score`, from vLLM's KV
    events), then normalises with `min_max_over_hits`. The counts here are the router's
    KV view (`router.view.kv_view`: `events` is llm-d's event-fed index, `exact` the engine's
    cache at decision time) in engine blocks: llm-d's `tokenProcessorConfig.blockSize` must
    equal the engine's block size for its keys to match vLLM's, so the block size is the
    engine's. `indexerConfig`, `kvEventsConfig` and `tokenProcessorConfig` are accepted and
    ignored for that reason. Not modelled: the v0.2.1 indexer scores only the prompt prefix
    it has already tokenized (an async tokenizer pool); a request's own new tail is never in
    any cache, so the counts agree except for a group's very first request.
    """

    type_name = "precise-prefix-cache-scorer"
    defaults = {"mode": "cache_tracking", "indexerConfig": None, "kvEventsConfig": None,
                "tokenProcessorConfig": None}

    def score(self, request: Request, cluster: ClusterView) -> list[float]:
        bsz = cluster.block_size
        return min_max_over_hits([c // bsz for c in cluster.cached_prefix_tokens(request)])


# ---------------------------------------------------------------- load scorers
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)\s*$")
_UNIT_S = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def duration_s(value: Any, name: str, where: str) -> float:
    """A Go duration string ("2m", "30s", "500ms") or a number of seconds, > 0."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    if isinstance(value, str):
        m = _DURATION.match(value)
        if m and float(m.group(1)) > 0:
            return float(m.group(1)) * _UNIT_S[m.group(2)]
    raise ValueError(f"{where}: param {name!r} must be a duration like '2m' or '30s', got {value!r}")


class ActiveRequestScorer(EppScorer):
    """`active-request-scorer`: requests the EPP has sent to each pod and not yet seen end.

    llm-d-inference-scheduler `pkg/plugins/scorer/active_request.go` (added `673ddd9f`,
    2025-08-25; `Score`, `PreRequest`, `PostResponse`/`ResponseComplete`): +1 for the chosen
    pod when the request is sent; -1 when llm-d's hook fires; an entry still counted
    `requestTimeout` (default 2m) after it was sent is dropped by a sweep that runs every
    `requestTimeout` (`cleanCachePeriodically`, a ttlcache without auto-expiry), so long
    requests leave the count between 1 and 2 timeouts after they were sent.
    score_i = 1.0 if count_i <= idleThreshold, else (max_count - count_i)/max_count x
    maxBusyScore, max over the pods (`idleThreshold` 0 and `maxBusyScore` 1.0 by default,
    `9ff77471`; before them the same formula with 0 and 1).

    `releaseAt` (lmsim's parameter) is when the count drops:
    * `response_complete` (default, llm-d since `81589a39`, 2025-10-17): at the request's end;
    * `response_headers`: llm-d before that ran the hook as GIE's `PostResponse`, which GIE
      v0.5.1–v1.0 call on the response HEADERS (`handlers/response.go`
      `HandleResponseHeaders` -> `director.HandleResponse`). vLLM's streaming server sends
      the headers as soon as the request is accepted, before it is scheduled, so the count
      is back to 0 before any later routing decision: every pod scores 1.0 (lmsim has no
      HTTP latency, so this is exact, not an approximation).
    The A2 presets use `response_headers` (their builds, see `PRESETS`). Measured on a scaled
    A2 (4 x H100 qwen2-7b, 461,376 KV tokens each, the A2 shared_prefix workload and stages as
    a token-id trace, 6,560 requests, scraped load every 50 ms): `load` with headers has mean /
    p90 TTFT 16.1 / 73.7 s and 5,849 output tok/s against random's 16.8 / 66.0 s and 6,087,
    worse than random on p90 and throughput as in A2 (98.3 vs 84.9 s, 2,669 vs 2,992 tok/s);
    with `response_complete` it beats random on all three (14.9 / 59.1 s, 6,151 tok/s).
    """

    type_name = "active-request-scorer"
    defaults = {"requestTimeout": "2m", "idleThreshold": 0, "maxBusyScore": 1.0,
                "releaseAt": "response_complete"}

    def __init__(self, params: dict[str, Any], where: str) -> None:
        super().__init__(params, where)
        self.timeout = duration_s(self.p["requestTimeout"], "requestTimeout", where)
        self.idle = int(self._number("idleThreshold", lo=0, integer=True))
        self.max_busy = float(self._number("maxBusyScore", lo=0, hi=1))
        try:
            self.release = check_choice(
                "releaseAt", self.p["releaseAt"], ("response_complete", "response_headers")
            )
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        self.counts: list[int] = []  # by instance id
        self.sent: dict[int, tuple[int, float]] = {}  # request id -> (pod, time sent)

    def bind(self, ctx: RouterContext) -> None:
        super().bind(ctx)
        if self.release == "response_complete":
            ctx.every(self.timeout, self._sweep)

    def _sweep(self, now: float) -> None:
        expired = [rid for rid, (_, t) in self.sent.items() if t + self.timeout <= now]
        for rid in expired:
            pod, _ = self.sent.pop(rid)
            self.counts[pod] -= 1

    def score(self, request: Request, cluster: ClusterView) -> list[float]:
        ids = listed_ids(cluster, self.ctx.num_instances)
        known = self.counts
        if type(ids) is range:
            counts = (known + [0] * len(ids))[: len(ids)]
        else:
            counts = [known[i] if i < len(known) else 0 for i in ids]
        top = max(counts)
        return [1.0 if c <= self.idle else (top - c) / top * self.max_busy for c in counts]

    def on_routed(self, request: Request, instance_id: int) -> None:
        if self.release == "response_headers":
            return
        while len(self.counts) <= instance_id:
            self.counts.append(0)
        self.counts[instance_id] += 1
        self.sent[request.request_id] = (instance_id, self.ctx.now())

    def on_finished(self, request: Request) -> None:
        entry = self.sent.pop(request.request_id, None)
        if entry is not None:
            self.counts[entry[0]] -= 1


class KvCacheUtilizationScorer(EppScorer):
    """`kv-cache-scorer` (GIE v0.5.1 `plugins/scorer/kvcache.go` `Score`; renamed
    `kv-cache-utilization-scorer` in later GIE, same formula): 1 - KV usage fraction, the
    scraped `vllm:gpu_cache_usage_perc` (the router's `load_view`; GIE scrapes every 50 ms,
    `DefaultRefreshMetricsInterval`)."""

    type_name = "kv-cache-scorer"

    def score(self, request: Request, cluster: ClusterView) -> list[float]:
        return [1.0 - v.kv_usage for v in cluster.instances]


class QueueScorer(EppScorer):
    """`queue-scorer` (GIE v0.5.1 `plugins/scorer/queue.go` `Score`): min-max over the pods'
    waiting-queue sizes, (max - q)/(max - min); 1.0 for every pod when all are equal."""

    type_name = "queue-scorer"

    def score(self, request: Request, cluster: ClusterView) -> list[float]:
        qs = [v.num_waiting for v in cluster.instances]
        lo, hi = min(qs), max(qs)
        if hi == lo:
            return [1.0] * len(qs)
        return [(hi - q) / (hi - lo) for q in qs]


class LoadAwareScorer(EppScorer):
    """`load-aware-scorer` (llm-d-inference-scheduler `pkg/plugins/scorer/load_aware.go`
    `Score`, at `b9c56d36`): 0.5 for an empty waiting queue, else 0.5 x (1 - min(q,
    threshold)/threshold); `threshold` 128 by default."""

    type_name = "load-aware-scorer"
    defaults = {"threshold": 128}

    def __init__(self, params: dict[str, Any], where: str) -> None:
        super().__init__(params, where)
        self.threshold = float(self._number("threshold", lo=0, lo_open=True, integer=True))

    def score(self, request: Request, cluster: ClusterView) -> list[float]:
        t = self.threshold
        return [0.5 if v.num_waiting == 0 else 0.5 * (1.0 - min(v.num_waiting, t) / t)
                for v in cluster.instances]


def _prefix_cache_scorer(params: dict[str, Any], where: str) -> EppScorer:
    """`prefix-cache-scorer`: before llm-d split its scorers (`aecee68d`), `mode` chose the
    approximate index (`estimate`, the default) or the KV-event index (`cache_tracking`)
    (`prefix_cache.go` `PrefixCachePluginFactory`)."""
    mode = params.get("mode", "estimate")
    if mode == "cache_tracking":
        return PrecisePrefixScorer(params, where)
    if mode != "estimate":
        raise ValueError(f"{where}: param 'mode' must be one of estimate|cache_tracking, got {mode!r}")
    return ApproxPrefixScorer({k: v for k, v in params.items() if k != "mode"}, where)


SCORERS: dict[str, Callable[[dict[str, Any], str], EppScorer]] = {
    "prefix-cache-scorer": _prefix_cache_scorer,
    "precise-prefix-cache-scorer": PrecisePrefixScorer,
    "active-request-scorer": ActiveRequestScorer,
    "kv-cache-scorer": KvCacheUtilizationScorer,
    "kv-cache-utilization-scorer": KvCacheUtilizationScorer,
    "queue-scorer": QueueScorer,
    "load-aware-scorer": LoadAwareScorer,
}
PICKERS = ("max-score-picker", "random-picker")
# Accepted and without effect: one profile is all lmsim runs, and on a colocated cluster
# every pod serves decode (llm-d's `decode-filter` keeps pods labelled decode or unlabelled).
PROFILE_HANDLERS = ("single-profile-handler", "decode-filter")
_PICKER_PARAMS = {"maxNumOfEndpoints"}


# ---------------------------------------------------------------- presets
def _profile(*refs: tuple[str, float | None]) -> list[dict[str, Any]]:
    return [{"name": "default", "plugins": [
        {"pluginRef": r} if w is None else {"pluginRef": r, "weight": w} for r, w in refs]}]


# The A2 routers' load scorers. llm-d ran active-request-scorer's release as GIE's
# `PostResponse` until 2025-10-17 (`81589a39`), which GIE calls on the response headers;
# every llm-d build that accepts the A2 configs predates that (below), so the count never
# reaches a later decision (`ActiveRequestScorer`).
_ACTIVE_AT_HEADERS = {"type": "active-request-scorer", "parameters": {"releaseAt": "response_headers"}}
_LOAD = [_ACTIVE_AT_HEADERS, {"type": "kv-cache-scorer"}]
_PICK = [{"type": "max-score-picker", "parameters": {"maxNumOfEndpoints": 1}},
         {"type": "single-profile-handler"}]
_LOAD_REFS = (("active-request-scorer", 1), ("kv-cache-scorer", 1))


def _precise(prefix_params: dict[str, Any]) -> dict[str, Any]:
    return {
        "plugins": [{"type": "single-profile-handler"},
                    {"type": "prefix-cache-scorer", "parameters": prefix_params},
                    {"type": "kv-cache-scorer"}, _ACTIVE_AT_HEADERS, {"type": "max-score-picker"}],
        "schedulingProfiles": _profile(("prefix-cache-scorer", 2.0), ("kv-cache-scorer", 1.0),
                                       ("active-request-scorer", 1.0), ("max-score-picker", None)),
    }


# The EPP configurations of the A2 benchmark as its report gives them
# (`llm-d/llm-d-kv-cache-manager@edb766fd benchmarking/37-capacity/README.md`), the
# "default-scheduling" of the report's first version (`@2bb0a20`), and llm-d's sample config.
# Which llm-d build ran A2 is not stated. Its precise config (`prefix-cache-scorer`, `mode:
# cache_tracking`) is llm-d's KV-event scorer only in builds of 2025-08-25 (active-request
# added) to 2025-08-31 (scorers split, `aecee68d`); in every tagged release that has the
# active-request scorer (v0.3.0 on), `prefix-cache-scorer` is GIE's approximate scorer, whose
# lenient JSON ignores `mode` and `indexerConfig`, so "precise" ran as the approximate scorer
# with GIE's defaults: `precise-prefix-cache_load@v0.3`. The precise reading needs
# `router.view.kv_view: events` to read an event-fed index.
PRESETS: dict[str, dict[str, Any]] = {
    # llm-d's sample EPP config without P/D (`deploy/config/epp-config.yaml`, the same at
    # `b9c56d36` and `520af478`): the approximate prefix scorer alone, weight 2.
    "epp-config": {
        "plugins": [{"type": "prefix-cache-scorer"}, {"type": "decode-filter"},
                    {"type": "max-score-picker"}, {"type": "single-profile-handler"}],
        "schedulingProfiles": _profile(("decode-filter", None), ("max-score-picker", None),
                                       ("prefix-cache-scorer", 2)),
    },
    "random": {
        "plugins": [{"type": "single-profile-handler"}, {"type": "random-picker"}],
        "schedulingProfiles": _profile(("random-picker", None)),
    },
    "load": {
        "plugins": _LOAD + _PICK,
        "schedulingProfiles": _profile(*_LOAD_REFS, ("max-score-picker", None)),
    },
    "estimate-prefix-cache_load": {
        "plugins": [*_LOAD, {"type": "prefix-cache-scorer", "parameters": {
            "hashBlockSize": 256, "maxPrefixBlocksToMatch": 256, "lruCapacityPerServer": 2200}},
            *_PICK],
        "schedulingProfiles": _profile(*_LOAD_REFS, ("prefix-cache-scorer", 2),
                                       ("max-score-picker", None)),
    },
    "precise-prefix-cache_load": _precise({"mode": "cache_tracking"}),
    "precise-prefix-cache_load@v0.3": _precise({}),
    "default-scheduling": {
        "plugins": [{"type": "queue-scorer"}, {"type": "kv-cache-scorer"},
                    {"type": "prefix-cache-scorer"}, *_PICK],
        "schedulingProfiles": _profile(("queue-scorer", 1), ("kv-cache-scorer", 1),
                                       ("prefix-cache-scorer", 2), ("max-score-picker", None)),
    },
}


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{where} must be a mapping, got {value!r}")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list) or not value:
        raise ValueError(f"{where} must be a non-empty list, got {value!r}")
    return value


@POLICIES.register("llmd_epp")
class LlmdEpp(Policy):
    """llm-d's EPP from its own configuration: the weighted sum of the profile's scorers,
    then its picker (module docstring for the sources; each scorer's class for its formula).

    Params (the `EndpointPickerConfig` fields):
      plugins: [{type, name?, parameters?}] — scorers: prefix-cache-scorer (`mode` estimate |
        cache_tracking), precise-prefix-cache-scorer, active-request-scorer, kv-cache-scorer
        (= kv-cache-utilization-scorer), queue-scorer, load-aware-scorer; pickers:
        max-score-picker, random-picker; single-profile-handler.
      schedulingProfiles: exactly one profile, [{name, plugins: [{pluginRef, weight?}]}],
        with one picker; a scorer's weight defaults to 1.
      apiVersion, kind: accepted so the EPP file can be pasted whole.
      preset: a name from `PRESETS` instead of plugins/schedulingProfiles: the A2
        benchmark's `random`, `load`, `estimate-prefix-cache_load`,
        `precise-prefix-cache_load` (and `precise-prefix-cache_load@v0.3`, the same config
        as llm-d v0.3 reads it), the same report's earlier `default-scheduling`, and
        `epp-config`, llm-d's sample config (prefix-cache-scorer weight 2), the default.
    Tie-break: the max-score picker's shuffle, i.e. seeded uniform among the maxima.

    `llmd_scorer` (lmsim's earlier weighted form, w_prefix/w_queue/w_kv over the router's
    kv_view) and `llmd_pd` keep their behaviour; this policy is the EPP as configured.
    """

    def __init__(
        self,
        *,
        plugins: list[dict[str, Any]] | None = None,
        schedulingProfiles: list[dict[str, Any]] | None = None,
        preset: str | None = None,
        apiVersion: str | None = None,
        kind: str | None = None,
    ) -> None:
        if preset is not None:
            if plugins is not None or schedulingProfiles is not None:
                raise ValueError("give either 'preset' or 'plugins' + 'schedulingProfiles', not both")
            if preset not in PRESETS:
                raise ValueError(f"param 'preset' must be one of {'|'.join(PRESETS)}, got {preset!r}")
            plugins, schedulingProfiles = PRESETS[preset]["plugins"], PRESETS[preset]["schedulingProfiles"]
        if kind is not None and kind != "EndpointPickerConfig":
            raise ValueError(f"param 'kind' must be EndpointPickerConfig, got {kind!r}")
        if plugins is None and schedulingProfiles is None:
            plugins, schedulingProfiles = PRESETS["epp-config"]["plugins"], PRESETS["epp-config"]["schedulingProfiles"]
        if plugins is None or schedulingProfiles is None:
            raise ValueError("needs both 'plugins' and 'schedulingProfiles' (the EPP config), or 'preset'")
        self.scorers: list[tuple[EppScorer, float]] = []
        self.picker = self._build(plugins, schedulingProfiles)

    def _build(self, plugins: Any, profiles: Any) -> str:
        declared: dict[str, tuple[str, dict[str, Any], str]] = {}
        for k, plugin in enumerate(_list(plugins, "param 'plugins'")):
            where = f"plugins[{k}]"
            plugin = _mapping(plugin, where)
            extra = set(plugin) - {"type", "name", "parameters"}
            if extra:
                raise ValueError(f"{where} has no field {sorted(extra)[0]!r} (type, name, parameters)")
            ptype = plugin.get("type")
            known = [*SCORERS, *PICKERS, *PROFILE_HANDLERS]
            if ptype not in known:
                raise ValueError(f"{where}: unknown plugin type {ptype!r} (known: {', '.join(known)})")
            name = plugin.get("name", ptype)
            if name in declared:
                raise ValueError(f"{where}: plugin name {name!r} is declared twice")
            params = _mapping(plugin.get("parameters") or {}, f"{where}.parameters")
            if ptype in PICKERS or ptype in PROFILE_HANDLERS:
                allowed = _PICKER_PARAMS if ptype in PICKERS else set()
                bad = set(params) - allowed
                if bad:
                    raise ValueError(f"{where}: {ptype} has no parameter {sorted(bad)[0]!r}")
                if params.get("maxNumOfEndpoints", 1) != 1:
                    raise ValueError(f"{where}: maxNumOfEndpoints must be 1 (one pod per request)")
            declared[name] = (ptype, params, where)
        profiles = _list(profiles, "param 'schedulingProfiles'")
        if len(profiles) != 1:
            raise ValueError("schedulingProfiles: exactly one profile is supported (single-profile-handler)")
        profile = _mapping(profiles[0], "schedulingProfiles[0]")
        picker = None
        for k, ref in enumerate(_list(profile.get("plugins"), "schedulingProfiles[0].plugins")):
            where = f"schedulingProfiles[0].plugins[{k}]"
            ref = _mapping(ref, where)
            extra = set(ref) - {"pluginRef", "weight"}
            if extra:
                raise ValueError(f"{where} has no field {sorted(extra)[0]!r} (pluginRef, weight)")
            name = ref.get("pluginRef")
            if name not in declared:
                raise ValueError(f"{where}: pluginRef {name!r} names no plugin in 'plugins'")
            ptype, params, pwhere = declared[name]
            if ptype in PICKERS:
                if picker is not None:
                    raise ValueError(f"{where}: a profile has one picker, {picker!r} is already set")
                picker = ptype
            elif ptype in SCORERS:
                weight = check_number(f"{where}.weight", ref.get("weight", 1), lo=0)
                self.scorers.append((SCORERS[ptype](params, pwhere), float(weight)))
            # a filter or profile handler: nothing to do in a one-profile colocated cluster
        if picker is None:
            raise ValueError("schedulingProfiles[0] has no picker (max-score-picker or random-picker)")
        return picker

    def bind(self, ctx: RouterContext) -> None:
        super().bind(ctx)
        for scorer, _ in self.scorers:
            scorer.bind(ctx)

    def totals(self, request: Request, cluster: ClusterView) -> list[float]:
        n = len(cluster.instances)
        total = [0.0] * n
        for scorer, weight in self.scorers:
            for i, s in enumerate(scorer.score(request, cluster)):
                total[i] += weight * s
        return total

    def choose(self, request: Request, cluster: ClusterView) -> int:
        if self.picker == "random-picker":
            return int(self.ctx.rng.integers(len(cluster.instances)))
        return pick_min([-t for t in self.totals(request, cluster)], "random", self.ctx.rng)

    def on_routed(self, request: Request, instance_id: int) -> None:
        for scorer, _ in self.scorers:
            scorer.on_routed(request, instance_id)

    def on_finished(self, request: Request) -> None:
        for scorer, _ in self.scorers:
            scorer.on_finished(request)
