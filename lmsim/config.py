"""The experiment schema, YAML loading, dotted `--set` overrides and validation messages.

A config is pure data: loading it reads the YAML and nothing else. Every problem becomes a
`ConfigError` whose one line names the file, the dotted field and what is wrong.
"""

from __future__ import annotations

import copy
import dataclasses
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from lmsim.errors import ConfigError, LmsimError, suggest
from lmsim.profile.inline import check_inline_profile

T = TypeVar("T")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclasses.dataclass(frozen=True)
class PoolSpec:
    """A pool as the engine builds it: every engine field resolved."""

    name: str
    role: str  # both | prefill | decode
    num_instances: int
    first_instance: int  # global id of its first instance
    engine: dict[str, Any]  # POOL_ENGINE_FIELDS -> value
    kv_tiers: KVTiersConfig | None

    @property
    def instance_ids(self) -> range:
        return range(self.first_instance, self.first_instance + self.num_instances)


class GeneratorConfig(_Strict):
    name: str = Field(description="registered generator name (chatbot, agent, ...)")
    params: dict[str, Any] = Field(default_factory=dict, description="generator parameters")


class FormatConfig(_Strict):
    name: str = Field(description="registered trace format (sharegpt, mooncake, ...)")
    params: dict[str, Any] = Field(default_factory=dict, description="format parameters (only sharegpt has any)")


class SampleConfig(_Strict):
    fraction: float = Field(gt=0, le=1, description="keep each request with this probability")
    seed: int = Field(0, ge=0, description="seed of the thinning draw")
    complement: bool = Field(False, description="keep exactly the rows the draw drops")


class RateSegment(_Strict):
    at_s: float = Field(ge=0, description="segment start, seconds of the output timeline")
    multiplier: float = Field(gt=0, description="arrival rate relative to the workload's own (time_scale of the segment)")


class RateScheduleConfig(_Strict):
    """Time-varying traffic over any generator or trace (lmsim.workload.rate_schedule)."""

    shape: Literal["piecewise", "linear", "diurnal"] = Field(
        "piecewise", description="piecewise-constant or linearly interpolated segments, or a diurnal curve"
    )
    segments: list[RateSegment] | None = Field(None, description="piecewise/linear: rate multiplier from at_s on")
    period_s: float | None = Field(None, gt=0, description="diurnal: the length of one day on the output timeline")
    peak_at_s: float | None = Field(None, ge=0, description="diurnal: when the rate peaks")
    low: float | None = Field(None, gt=0, description="diurnal: trough multiplier")
    high: float | None = Field(None, gt=0, description="diurnal: peak multiplier")

    @model_validator(mode="after")
    def _shape_fields(self) -> RateScheduleConfig:
        # A schedule missing its shape's fields would silently replay the workload as it is.
        if self.shape == "diurnal":
            missing = [k for k in ("period_s", "peak_at_s", "low", "high") if getattr(self, k) is None]
            if missing:
                raise ValueError(f"shape diurnal needs {', '.join(missing)}")
            if self.segments is not None:
                raise ValueError("shape diurnal takes period_s/peak_at_s/low/high, not segments")
            if self.low > self.high:  # type: ignore[operator]
                raise ValueError(f"diurnal low {self.low} > high {self.high}")
            return self
        if not self.segments:
            raise ValueError(f"shape {self.shape} needs segments (at_s, multiplier), the first at_s 0")
        others = [k for k in ("period_s", "peak_at_s", "low", "high") if getattr(self, k) is not None]
        if others:
            raise ValueError(f"shape {self.shape} takes segments, not {', '.join(others)}")
        if self.segments[0].at_s != 0:
            raise ValueError(f"segments must start at at_s 0, the first is at {self.segments[0].at_s:g}")
        for a, b in zip(self.segments, self.segments[1:]):
            if b.at_s <= a.at_s:
                raise ValueError(f"segments must be sorted by at_s with no repeats: {b.at_s:g} after {a.at_s:g}")
        return self


