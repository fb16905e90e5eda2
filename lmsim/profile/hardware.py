"""GPU and model facts for the analytic cost model: shipped public specs and a user's own.

* GPUs: one YAML per GPU under `lmsim/data/hardware/gpus/` (`h20`, `h100`, `h200`, `h800`,
  `a100`, `l40s`, `rtx5090`), every number cited in its `sources`, plus the per-GPU efficiency constants
  the analytic form was fitted to (`efficiency`, see `lmsim.profile.analytic`). A user's GPU is
  a YAML file with the same keys (`--gpu my_gpu.yaml`).
* Engines: `lmsim/data/hardware/engines.yaml` describes the serving engines a profile can be
  built for (`--engine`): how decode attention runs (tensor-core tile or FlashInfer's
  CUDA-core/tensor-core dispatch), whether host work overlaps the GPU, and the engine's
  fitted host time. The default, `vllm-v1`, is what the simulator models.
* Models: the keys lmsim reads from a Hugging Face `config.json` (`num_hidden_layers`,
  `hidden_size`, `num_attention_heads`, `num_key_value_heads`, `head_dim`, `intermediate_size`,
  `vocab_size`, `num_experts`/`num_local_experts`/`n_routed_experts`, `num_experts_per_tok`,
  `moe_intermediate_size`, shared experts, `attention_bias`, `tie_word_embeddings`,
  `torch_dtype`, `max_position_embeddings`), either from a file (`--model config.json`) or
  from the public configs shipped as data in `lmsim/data/hardware/models.yaml` (`--model
  qwen3-8b`).

Weights are counted from the config: embedding, per layer the attention projections (with
their bias where the architecture has one), QK norms, the dense MLP or the router, routed and
shared experts and the two norms, the final norm, and the LM head unless it is tied to the
embedding. Qwen2-7B gives 7,615,616,512 parameters (15.23 GB in BF16), the figure of
costmodel.md section 1.

With tensor parallelism N (`shard`), one rank holds 1/N of the query heads, MLP and expert
widths, vocabulary (embedding and LM head) and ceil(kv_heads/N) KV heads (replicated when N
exceeds them), as vLLM's column/row-parallel layers split them; norms are replicated.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from lmsim.errors import ProfileError
from lmsim.shipped import DATA_DIR

HARDWARE_DIR = DATA_DIR / "hardware"
GPUS_DIR = HARDWARE_DIR / "gpus"
MODELS_FILE = HARDWARE_DIR / "models.yaml"
ENGINES_FILE = HARDWARE_DIR / "engines.yaml"

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "bf16": 2, "fp16": 2, "float8_e4m3fn": 1}
# Architectures whose QKV projections carry a bias although config.json has no key saying so.
QKV_BIAS_ARCHITECTURES = {"Qwen2ForCausalLM", "Qwen2MoeForCausalLM"}
# Architectures with RMS norms on q and k per head (head_dim weights each).
QK_NORM_ARCHITECTURES = {"Qwen3ForCausalLM", "Qwen3MoeForCausalLM"}


# -- GPUs ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GpuSpec:
    key: str
    name: str
    peak_bf16_flops: float
    hbm_bandwidth_bytes_s: float
    memory_gb_nominal: float
    memory_mib_visible: float
    sources: dict[str, str]
    arch: str = "hopper"
    peak_fp8_flops: float | None = None
    peak_fp32_flops: float | None = None  # CUDA-core FP32 (FlashInfer's CUDA-core decode kernel)
    interconnect_bandwidth_bytes_s: float = 450e9
    allreduce_latency_s: float = 10e-6
    efficiency: dict[str, Any] = field(default_factory=dict)  # fitted constants (analytic.py)
    efficiency_like: str | None = None  # a shipped GPU whose fitted constants a user spec borrows

    @property
    def memory_gib(self) -> float:
        return self.memory_mib_visible / 1024.0


GPU_REQUIRED = ("name", "peak_bf16_flops", "hbm_bandwidth_bytes_s", "memory_mib_visible")
GPU_OPTIONAL = {
    "arch": "hopper", "peak_fp8_flops": None, "peak_fp32_flops": None, "memory_gb_nominal": None,
    "interconnect_bandwidth_bytes_s": 450e9, "allreduce_latency_s": 10e-6,
    "sources": {}, "efficiency": {}, "efficiency_like": None, "calibration": {},
}
ARCHES = ("hopper", "ampere", "ada", "blackwell")


def shipped_gpus() -> list[str]:
    return sorted(p.stem for p in GPUS_DIR.glob("*.yaml"))


def _read_yaml(path: Path, what: str) -> Any:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read {what} ({exc.strerror})") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        line = getattr(getattr(exc, "problem_mark", None), "line", None)
        at = f" at line {line + 1}" if line is not None else ""
        raise ProfileError(f"{path}: invalid YAML{at}") from None


def _positive(where: str, key: str, value: Any, *, integer: bool = False, zero: bool = False) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = float("nan")
    if isinstance(value, bool) or not number == number or number in (float("inf"), float("-inf")):
        raise ProfileError(f"{where}: field '{key}' must be a number, got {value!r}")
    if number < 0 or (number == 0 and not zero):
        raise ProfileError(f"{where}: field '{key}' must be {'>= 0' if zero else '> 0'}, got {value!r}")
    if integer and number != int(number):
        raise ProfileError(f"{where}: field '{key}' must be an integer, got {value!r}")
    return number


def check_fields(raw: dict[str, Any], where: str, required: tuple[str, ...], optional: Any,
                 *, prefix: str = "", list_known: bool = False) -> None:
    """One ProfileError for the first required key missing or the first unknown key."""
    for k in required:
        if raw.get(k) is None:
            raise ProfileError(f"{where}: missing field '{prefix}{k}'")
    for k in raw:
        if k not in required and k not in optional:
            known = f" (known: {', '.join((*required, *optional))})" if list_known else ""
            raise ProfileError(f"{where}: unknown field '{prefix}{k}'{known}")


def gpu_from_mapping(raw: Any, where: str, key: str) -> GpuSpec:
    if not isinstance(raw, dict):
        raise ProfileError(f"{where}: expected a mapping of GPU facts at the top level")
    check_fields(raw, where, GPU_REQUIRED, GPU_OPTIONAL, list_known=True)
    facts = {**GPU_OPTIONAL, **raw}
    if facts["arch"] not in ARCHES:
        raise ProfileError(f"{where}: field 'arch' must be one of {', '.join(ARCHES)}, got {facts['arch']!r}")
    for k in ("peak_bf16_flops", "hbm_bandwidth_bytes_s", "memory_mib_visible", "interconnect_bandwidth_bytes_s"):
        facts[k] = _positive(where, k, facts[k])
    facts["allreduce_latency_s"] = _positive(where, "allreduce_latency_s", facts["allreduce_latency_s"], zero=True)
    for k in ("peak_fp8_flops", "peak_fp32_flops"):
        if facts[k] is not None:
            facts[k] = _positive(where, k, facts[k])
    nominal = facts["memory_gb_nominal"]
    nominal = facts["memory_mib_visible"] * 1.048576 / 1000 if nominal is None else _positive(
        where, "memory_gb_nominal", nominal)
    for k in ("sources", "efficiency"):
        if not isinstance(facts[k], dict):
            raise ProfileError(f"{where}: field '{k}' must be a mapping")
    like = facts["efficiency_like"]
    if like is not None and str(like) not in shipped_gpus():
        raise ProfileError(f"{where}: field 'efficiency_like' names unknown GPU {like!r} "
                           f"(known: {', '.join(shipped_gpus())})")
    return GpuSpec(
        key=key, name=str(facts["name"]), peak_bf16_flops=facts["peak_bf16_flops"],
        hbm_bandwidth_bytes_s=facts["hbm_bandwidth_bytes_s"], memory_gb_nominal=float(nominal),
        memory_mib_visible=facts["memory_mib_visible"],
        sources={str(k): str(v) for k, v in facts["sources"].items()}, arch=str(facts["arch"]),
        peak_fp8_flops=facts["peak_fp8_flops"], peak_fp32_flops=facts["peak_fp32_flops"],
        interconnect_bandwidth_bytes_s=facts["interconnect_bandwidth_bytes_s"],
        allreduce_latency_s=facts["allreduce_latency_s"], efficiency=dict(facts["efficiency"]),
        efficiency_like=None if like is None else str(like),
    )


def load_gpu(name_or_path: str | Path, *, where: str = "--gpu") -> GpuSpec:
    """A shipped GPU by key (`h20`) or a user's spec YAML (a path ending in .yaml/.yml)."""
    text = str(name_or_path)
    path = Path(text)
    if text.endswith((".yaml", ".yml")) or path.is_file():
        return gpu_from_mapping(_read_yaml(path, "GPU spec"), str(path), path.stem)
    key = text.lower()
    shipped = GPUS_DIR / f"{key}.yaml"
    if not shipped.is_file():
        raise ProfileError(f"{where}: unknown GPU {text!r} (known: {', '.join(shipped_gpus())}; "
                           "or a path to your own GPU spec YAML)")
    return gpu_from_mapping(_read_yaml(shipped, "GPU spec"), str(shipped), key)