class WorkloadConfig(_Strict):
    trace: str | None = Field(None, description="trace file (canonical Parquet or raw format)")
    format: str | FormatConfig | None = Field(
        None, description="raw trace format, or {name, params}; inferred when omitted"
    )
    generator: GeneratorConfig | None = Field(None, description="synthesize instead of loading")
    skip_bad_rows: bool = Field(False, description="skip and count malformed trace rows")
    start_s: float | None = Field(None, ge=0, description="keep arrivals at or after this time")
    end_s: float | None = Field(None, gt=0, description="keep arrivals before this time")
    limit: int | None = Field(None, gt=0, description="keep the first N requests")
    max_tokens: int | None = Field(
        None, gt=1, description="shorten prompts so prompt + output <= this (Vidur's model-length clip)"
    )
    sample: SampleConfig | None = Field(
        None, description="Bernoulli thinning (e.g. a canary's share of the traffic)"
    )
    time_scale: float | None = Field(None, gt=0, description="divide inter-arrival gaps by this")
    rate: float | None = Field(None, gt=0, description="time-scale to this mean rate (req/s)")
    load: float | None = Field(
        None, gt=0, description="time-scale to this fraction of measured cluster capacity"
    )
    rate_schedule: RateScheduleConfig | None = Field(
        None, description="time-varying rate over the (scaled) workload; absent: as it is"
    )

    @property
    def format_name(self) -> str | None:
        return self.format.name if isinstance(self.format, FormatConfig) else self.format

    @property
    def format_params(self) -> dict[str, Any]:
        return dict(self.format.params) if isinstance(self.format, FormatConfig) else {}

    @model_validator(mode="after")
    def _one_source(self) -> WorkloadConfig:
        if (self.trace is None) == (self.generator is None):
            raise ValueError("set exactly one of workload.trace and workload.generator")
        if self.format is not None and self.trace is None:
            raise ValueError("workload.format needs workload.trace (a generator takes generator.params)")
        scalers = [x for x in (self.time_scale, self.rate, self.load) if x is not None]
        if len(scalers) > 1:
            raise ValueError("set at most one of workload.time_scale, workload.rate, workload.load")
        return self


AdmissionRule = Literal["first_chunk", "full_sequence", "whole_prompt_watermark"]
FreeQueueOrder = Literal["release", "content_free_first"]
EngineRelease = Literal["vllm-0.11", "vllm-0.33"]


@dataclasses.dataclass(frozen=True)
class EngineSettings:
    """What an engine release does, as `cluster.engine` names it; each field can be set on
    its own in `cluster:` or a pool (see `ClusterConfig.pool_specs`)."""

    admission: AdmissionRule
    async_scheduling: bool
    free_queue_order: FreeQueueOrder
    waive_long_prefill_when_alone: bool


ENGINE_SETTING_FIELDS = tuple(f.name for f in dataclasses.fields(EngineSettings))

ENGINE_PRESETS: dict[str, EngineSettings] = {
    # vLLM 0.11 (late 2025, the study's era): a waiting request is admitted when its first
    # chunk's blocks fit (`KVCacheManager.allocate_slots`); steps are scheduled one at a
    # time (async scheduling was opt-in); freed blocks are appended to the free queue in
    # release order whatever they hold (`BlockPool.free_blocks`: `free_block_queue.append_n`);
    # `long_prefill_token_threshold` caps every chunk.
    "vllm-0.11": EngineSettings("first_chunk", False, "release", False),
    # vLLM 0.33: the whole sequence's blocks must fit at admission (`scheduler_reserve_full_isl`);
    # async scheduling is on unless something is incompatible (`VllmConfig.__post_init__`: the
    # `async_scheduling is None` branch; then `max_concurrent_batches = 2`); content-free
    # blocks go to the front of the free queue and cache entries to the back
    # (`BlockPool.free_blocks`); a request alone in the engine is not capped by
    # `long_prefill_token_threshold` (`Scheduler.schedule`).
    "vllm-0.33": EngineSettings("full_sequence", True, "content_free_first", True),
}
# The default is the engine the study (the seed paper) measured: 2025's synchronous vLLM v1.
# lmsim's peers model that engine too (Dynamo's mocker, which lmsim matches within 0.1% mean
# TTFT on Kimi traffic, and Vidur schedule one step at a time), and the shipped profiles'
# per-step host cost was fitted on synchronous runs. The choice moves results: on 4
# H20/Qwen3-30B-A3B instances of chatbot traffic at 12 req/s (4,000 requests, 3 seeds)
# `vllm-0.33` raises mean TTFT by 13 / 37 / 15 % (vllm / lmetric / dynamo) and lowers mean
# TPOT by 5 / 6 / 5 %, almost all of it from asynchronous scheduling; lmetric's and dynamo's
# p99 TTFT go from 1,338 < 1,388 ms to a tie, 1,453 vs 1,450 ms (README, "Engine release").
# Users of today's vLLM set `engine: vllm-0.33`.
DEFAULT_ENGINE: EngineRelease = "vllm-0.11"


def resolve_engine(engine: str | None, explicit: dict[str, Any]) -> EngineSettings:
    """The preset `engine` names (None: `DEFAULT_ENGINE`) with every non-None value of
    `explicit` (setting name -> value) taking precedence."""
    preset = ENGINE_PRESETS[engine or DEFAULT_ENGINE]
    return dataclasses.replace(preset, **{k: v for k, v in explicit.items() if v is not None})


POOL_ENGINE_FIELDS = (
    "profile", "gpu_memory_utilization", "num_gpu_blocks", "max_num_batched_tokens", "max_num_seqs",
    "long_prefill_token_threshold", "enable_prefix_caching", "watermark_blocks_fraction",
    "max_waiting", "max_model_len", "engine", *ENGINE_SETTING_FIELDS,
)  # the cluster's engine fields a pool may set for itself (unset: the cluster's value);
# in a PoolSpec, `engine` is the release named and the settings are resolved (never None)


class TierConfig(_Strict):
    """One lower KV tier of an instance (host memory or local disk). Unset bandwidths and
    latency take the tier's defaults (`lmsim.engine.kv_tiers.TIER_DEFAULTS`: host 32e9 B/s
    each way and no latency, Dynamo's mocker's PCIe lanes; disk 10e9 B/s and 0.1 ms, its G3)."""

    capacity_blocks: int | None = Field(
        None, ge=0, description="capacity in KV blocks (0: the tier stores nothing, as if absent)"
    )
    capacity_gb: float | None = Field(
        None, ge=0, description="capacity in GB (1e9 bytes), divided by the bytes of a KV block "
        "(block_size x the profile's kv_bytes_per_token)",
    )
    read_bytes_s: float | None = Field(None, gt=0, description="bandwidth towards the GPU (load), bytes/s")
    write_bytes_s: float | None = Field(None, gt=0, description="bandwidth away from the GPU (store), bytes/s")
    latency_s: float | None = Field(None, ge=0, description="first-byte latency of each transfer, s")

    @model_validator(mode="after")
    def _one_capacity(self) -> TierConfig:
        if (self.capacity_blocks is None) == (self.capacity_gb is None):
            raise ValueError("set exactly one of capacity_blocks and capacity_gb")
        return self


class KVTiersConfig(_Strict):
    """Lower KV tiers per instance (issue 26): blocks leave the GPU to host memory (and disk)
    and come back over PCIe instead of being recomputed (`lmsim.engine.kv_tiers`)."""

    host: TierConfig | None = Field(None, description="host memory (CPU DRAM) tier")
    disk: TierConfig | None = Field(None, description="local disk tier, below host memory")
    store: Literal["write_through", "on_eviction"] = Field(
        "write_through",
        description="copy every computed block down as it is computed (vLLM OffloadingConnector, "
        "LMCache, SGLang write_through, Dynamo KVBM) or only when the GPU evicts it (SGLang write_back)",
    )
    store_scope: Literal["all", "prompt"] = Field(
        "all", description="blocks stored: prompt and output (vLLM) or prompt only (LMCache default, Dynamo's mocker)"
    )
    load: Literal["before_admission", "in_step"] = Field(
        "before_admission",
        description="a lower-tier hit is loaded while the request waits and other requests run "
        "(vLLM's connectors, Dynamo's mocker), or inside the step that admits it (LMCache synchronous)",
    )
    sharing: Literal["fifo", "fair", "none"] = Field(
        "fifo", description="how concurrent copies share an instance's PCIe lanes and disk"
    )
    kv_bytes_per_token: int | None = Field(
        None, gt=0, description="KV bytes of one token (default: the profile's model.kv_bytes_per_token; "
        "required with a linear profile)",
    )

    @model_validator(mode="after")
    def _disk_below_host(self) -> KVTiersConfig:
        if self.disk is not None and self.host is None:
            raise ValueError("a disk tier sits below a host tier: set kv_tiers.host too")
        return self


class KVTransferConfig(_Strict):
    """How a prefill instance's KV reaches a decode instance (issue 25)."""

    bandwidth_bytes_s: float = Field(
        50e9, gt=0,
        description="per-GPU NIC bandwidth, bytes/s (50e9: one 400 Gb/s RDMA NIC per GPU at line "
        "rate; Mooncake measured about 24e9 per NIC; NVLink inside a node about 450e9)",
    )
    latency_s: float = Field(0.0, ge=0, description="first-byte latency of each transfer, s")
    sharing: Literal["fair", "fifo", "none"] = Field(
        "fair", description="concurrent transfers share NICs max-min fairly, queue, or ignore each other (Dynamo's mocker)"
    )
    tokens: Literal["destination_missing", "full_prompt"] = Field(
        "destination_missing",
        description="transfer only the prompt blocks the decode instance does not cache (vLLM "
        "NixlConnector) or the whole prompt (Dynamo's mocker default)",
    )
    decode_choice: None = Field(
        None, description="moved to the disaggregated policy's params (router.params.decode_choice)"
    )

    @field_validator("decode_choice", mode="before")
    @classmethod
    def _decode_choice_moved(cls, value: Any) -> None:
        if value is not None:
            raise ValueError(
                "the router chooses when it picks the decode instance: set router.params.decode_choice "
                "(pd, dynamo_disagg) instead"
            )
        return None