# -- engines ------------------------------------------------------------------------------------
DECODE_PATHS = ("tensor_tile", "flashinfer")
KV_LAYOUTS = ("paged", "dense")
ENGINE_FIELDS = {"name": "", "matches": [], "decode_attention": "tensor_tile", "decode_tile_rows": 64,
                 "prefill_kv_layout": "paged", "moe_power_law_alpha": None, "moe_block_rows": None, "host_overlap": False,
                 "cuda_graph_max_context": None, "sources": {}}


@dataclass(frozen=True)
class EngineSpec:
    """A serving engine's traits that change step costs (engines.yaml)."""

    key: str
    name: str
    matches: tuple[str, ...] = ()
    decode_attention: str = "tensor_tile"
    decode_tile_rows: int = 64
    prefill_kv_layout: str = "paged"
    moe_power_law_alpha: float | None = None  # a benchmark's synthetic routing; None: uniform
    moe_block_rows: int | None = None  # a grouped GEMM aligning every expert to this many rows
    host_overlap: bool = False
    cuda_graph_max_context: int | None = None
    sources: dict[str, str] = field(default_factory=dict)
    efficiency: dict[str, Any] = field(default_factory=dict)  # fitted overrides (calibrate)


@dataclass(frozen=True)
class EngineTable:
    default: str
    engines: dict[str, EngineSpec]

    def for_text(self, text: str) -> EngineSpec:
        """The engine a measurement's `engine` column names: the first entry with a matching
        substring (case-insensitive), else the default."""
        low = text.lower()
        for spec in self.engines.values():
            if any(m.lower() in low for m in spec.matches):
                return spec
        return self.engines[self.default]