class PoolConfig(_Strict):
    """A named group of identical instances with one role (issue 25)."""

    name: str = Field(min_length=1)
    role: Literal["both", "prefill", "decode"] = Field(
        "both", description="prefill and decode on the same instance, or one side of a disaggregated pair"
    )
    num_instances: int = Field(gt=0, le=1024)
    profile: str | dict[str, Any] | None = None
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    num_gpu_blocks: int | None = Field(None, gt=0)
    max_num_batched_tokens: int | None = Field(None, gt=0)
    max_num_seqs: int | None = Field(None, gt=0)
    long_prefill_token_threshold: int | None = Field(None, ge=0)
    enable_prefix_caching: bool | None = None
    engine: EngineRelease | None = None
    admission: AdmissionRule | None = None
    async_scheduling: bool | None = None
    free_queue_order: FreeQueueOrder | None = None
    waive_long_prefill_when_alone: bool | None = None
    watermark_blocks_fraction: float | None = Field(None, ge=0, lt=1)
    max_waiting: int | None = Field(None, gt=0)
    max_model_len: int | None = Field(None, gt=1)
    kv_tiers: KVTiersConfig | None = Field(None, description="this pool's lower tiers (default: the cluster's)")

    @field_validator("profile")
    @classmethod
    def _inline_profile(cls, spec: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
        if isinstance(spec, dict):
            check_inline_profile(spec)
        return spec


class ClusterConfig(_Strict):
    num_instances: int = Field(16, gt=0, le=1024, description="instances (one GPU each)")
    profile: str | dict[str, Any] = Field(
        "h20/qwen3-30b-a3b", description="profile name under profiles/, a path, or {kind: linear}"
    )
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    num_gpu_blocks: int | None = Field(None, gt=0, description="override the KV pool size")
    block_size: int = Field(16, gt=0, description="tokens per KV block")
    max_num_batched_tokens: int = Field(8192, gt=0)
    max_num_seqs: int = Field(1024, gt=0)
    long_prefill_token_threshold: int = Field(0, ge=0, description="0 = no per-request cap")
    enable_prefix_caching: bool = True
    cache_generated_blocks: bool = Field(
        True,
        description="full blocks holding generated tokens become prefix-cache entries, as in "
        "vLLM (a follow-up turn hits its predecessor's answer); false: only prompt blocks are "
        "cached, for side-by-side checks with simulators that share no generated block "
        "(Dynamo's mocker)",
    )
    engine: EngineRelease | None = Field(
        None,
        description=f"the vLLM release whose scheduler the instances run (default {DEFAULT_ENGINE}): "
        "sets admission, async_scheduling, free_queue_order and waive_long_prefill_when_alone; "
        "any of those set here wins over the preset",
    )
    admission: AdmissionRule | None = Field(
        None,
        description="when a waiting request may start: its first chunk fits (vLLM v1 to "
        "early 2026), its whole sequence fits (vLLM 0.33), or its whole prompt fits beside "
        "a free-block watermark (vLLM v0, Sarathi, Vidur); default: the engine's",
    )
    async_scheduling: bool | None = Field(
        None, description="plan step N+1 while step N runs (vLLM AsyncScheduler); default: the engine's"
    )
    free_queue_order: FreeQueueOrder | None = Field(
        None,
        description="where freed blocks go in the free queue: all at the back in release order "
        "(vLLM 0.11) or content-free ones at the front (vLLM 0.33); default: the engine's",
    )
    waive_long_prefill_when_alone: bool | None = Field(
        None,
        description="a request alone in the engine is not capped by long_prefill_token_threshold "
        "(vLLM 0.33); default: the engine's",
    )
    watermark_blocks_fraction: float = Field(
        0.01, ge=0, lt=1, description="free-block watermark of whole_prompt_watermark admission"
    )
    kv_connector_poll: Literal["step", "instant"] = Field(
        "step",
        description="when KV that reached an instance from outside (a P/D transfer, a lower-tier load) "
        "and a finished send become usable: at the end of the first step whose connector poll sees "
        "them, as in vLLM (get_finished once per step, applied in update_from_output), or the "
        "instant they land (Dynamo's mocker)",
    )
    max_waiting: int | None = Field(
        None, gt=0, description="per-instance waiting-queue cap; arrivals beyond it are rejected"
    )
    max_model_len: int | None = Field(
        None, gt=1,
        description="context window (prompt + output tokens), as vLLM's --max-model-len: a prompt "
        "of this length or longer is rejected, output stops at the window; default: the profile's "
        "model.max_model_len if it declares one, else unchecked",
    )

    @field_validator("profile")
    @classmethod
    def _inline_profile(cls, spec: str | dict[str, Any]) -> str | dict[str, Any]:
        # An inline profile is checked here, so a typo is reported against the experiment
        # file and field instead of surfacing as a Python TypeError (or, for a negative
        # cost, as a step that ends before it starts) once the run has begun.
        if isinstance(spec, dict):
            check_inline_profile(spec)
        return spec

    pools: list[PoolConfig] | None = Field(
        None, min_length=1,
        description="named pools of instances (roles, profiles, engine settings); absent: one pool "
        "of num_instances instances with the fields above",
    )
    kv_transfer: KVTransferConfig | None = Field(
        None, description="prefill-to-decode KV transfer of disaggregated pools (absent: the defaults "
        "of KVTransferConfig); None keeps a single-pool config's serialized form as it was",
    )
    kv_tiers: KVTiersConfig | None = Field(None, description="host memory / disk KV tiers of every instance")

    @model_validator(mode="after")
    def _pool_shape(self) -> ClusterConfig:
        if self.pools is None:
            return self
        if "num_instances" in self.model_fields_set:
            raise ValueError("num_instances: set it per pool when cluster.pools is given")
        names = [p.name for p in self.pools]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise ValueError(f"pools: two pools are named {dup!r}")
        roles = {p.role for p in self.pools}
        if "prefill" in roles and "decode" not in roles:
            raise ValueError("pools: a prefill pool needs a decode pool to hand its requests to")
        if "decode" in roles and "prefill" not in roles:
            raise ValueError("pools: a decode pool needs a prefill pool to receive requests from")
        if sum(p.num_instances for p in self.pools) > 1024:
            raise ValueError("pools: at most 1024 instances in all")
        return self

    @model_validator(mode="after")
    def _transfer_needs_pools(self) -> ClusterConfig:
        if self.kv_transfer is not None and not self.is_disaggregated:
            raise ValueError("kv_transfer: only a cluster with prefill and decode pools transfers KV")
        return self

    @property
    def transfer(self) -> KVTransferConfig:
        return self.kv_transfer if self.kv_transfer is not None else KVTransferConfig()

    @property
    def is_disaggregated(self) -> bool:
        return self.pools is not None and any(p.role != "both" for p in self.pools)

    def pool_specs(self) -> list[PoolSpec]:
        """Every pool with each engine field resolved (the pool's own value, else the
        cluster's), in order; the instances of pool k follow those of pools 0..k-1."""
        if self.pools is None:
            fields = {f: getattr(self, f) for f in POOL_ENGINE_FIELDS}
            return [PoolSpec("default", "both", self.num_instances, 0, _resolved(fields), self.kv_tiers)]
        out, first = [], 0
        for pool in self.pools:
            fields = {
                f: getattr(self, f) if getattr(pool, f) is None else getattr(pool, f) for f in POOL_ENGINE_FIELDS
            }
            if pool.engine is not None:
                # a pool naming its release takes that release's settings where it sets none
                # itself, not the cluster's explicit ones
                fields.update({f: getattr(pool, f) for f in ENGINE_SETTING_FIELDS})
            tiers = pool.kv_tiers if pool.kv_tiers is not None else self.kv_tiers
            out.append(PoolSpec(pool.name, pool.role, pool.num_instances, first, _resolved(fields), tiers))
            first += pool.num_instances
        return out

    def engine_settings(self) -> EngineSettings:
        """The cluster-level engine behaviour: the preset `engine` names, with every setting
        written in this section taking precedence (pools may differ: `pool_specs`)."""
        return resolve_engine(self.engine, {f: getattr(self, f) for f in ENGINE_SETTING_FIELDS})

    def describe(self) -> str:
        """One line: `16 instances` or `pools prefill 4 x h20/qwen3-30b-a3b (prefill), ...`."""
        if self.pools is None:
            return f"{self.num_instances} instances"
        parts = []
        for pool in self.pool_specs():
            profile = pool.engine["profile"]
            name = profile if isinstance(profile, str) else profile.get("kind", "linear")
            parts.append(f"{pool.name} {pool.num_instances} x {name} ({pool.role})")
        return "pools " + ", ".join(parts)

    @property
    def total_instances(self) -> int:
        return self.num_instances if self.pools is None else sum(p.num_instances for p in self.pools)


def _resolved(fields: dict[str, Any]) -> dict[str, Any]:
    """Pool engine fields with the release's settings filled in where none is set."""
    settings = resolve_engine(fields["engine"], {f: fields[f] for f in ENGINE_SETTING_FIELDS})
    return {**fields, "engine": fields["engine"] or DEFAULT_ENGINE, **dataclasses.asdict(settings)}


class RouterConfig(_Strict):
    policy: str = Field("vllm", description="registered policy name")
    params: dict[str, Any] = Field(default_factory=dict, description="policy constructor args")
    view: dict[str, Any] = Field(
        default_factory=dict, description="router-state realism (kv_view, load_view, ...)"
    )


class FrontEndConfig(_Strict):
    """The client-side latency path (lmsim.engine.frontend); absent: none (the default)."""

    request_s: float = Field(0.005, ge=0, description="API server per request: HTTP, validation, hand-off (s)")
    gateway_s: float = Field(0.0, ge=0, description="an L7 gateway and endpoint-picker hop before the router (s)")
    gateway_bytes_per_s: float | None = Field(
        None, gt=0,
        description="the gateway's request-body path as one FIFO server of this throughput (body bytes/s);"
        " absent: no queue (llm-d's EPP measured 28.4e6, see lmsim.engine.frontend)",
    )
    body_bytes_per_token: float = Field(
        4.0, gt=0, description="request-body bytes per prompt token for prompts without text"
    )
    tokenize_s_per_token: float = Field(1e-6, ge=0, description="prompt tokenisation, seconds per prompt token")
    stream_s: float = Field(0.001, ge=0, description="engine token to client: detokenise, SSE, network (s)")


class SimulationConfig(_Strict):
    fast_forward: bool = Field(True, description="advance runs of decode-only steps at once")
    check: bool = Field(False, description="assert engine invariants after every step")
    sample_interval_s: float = Field(1.0, gt=0, description="instance time-series period")
    drain_limit_s: float | None = Field(
        None, gt=0, description="stop this long after the last arrival (overload)"
    )


class SloConfig(_Strict):
    # Defaults: interactive-chat targets of the kind serving papers quote (DistServe,
    # Sarathi-Serve use TTFT of seconds and TPOT of ~100 ms); set them per study.
    ttft_s: float = Field(2.0, gt=0, description="TTFT target (s) for SLO attainment and goodput")
    tpot_s: float = Field(0.1, gt=0, description="TPOT target (s) for SLO attainment and goodput")


class OutputConfig(_Strict):
    dir: str | None = Field(None, description="run directory; default runs/<name>")
    figures: bool = Field(True, description="write the TTFT/TPOT CDF figure")
    slo: SloConfig = Field(default_factory=SloConfig, description="latency targets for goodput")


class CapacityConfig(_Strict):
    policy: str = Field(
        "vllm",
        description="router policy the capacity search replays: `workload.load` is a fraction of "
        "the capacity under it (vllm: of the JSQ baseline; the seed's 'maximum rate of our "
        "testbed' may mean the best policy's)",
    )
    params: dict[str, Any] = Field(default_factory=dict, description="that policy's params")
    seed: int = Field(
        0, ge=0,
        description="a generated workload's capacity is measured on this seed's draw, so every "
        "`seeds:` repeat offers the same mean rate (and no repeat searches again)",
    )


class FleetPoolConfig(_Strict):
    min_replicas: int | None = Field(None, ge=0, description="fewest instances the scaler may keep")
    max_replicas: int | None = Field(None, gt=0, description="most instances (all are allocated up front)")
    startup_s: float | None = Field(None, ge=0, description="model load until ready (default: weight bytes / load bandwidth + engine init)")
    warmup_s: float | None = Field(None, ge=0, description="after loading, before the router sees it")
    gpus_per_instance: int | None = Field(None, gt=0, description="GPUs one instance holds (cost); default 1")

    @model_validator(mode="after")
    def _bounds(self) -> FleetPoolConfig:
        if self.min_replicas is not None and self.max_replicas is not None and self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas {self.min_replicas} > max_replicas {self.max_replicas}")
        return self


class FleetConfig(_Strict):
    """Instances joining and leaving during a run (lmsim.engine.fleet)."""

    pools: dict[str, FleetPoolConfig] = Field(
        default_factory=dict, description="per pool name ('default' without cluster.pools)"
    )
    startup_s: float | None = Field(None, ge=0, description="every pool's start-up time unless the pool sets one")
    load_bandwidth_bytes_s: float = Field(
        2.0e9, gt=0, description="weights read from storage to GPU when no start-up time is set, bytes/s"
    )
    engine_init_s: float = Field(30.0, ge=0, description="engine start beside the weight load (CUDA graphs, KV pool), s")
    warmup_s: float = Field(0.0, ge=0, description="after loading, before the router sees an instance, s")
    detection_delay_s: float = Field(5.0, ge=0, description="health-check delay before the router stops sending to a crashed instance, s")
    drain_timeout_s: float | None = Field(None, gt=0, description="a draining instance hands back what it still holds after this; None: never")
    dead_view: Literal["frozen", "empty"] = Field(
        "frozen", description="what the router sees of a crashed instance before detection: its last state, or idle and empty"
    )


class AutoscalerConfig(_Strict):
    name: str = Field(description="registered autoscaler (hpa, sla_planner, schedule)")
    params: dict[str, Any] = Field(default_factory=dict, description="autoscaler constructor args")
    interval_s: float = Field(60.0, gt=0, description="adjustment interval, s")
    metrics_delay_s: float = Field(0.0, ge=0, description="age of the scraped metrics a decision reads, s")


class CrashConfig(_Strict):
    time_s: float = Field(ge=0, description="when the instance crashes")
    instance: int = Field(ge=0, description="global instance id")


class FaultsConfig(_Strict):
    crashes: list[CrashConfig] = Field(default_factory=list, description="crashes at given times")
    mtbf_s: float | None = Field(None, gt=0, description="mean time between failures of each instance (Poisson)")
    seed: int = Field(0, ge=0, description="seed of the Poisson crash draws")
    restart_s: float | None = Field(None, ge=0, description="a crashed instance restarts after this (plus start-up); None: stays down")
    in_flight: Literal["retry", "fail"] = Field("retry", description="what happens to a crashed instance's requests")
    retry_after_s: float = Field(0.0, ge=0, description="client timeout before a lost request is sent again, s")
    max_retries: int = Field(1, ge=0, description="resubmissions of one request before it fails")


class CostConfig(_Strict):
    gpu_price_per_hour: dict[str, float] = Field(
        default_factory=dict, description="USD per GPU-hour by GPU key (h20, h100, ...); default: shipped prices"
    )
    window_s: float = Field(60.0, gt=0, description="window of SLO attainment and per-window latency")


class ExperimentConfig(_Strict):
    name: str = "experiment"
    description: str = ""
    seed: int = Field(0, ge=0)
    workload: WorkloadConfig
    cluster: ClusterConfig = ClusterConfig()
    router: RouterConfig = RouterConfig()
    simulation: SimulationConfig = SimulationConfig()
    frontend: FrontEndConfig | None = Field(
        None, description="client-side latency (HTTP, gateway, tokeniser, streaming); absent: none"
    )
    output: OutputConfig = OutputConfig()
    capacity: CapacityConfig = CapacityConfig()
    fleet: FleetConfig | None = Field(None, description="instances joining and leaving (lifecycle); absent: a fixed fleet")
    autoscaler: AutoscalerConfig | None = Field(None, description="the fleet's autoscaler; absent: none")
    faults: FaultsConfig | None = Field(None, description="instance crashes; absent: none")
    cost: CostConfig | None = Field(None, description="GPU prices and SLO windows; absent: shipped prices")
    # A sweep over an empty list would silently run nothing; a scalar is almost always a
    # forgotten pair of brackets.
    sweep: dict[str, Annotated[list[Any], Field(min_length=1)]] | None = Field(
        None, description="dotted key -> non-empty list of values"
    )
    zip: list[list[str]] | None = Field(None, description="groups of sweep keys varied together")
    seeds: Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)] | None = Field(
        None, description="repeat every sweep point once per seed (sets `seed`)"
    )

    # The folder of the YAML this config was read from, where its relative paths (a trace)
    # are looked up. Private: not a field, so never serialized, dumped into config.yaml or
    # digested, and not compared (two reads of the same content are equal).
    _source_dir: Path | None = PrivateAttr(None)

    def to_dict(self) -> dict[str, Any]:
        out = self.model_dump(mode="json")
        # Sections a single-pool cluster does not use are left out while unset, so its
        # resolved config (config.yaml, rerun and resume checks) reads as it always did.
        for key in _CLUSTER_SECTIONS_OMITTED_WHEN_UNSET:
            if out["cluster"].get(key) is None:
                out["cluster"].pop(key, None)
        for key in ("frontend", "fleet", "autoscaler", "faults", "cost"):
            if out.get(key) is None:  # unset: configs read as they did before these existed
                out.pop(key, None)
        if out["workload"].get("rate_schedule") is None:
            out["workload"].pop("rate_schedule", None)
        return out

    @property
    def source_dir(self) -> Path | None:
        """The (absolute) folder of the YAML this config was read from; None when it was
        built in code. `model_copy` keeps it."""
        return self._source_dir

    def from_folder(self, folder: str | Path | None) -> ExperimentConfig:
        """This config, remembering `folder` as where its YAML was (see source_dir)."""
        self._source_dir = Path(folder).resolve() if folder is not None else None
        return self

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ExperimentConfig):
            return NotImplemented
        return self.model_dump() == other.model_dump()

    __hash__ = None  # type: ignore[assignment]  # params are dicts: never hashable


_CLUSTER_SECTIONS_OMITTED_WHEN_UNSET = ("pools", "kv_transfer", "kv_tiers")


def _parse_value(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def apply_overrides(raw: dict[str, Any], overrides: list[str], *, where: str) -> dict[str, Any]:
    """Apply `dotted.key=value` overrides (values parsed as YAML) to a raw config dict; a
    malformed one is reported as its `--set` argument."""
    out = copy.deepcopy(raw)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item}: expected dotted.key=value")
        key, text = item.split("=", 1)
        set_dotted(out, key.strip(), _parse_value(text), where="", label=f"--set {item}")
    return out


def blame_overrides(build: Callable[[list[str]], T], overrides: list[str], *, where: str) -> T:
    """`build(overrides)`, with an error that the `--set` arguments caused named after the
    first of them that makes `build` fail ("--set cluster.num_gpu=8: unknown key"), not
    after the YAML file (`where`), which is named only for its own errors."""
    try:
        return build(overrides)
    except LmsimError as exc:
        if not overrides:
            raise
        error = exc
    for n in range(len(overrides)):
        try:
            build(overrides[:n])
        except LmsimError as exc:
            if n == 0:  # the file alone fails: the file's error, as without overrides
                raise error from None
            raise type(exc)(_naming_set(str(exc), where, overrides[n - 1])) from None
    raise type(error)(_naming_set(str(error), where, overrides[-1])) from None