def _engine_from_mapping(key: str, raw: Any, fitted: Any, where: str) -> EngineSpec:
    if not isinstance(raw, dict):
        raise ProfileError(f"{where}: engine {key!r} must be a mapping")
    check_fields(raw, where, (), ENGINE_FIELDS, prefix=f"engines.{key}.", list_known=True)
    facts = {**ENGINE_FIELDS, **raw}
    if facts["decode_attention"] not in DECODE_PATHS:
        raise ProfileError(f"{where}: field 'engines.{key}.decode_attention' must be one of "
                           f"{', '.join(DECODE_PATHS)}, got {facts['decode_attention']!r}")
    if facts["prefill_kv_layout"] not in KV_LAYOUTS:
        raise ProfileError(f"{where}: field 'engines.{key}.prefill_kv_layout' must be one of "
                           f"{', '.join(KV_LAYOUTS)}, got {facts['prefill_kv_layout']!r}")
    rows = int(_positive(where, f"engines.{key}.decode_tile_rows", facts["decode_tile_rows"], integer=True))
    graph = facts["cuda_graph_max_context"]
    if graph is not None:
        graph = int(_positive(where, f"engines.{key}.cuda_graph_max_context", graph, integer=True))
    if not isinstance(facts["matches"], list) or not isinstance(facts["sources"], dict):
        raise ProfileError(f"{where}: engine {key!r}: 'matches' must be a list and 'sources' a mapping")
    if fitted is not None and not isinstance(fitted, dict):
        raise ProfileError(f"{where}: field 'fitted.{key}' must be a mapping")
    return EngineSpec(key=key, name=str(facts["name"] or key), matches=tuple(str(m) for m in facts["matches"]),
                      decode_attention=facts["decode_attention"], decode_tile_rows=rows,
                      prefill_kv_layout=facts["prefill_kv_layout"],
                      moe_power_law_alpha=None if facts["moe_power_law_alpha"] is None else _positive(
                          where, f"engines.{key}.moe_power_law_alpha", facts["moe_power_law_alpha"]),
                      moe_block_rows=None if facts["moe_block_rows"] is None else int(_positive(
                          where, f"engines.{key}.moe_block_rows", facts["moe_block_rows"], integer=True)),
                      host_overlap=bool(facts["host_overlap"]), cuda_graph_max_context=graph,
                      sources={str(k): str(v) for k, v in facts["sources"].items()},
                      efficiency=dict(fitted or {}))


def load_engines(path: Path = ENGINES_FILE) -> EngineTable:
    raw = _read_yaml(path, "engine table")
    if not isinstance(raw, dict) or not isinstance(raw.get("engines"), dict):
        raise ProfileError(f"{path}: expected a mapping with 'engines'")
    fitted = raw.get("fitted") or {}
    engines = {str(k): _engine_from_mapping(str(k), v, fitted.get(k), str(path)) for k, v in raw["engines"].items()}
    default = str(raw.get("default", ""))
    if default not in engines:
        raise ProfileError(f"{path}: field 'default' names unknown engine {default!r}")
    return EngineTable(default, engines)


def load_engine(name: str | None = None, *, where: str = "--engine") -> EngineSpec:
    """A shipped engine by key (`sglang-0.4`); None gives the default (vLLM v1)."""
    table = load_engines()
    if name is None:
        return table.engines[table.default]
    if name not in table.engines:
        raise ProfileError(f"{where}: unknown engine {name!r} (known: {', '.join(table.engines)})")
    return table.engines[name]


# -- models -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelSpec:
    """The dimensions the cost model needs. With tensor parallelism (`tp` > 1) the head counts,
    widths, vocabulary and weight bytes are one rank's share (see `shard`)."""

    key: str
    name: str
    layers: int
    hidden_size: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    vocab_size: int
    intermediate_size: int  # dense MLP width every token passes (shared experts included); 0 for all-MoE
    qkv_bias: bool
    experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    weight_bytes: int = 0
    non_kv_overhead_gib: float = 3.0
    sources: dict[str, str] = field(default_factory=dict)
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 0
    dtype_bytes: int = 2
    tp: int = 1
    moe_layers: int = -1  # layers with routed experts; -1 = every layer when experts > 0
    whole_kv_heads: int = 0  # the whole model's KV heads when this is one rank's share

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def moe_layer_count(self) -> int:
        if not self.is_moe:
            return 0
        return self.layers if self.moe_layers < 0 else self.moe_layers

    @property
    def attention_params_per_layer(self) -> float:
        h, d = self.hidden_size, self.head_dim
        q = h * self.attention_heads * d
        kv = 2 * h * self.kv_heads * d
        o = self.attention_heads * d * h
        bias = (self.attention_heads + 2 * self.kv_heads) * d if self.qkv_bias else 0
        return float(q + kv + o + bias)

    @property
    def dense_params_per_layer(self) -> float:
        """Parameters every token touches in one layer: attention projections, dense MLP, router."""
        mlp = 3 * self.hidden_size * self.intermediate_size
        router = self.hidden_size * self.experts * self.moe_layer_count / self.layers
        return self.attention_params_per_layer + float(mlp) + float(router)

    @property
    def dense_activations_per_layer(self) -> tuple[float, float]:
        """(inputs, outputs) one token reads and writes through the layer's dense GEMMs: the
        K and N of QKV, O, gate-up, down and the router. QKV and gate-up each read the hidden
        state on their own, so it counts twice."""
        h, d = self.hidden_size, self.head_dim
        q, kv = self.attention_heads * d, self.kv_heads * d
        i = self.intermediate_size
        router = self.experts * self.moe_layer_count / self.layers
        inputs = h + q + (h + i if i else 0) + (h if router else 0)
        outputs = (q + 2 * kv) + h + (2 * i + h if i else 0) + router
        return float(inputs), float(outputs)

    @property
    def expert_params(self) -> float:
        return float(3 * self.hidden_size * self.moe_intermediate_size)

    @property
    def kv_bytes_per_token_layer(self) -> int:
        return 2 * self.kv_heads * self.head_dim * 2

    @property
    def kv_bytes_per_token(self) -> int:
        return self.layers * self.kv_bytes_per_token_layer