def _naming_set(message: str, where: str, item: str) -> str:
    if message.startswith("--set "):
        return message
    key = item.split("=", 1)[0].strip()
    rest = message.removeprefix(f"{where}: ").removeprefix(f"{key}: ")
    return f"--set {item}: {rest}"


def set_dotted(raw: dict[str, Any], key: str, value: Any, *, where: str, label: str | None = None) -> None:
    """Set `a.b.c` in nested mappings (made as needed); a number after a list names one of
    its entries (`cluster.pools.0.num_instances`). Errors name `label` (a --set argument),
    else `where: key`."""
    parts = key.split(".")
    node: Any = raw
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(
                    f"{label or f'{where}: {key}'}: {'.'.join(parts[:depth])} has no entry {part!r} ({len(node)} entries)"
                )
            if last:
                node[int(part)] = value
                return
            node = node[int(part)]
            if not isinstance(node, dict | list):
                raise ConfigError(f"{label or f'{where}: {key}'}: {'.'.join(parts[: depth + 1])} is not a mapping")
            continue
        if last:
            node[part] = value
            return
        child = node.get(part)
        if child is None:
            child = {}
            node[part] = child
        if not isinstance(child, dict | list):
            raise ConfigError(f"{label or f'{where}: {key}'}: {part} is not a mapping")
        node = child