def shipped_models() -> dict[str, dict[str, Any]]:
    raw = _read_yaml(MODELS_FILE, "model table")
    if not isinstance(raw, dict):
        raise ProfileError(f"{MODELS_FILE}: expected a mapping of model names")
    return raw


def _model_names() -> dict[str, str]:
    """Every accepted name (key and aliases, lower case) -> the entry's key."""
    names = {}
    for key, entry in shipped_models().items():
        names[key.lower()] = key
        for alias in entry.get("aliases") or ():
            names[str(alias).lower()] = key
    return names


def _int(cfg: dict, where: str, key: str, default: Any = None, *, zero: bool = False) -> int:
    value = cfg.get(key, default)
    if value is None:
        raise ProfileError(f"{where}: missing field '{key}'")
    return int(_positive(where, key, value, integer=True, zero=zero))


def _first(cfg: dict, keys: tuple[str, ...]) -> tuple[str | None, Any]:
    for k in keys:
        if cfg.get(k) is not None:
            return k, cfg[k]
    return None, None


class ModelConfigWarning(UserWarning):
    """A model config field changes the real model's cost but lmsim does not price it."""


def _warn_ignored_fields(cfg: dict, where: str) -> None:
    """Say so when a config's attention window is narrower than its context: lmsim prices
    attention over the whole context, so a sliding-window model (Mistral-7B v0.1: 4,096)
    is priced too dear past the window. Qwen2's configs carry `sliding_window` with
    `use_sliding_window: false`, which vLLM ignores too, so no warning there."""
    window = cfg.get("sliding_window")
    if window is None or cfg.get("use_sliding_window") is False:
        return
    context = cfg.get("max_position_embeddings")
    if isinstance(context, int) and isinstance(window, int) and window >= context:
        return
    warnings.warn(f"{where}: field 'sliding_window' ({window}) is ignored: attention is priced "
                  "over the whole context, so steps past the window cost more than on the real model",
                  ModelConfigWarning, stacklevel=2)