def _fields_at(loc: tuple[Any, ...]) -> list[str]:
    """The schema's keys at a dotted location (`("cluster",)` -> ClusterConfig's fields)."""
    model: Any = ExperimentConfig
    for part in loc:
        field = model.model_fields.get(str(part)) if isinstance(model, type) else None
        annotation = field.annotation if field is not None else None
        model = next((a for a in (annotation, *typing.get_args(annotation))
                      if isinstance(a, type) and issubclass(a, BaseModel)), None)  # fmt: skip
        if model is None:
            return []
    return list(model.model_fields)


def _format_validation_error(exc: ValidationError, where: str) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    msg = err["msg"]
    kind = err["type"]
    if kind == "extra_forbidden":
        msg = "unknown key" + suggest(str(err["loc"][-1]), _fields_at(err["loc"][:-1]), label="keys")
    elif kind == "value_error":
        # our own validators: the message is already written for the user
        msg = str(err.get("ctx", {}).get("error", msg.removeprefix("Value error, ")))
    elif kind == "model_type":
        msg = f"must be a mapping (got {err['input']!r})"
    elif err["loc"][:1] == ("sweep",) and kind in ("too_short", "list_type"):
        # the same words `lmsim sweep` uses when it expands the block
        if kind == "too_short":
            msg = "empty list (a sweep axis needs at least one value)"
        else:
            msg = f"expected a list of values, got {err['input']!r}"
    elif "input" in err and kind not in ("missing",) and not isinstance(err["input"], dict):
        msg = f"{msg} (got {err['input']!r})"
    return f"{where}: {loc}: {msg}" if loc else f"{where}: {msg}"


def validate(raw: Any, *, where: str) -> ExperimentConfig:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: the experiment must be a YAML mapping")
    if "plan" in raw:  # a plan file (lmsim.plan) is an experiment plus this section
        raise ConfigError(f"{where}: plan: this is a plan file; run it with `lmsim plan {where.split(' [')[0]}`")
    try:
        return ExperimentConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(exc, where)) from None


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.exists():
        if path.suffix in (".yaml", ".yml"):
            raise ConfigError(f"{path}: experiment file not found")
        from lmsim.shipped import bundled_experiment_names

        # A bare name was meant as a bundled experiment: say which there are.
        raise ConfigError(
            f"{path}: experiment file not found, nor a bundled experiment "
            f"({', '.join(bundled_experiment_names())}; `lmsim list experiments` describes them)"
        )
    if path.is_dir():
        raise ConfigError(f"{path}: is a directory, not an experiment file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start})") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the experiment ({exc.strerror})") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(f"{path}: {line}YAML syntax error: {problem}") from None
    if raw is None:
        raise ConfigError(f"{path}: the file is empty")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the experiment must be a YAML mapping")
    return raw


def load_experiment(
    path: str | Path, overrides: list[str] | None = None,
    check: Callable[[ExperimentConfig, str], None] | None = None,
) -> tuple[ExperimentConfig, dict[str, Any]]:
    """Read, override and validate an experiment (and `check(config, where)` it: the
    command line's checks of policy, view and profile). An error the `--set` overrides
    caused names the `--set` argument, others the file. Relative file paths in the YAML
    are resolved against the working directory, then the YAML's folder. Returns the config
    and the raw (overridden) dict."""
    where = str(path)
    file_raw = read_yaml(path)

    def build(items: list[str]) -> tuple[ExperimentConfig, dict[str, Any]]:
        raw = apply_overrides(file_raw, items, where=where)
        _prefer_overridden_source(raw, items)
        config = validate(raw, where=where).from_folder(Path(path).parent)
        if check is not None:
            check(config, where)
        return config, raw

    return blame_overrides(build, list(overrides or []), where=where)


def _prefer_overridden_source(raw: dict[str, Any], overrides: list[str]) -> None:
    """`--set workload.trace=...` on an experiment that generates its workload (or the
    reverse) replaces the source instead of failing with two sources."""
    keys = [item.split("=", 1)[0].strip() for item in overrides]
    workload = raw.get("workload")
    if not isinstance(workload, dict):
        return
    if "workload.trace" in keys and not any(k.startswith("workload.generator") for k in keys):
        workload.pop("generator", None)
    elif any(k.startswith("workload.generator") for k in keys) and "workload.trace" not in keys:
        workload.pop("trace", None)


KVViewMode = Literal["exact", "approximate", "events"]