def model_from_config(cfg: Any, where: str, *, key: str, name: str, source: str) -> ModelSpec:
    """A `ModelSpec` (whole model, tp 1) from the keys of a Hugging Face config.json."""
    if not isinstance(cfg, dict):
        raise ProfileError(f"{where}: expected a JSON object of config.json keys")
    if isinstance(cfg.get("text_config"), dict):  # multimodal wrappers keep the LM in text_config
        cfg = {**cfg["text_config"], "architectures": cfg.get("architectures")}
    _warn_ignored_fields(cfg, where)
    layers = _int(cfg, where, "num_hidden_layers")
    hidden = _int(cfg, where, "hidden_size")
    heads = _int(cfg, where, "num_attention_heads")
    kv_heads = _int(cfg, where, "num_key_value_heads", heads)
    if hidden % heads and cfg.get("head_dim") is None:
        raise ProfileError(f"{where}: missing field 'head_dim' (hidden_size {hidden} is not a "
                           f"multiple of num_attention_heads {heads})")
    head_dim = _int(cfg, where, "head_dim", hidden // heads)
    if kv_heads > heads or heads % kv_heads:
        raise ProfileError(f"{where}: field 'num_key_value_heads' {kv_heads} must divide "
                           f"num_attention_heads {heads}")
    vocab = _int(cfg, where, "vocab_size")
    archs = cfg.get("architectures") or []
    arch = str(archs[0]) if isinstance(archs, list) and archs else ""
    expert_key, experts = _first(cfg, ("num_experts", "num_local_experts", "n_routed_experts"))
    experts = 0 if experts is None else int(_positive(where, expert_key, experts, integer=True, zero=True))
    per_token = _int(cfg, where, "num_experts_per_tok", 0, zero=True) if experts else 0
    if experts and not per_token:
        raise ProfileError(f"{where}: missing field 'num_experts_per_tok' (the model has {experts} experts)")
    dense_width = _int(cfg, where, "intermediate_size", 0 if experts else None, zero=bool(experts))
    expert_width, moe_layers, shared = 0, -1, 0
    if experts:
        # Mixtral names the expert width intermediate_size; Qwen-MoE and DeepSeek use
        # moe_intermediate_size and keep intermediate_size for dense layers.
        if cfg.get("moe_intermediate_size") is not None:
            expert_width = _int(cfg, where, "moe_intermediate_size")
        else:
            expert_width, dense_width = dense_width, 0
        dense_layers = set(cfg.get("mlp_only_layers") or [])
        step = int(cfg.get("decoder_sparse_step") or 1)
        first_dense = int(cfg.get("first_k_dense_replace") or 0)
        sparse = [i for i in range(layers)
                  if i not in dense_layers and i >= first_dense and (i + 1) % step == 0]
        moe_layers = len(sparse)
        if cfg.get("moe_intermediate_size") is not None and moe_layers == layers:
            dense_width = 0  # intermediate_size is unused when every layer is sparse
        else:
            dense_width = dense_width * (layers - moe_layers) // layers  # spread over layers
        if cfg.get("shared_expert_intermediate_size"):
            shared = _int(cfg, where, "shared_expert_intermediate_size")
        elif cfg.get("n_shared_experts"):
            shared = _int(cfg, where, "n_shared_experts") * expert_width
        shared = shared * moe_layers // layers
    bias_value = cfg.get("attention_bias")
    qkv_bias = bool(bias_value) if bias_value is not None else arch in QKV_BIAS_ARCHITECTURES
    tie = bool(cfg.get("tie_word_embeddings", False))
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    if dtype not in DTYPE_BYTES:
        raise ProfileError(f"{where}: field 'torch_dtype' {dtype!r} is not one of {', '.join(DTYPE_BYTES)}")
    max_pos = _int(cfg, where, "max_position_embeddings", 0, zero=True)
    model = ModelSpec(
        key=key, name=name, layers=layers, hidden_size=hidden, attention_heads=heads,
        kv_heads=kv_heads, head_dim=head_dim, vocab_size=vocab,
        intermediate_size=dense_width + shared, qkv_bias=qkv_bias, experts=experts,
        experts_per_token=per_token, moe_intermediate_size=expert_width,
        non_kv_overhead_gib=3.5 if experts else 3.0, tie_word_embeddings=tie,
        max_position_embeddings=max_pos, dtype_bytes=2, moe_layers=moe_layers,
        sources={
            "config": source,
            "weight_bytes": "counted from the config (lmsim.profile.hardware), 2 B per parameter",
            "non_kv_overhead_gib": "costmodel.md 3.3: activation + non-torch + CUDA graph, "
                                   f"assumed {3.5 if experts else 3.0} GiB ({'MoE' if experts else 'dense'})",
        },
    )
    params = count_parameters(model, qk_norm=arch in QK_NORM_ARCHITECTURES)
    return replace(model, weight_bytes=int(2 * params))


def count_parameters(m: ModelSpec, *, qk_norm: bool = False) -> int:
    """Parameters of one rank (the whole model at tp 1), as the module docstring counts them."""
    h = m.hidden_size
    per_layer = m.attention_params_per_layer + 2 * h + (2 * m.head_dim if qk_norm else 0)
    per_layer += 3 * h * m.intermediate_size
    total = m.layers * per_layer
    total += m.moe_layer_count * (h * m.experts + m.experts * m.expert_params)
    embedding = m.vocab_size * h
    return int(total + h + embedding + (0 if m.tie_word_embeddings else embedding))


def load_model(name_or_path: str | Path, *, where: str = "--model") -> ModelSpec:
    """A model from a config.json path, or a shipped public config by name (`qwen3-8b`)."""
    text = str(name_or_path)
    path = Path(text)
    if text.endswith(".json") or path.is_file():
        try:
            raw = path.read_text()
        except OSError as exc:
            raise ProfileError(f"{path}: cannot read model config ({exc.strerror})") from None
        try:
            cfg = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ProfileError(f"{path}: invalid JSON at line {exc.lineno}") from None
        stem = path.parent.name if path.name == "config.json" else path.stem
        return model_from_config(cfg, str(path), key=stem.lower(), name=stem, source=f"{path.name} given by the user")
    names = _model_names()
    key = names.get(text.lower().split("/")[-1])
    if key is None:
        raise ProfileError(f"{where}: unknown model {text!r} (not in lmsim/data/hardware/models.yaml; "
                           "give a path to its Hugging Face config.json)")
    entry = shipped_models()[key]
    cfg = entry.get("config")
    return model_from_config(cfg, f"{MODELS_FILE.name}: {key}", key=key, name=key,
                             source=f"{entry.get('source', '')} (public config.json, shipped in "
                                    f"lmsim/data/hardware/models.yaml)")


def shard(model: ModelSpec, tp: int, *, where: str = "--tp") -> ModelSpec:
    """One rank's share of `model` under tensor parallelism `tp` (module docstring)."""
    if tp == 1:
        return model
    if tp < 1 or model.attention_heads % tp:
        raise ProfileError(f"{where}: {tp} must be >= 1 and divide the {model.attention_heads} attention heads")
    rank = replace(
        model, attention_heads=model.attention_heads // tp, kv_heads=-(-model.kv_heads // tp),
        vocab_size=-(-model.vocab_size // tp), intermediate_size=model.intermediate_size // tp,
        moe_intermediate_size=model.moe_intermediate_size // tp, tp=tp,
        whole_kv_heads=model.kv_heads,
    )
    # Norms are replicated; everything else is this rank's share.
    params = model.weight_bytes // 2
    h = model.hidden_size
    norms = model.layers * 2 * h + h
    replicated_kv = (rank.kv_heads * tp - model.kv_heads) * 2 * h * model.head_dim * model.layers
    per_rank = (params - norms) / tp + norms + replicated_kv / tp
    return replace(rank, weight_bytes=int(2 * per_rank))


# -- which GPU a name or profile means (pricing: lmsim.fleet_cost) ------------------------------


def gpu_key(name: str | None) -> str | None:
    """The shipped GPU key a GPU name means: a key itself (`h20`), a spec's name (`NVIDIA H20
    96GB`), or a name holding a key as a word (`NVIDIA A100 80GB` -> a100, a profile name
    `h20/qwen2-7b` -> h20; `h200` is not `h20`). None when nothing matches."""
    if not name:
        return None
    keys = shipped_gpus()
    text = str(name).strip().lower()
    if text in keys:
        return text
    for key in keys:
        if load_gpu(key).name.lower() == text:
            return key
    words = text.replace("-", " ").replace("_", " ").replace("/", " ").split()
    return next((key for key in keys if key in words), None)


def profile_gpu(profile: str | dict) -> tuple[str | None, int]:
    """(GPU key, GPUs per instance) of a pool's profile: a shipped profile name
    (`h20/qwen2-7b`: its folder names the GPU), a profile folder (its `hardware.gpu`), or an
    inline profile (no GPU: None). GPUs per instance is the profile's tensor-parallel size."""
    if isinstance(profile, dict):
        return None, 1
    import yaml

    from lmsim.errors import LmsimError
    from lmsim.profile.tables import resolve_profile

    try:
        meta = yaml.safe_load(resolve_profile(profile).read_text()) or {}
    except (LmsimError, OSError, yaml.YAMLError):
        meta = {}
    tp = int((meta.get("parallel") or {}).get("tensor_parallel_size", 1) or 1)
    head = str(profile).replace("\\", "/").split("/")[0]
    key = gpu_key(head) or gpu_key((meta.get("hardware") or {}).get("gpu"))
    return key, tp
