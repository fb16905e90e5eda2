"""The schema of `profile.yaml`: every field, its type and meaning, and a checker that lists
every problem (one line each) instead of stopping at the first.

`FIELDS` is the single source of truth: `read_profile` rejects a profile whose required
fields are missing or malformed (first problem), `lmsim profile validate` prints all of them
(and, strictly, unknown fields and facts that contradict each other), and
`profiles/README.md` documents the same table.

Per-GPU facts: with tensor parallelism (`parallel.tensor_parallel_size` > 1) every memory
fact describes ONE GPU (one rank): `model.weight_bytes` is the weight shard a rank holds and
`model.kv_bytes_per_token` the KV bytes a rank stores per token (its share of the KV heads).
Step times are those of the whole tensor-parallel group, communication included.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from lmsim.profile.decode_batch import DECODE_BATCH_FORMS

FORMAT = "lmsim-profile/1"


@dataclass(frozen=True)
class Field:
    key: str  # dotted: section.name
    kind: str  # str | number | int | bool
    required: bool
    minimum: str  # "" (none), ">= 0" or "> 0"
    doc: str


FIELDS: tuple[Field, ...] = (
    Field("format", "str", False, "", f"`{FORMAT}`"),
    Field("name", "str", False, "", "profile name (default: `<gpu>/<model>` from the folder)"),
    Field("hardware.gpu", "str", True, "", "GPU name"),
    Field("hardware.memory_gib", "number", True, "> 0", "memory of one GPU the KV pool is carved from, GiB"),
    Field("hardware.memory_gb_nominal", "number", False, ">= 0", "marketing size, GB (informational)"),
    Field("hardware.hbm_bandwidth_bytes_s", "number", True, "> 0", "HBM bandwidth, bytes/s"),
    Field("hardware.peak_bf16_flops", "number", True, "> 0", "dense BF16 peak, FLOP/s"),
    Field("hardware.network", "str", False, "", "interconnect the collectives were measured on"),
    Field("parallel.tensor_parallel_size", "int", False, "> 0",
          "GPUs one instance spans (default 1); memory facts are per GPU"),
    Field("model.name", "str", True, "", "model name"),
    Field("model.layers", "int", True, "> 0", "transformer layers"),
    Field("model.hidden_size", "int", False, "> 0", "embedding width"),
    Field("model.attention_heads", "int", True, "> 0", "query heads (whole model)"),
    Field("model.kv_heads", "int", True, "> 0", "KV heads (whole model)"),
    Field("model.head_dim", "int", True, "> 0", "head width"),
    Field("model.intermediate_size", "int", False, ">= 0", "dense MLP width (0 for all-MoE)"),
    Field("model.vocab_size", "int", False, "> 0", "vocabulary size"),
    Field("model.kv_dtype_bytes", "int", False, "> 0",
          "bytes per KV element; when set, kv_bytes_per_token is checked against the dimensions"),
    Field("model.kv_bytes_per_token", "int", True, "> 0",
          "KV bytes ONE GPU stores per token: 2 x layers x ceil(kv_heads / tp) x head_dim x kv_dtype_bytes"),
    Field("model.weight_bytes", "number", True, ">= 0", "weight bytes ONE GPU holds (its tensor-parallel shard)"),
    Field("model.dense_params_per_layer", "number", False, ">= 0", "parameters every token touches per layer"),
    Field("model.experts", "int", True, ">= 0", "routed experts (0 for a dense model)"),
    Field("model.experts_per_token", "int", False, ">= 0", "experts each token is routed to"),
    Field("model.moe_intermediate_size", "int", False, ">= 0", "expert MLP width"),
    Field("model.qkv_bias", "bool", False, "", "QKV projections carry a bias"),
    Field("memory.non_kv_overhead_gib", "number", True, ">= 0",
          "activations, CUDA graphs, non-torch memory per GPU, GiB"),
    Field("memory.kv_pool_slot_tokens", "int", False, "> 0",
          "round the KV pool down to whole slots of this many tokens (Vidur reserves max-length "
          "request slots)"),
    Field("memory.reference_gpu_memory_utilization", "number", False, "> 0",
          "the utilization (1 - memory margin) the measured system ran at; set the same "
          "cluster.gpu_memory_utilization to get its KV pool"),
    Field("memory.note", "str", False, "", "free text"),
    Field("step.fixed_s", "number", True, ">= 0", "cost of every step, s"),
    Field("step.cpu_per_token_s", "number", True, ">= 0", "CPU cost per scheduled token, s"),
    Field("step.host_overlap", "bool", False, "",
          "the engine prepares the next step on the CPU while the GPU runs this one (SGLang's "
          "overlap scheduler): a step costs max(cpu_s + cpu_per_token_s x T, the rest) instead of "
          "their sum (default false, vLLM v1)"),
    Field("step.decode_batch", "str", False, "",
          "how a decode batch of mixed KV lengths is priced: `longest` (default), the decode table "
          "at (total / longest, total), or `mean`, at (batch, total) as if every sequence had the "
          "mean length (Vidur's rule); equal lengths give the same either way "
          "(`lmsim.profile.decode_batch`)"),
    Field("limits.decode_context_per_sequence", "int", False, "> 0",
          "largest per-sequence KV length the decode table was measured at; a decode step whose "
          "mean context exceeds it counts as outside the grid"),
    Field("limits.prefill_kv", "int", False, "> 0",
          "largest KV length (cached + chunk) the prefill table was measured at; a chunk beyond it "
          "counts as outside the grid"),
    Field("tables.tokens", "str", True, "", "file of `tokens,dense_s,moe_s`"),
    Field("tables.seqs", "str", True, "", "file of `seqs,lm_head_s,cpu_s`"),
    Field("tables.prefill_attention", "str", True, "", "matrix file `chunk_tokens/cached_context`"),
    Field("tables.decode_attention", "str", True, "", "matrix file `batch/total_context`"),
    Field("provenance.generated_by", "str", True, "", "the command that wrote the profile"),
    Field("provenance.date", "str", True, "", "ISO date"),
)

SECTIONS = ("hardware", "parallel", "model", "memory", "step", "limits", "tables", "provenance")
# Sections whose every key is listed above; provenance is free-form beyond its two keys.
CLOSED_SECTIONS = ("hardware", "parallel", "model", "memory", "step", "limits", "tables")


def _lookup(meta: dict[str, Any], key: str) -> tuple[bool, Any]:
    section, _, name = key.partition(".")
    if not name:
        return key in meta and meta[key] is not None, meta.get(key)
    sec = meta.get(section)
    if not isinstance(sec, dict) or name not in sec or sec[name] is None:
        return False, None
    return True, sec[name]


def _as_number(value: Any) -> Any:
    if isinstance(value, str):  # YAML 1.1 reads `1.0e12` (no exponent sign) as a string
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _check_value(f: Field, value: Any) -> str | None:
    if f.kind == "str":
        return None if isinstance(value, str | int | float) and not isinstance(value, bool) else (
            f"field '{f.key}' must be a string, got {value!r}")
    if f.kind == "bool":
        return None if isinstance(value, bool) else f"field '{f.key}' must be true or false, got {value!r}"
    value = _as_number(value)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return f"field '{f.key}' must be a finite number, got {value!r}"
    if f.kind == "int" and value != int(value):
        return f"field '{f.key}' must be an integer, got {value!r}"
    if f.minimum == "> 0" and value <= 0:
        return f"field '{f.key}' must be > 0, got {value!r}"
    if f.minimum == ">= 0" and value < 0:
        return f"field '{f.key}' must be >= 0, got {value!r}"
    return None


def expected_kv_bytes_per_token(model: dict[str, Any], tensor_parallel_size: int) -> int:
    """KV bytes one rank stores per token: its ceil(kv_heads / tp) heads (KV heads are
    replicated when tp exceeds them), keys and values, every layer."""
    heads = -(-int(model["kv_heads"]) // tensor_parallel_size)
    return 2 * int(model["layers"]) * heads * int(model["head_dim"]) * int(model["kv_dtype_bytes"])


def validate_meta(meta: Any, *, strict: bool = False) -> list[str]:
    """Problems with a parsed profile.yaml, one line each (without the file name).

    `strict` also reports unknown fields in the closed sections and facts that contradict
    each other (what `lmsim profile validate` checks beyond what loading needs)."""
    if not isinstance(meta, dict):
        return ["expected a mapping at the top level"]
    problems: list[str] = []
    for section in SECTIONS:
        if section in meta and not isinstance(meta[section], dict):
            problems.append(f"field '{section}' must be a mapping")
    for f in FIELDS:
        present, value = _lookup(meta, f.key)
        if not present:
            if f.required:
                section = f.key.partition(".")[0]
                if not isinstance(meta.get(section), dict):
                    if f"missing field '{section}'" not in problems:
                        problems.append(f"missing field '{section}'")
                else:
                    problems.append(f"missing field '{f.key}'")
            continue
        problem = _check_value(f, value)
        if problem:
            problems.append(problem)
    present, form = _lookup(meta, "step.decode_batch")
    if present and isinstance(form, str) and form not in DECODE_BATCH_FORMS:
        problems.append(f"field 'step.decode_batch' must be one of {', '.join(DECODE_BATCH_FORMS)}, got {form!r}")
    if meta.get("format") is not None and meta.get("format") != FORMAT:
        problems.append(f"field 'format' must be {FORMAT!r}, got {meta['format']!r}")
    if not strict:
        return problems
    known = {f.key for f in FIELDS}
    for section in CLOSED_SECTIONS:
        if isinstance(meta.get(section), dict):
            for name in meta[section]:
                if f"{section}.{name}" not in known:
                    problems.append(f"unknown field '{section}.{name}'")
    if problems:  # the cross-checks below need every field well formed
        return problems
    model = meta["model"]
    tp = int(meta.get("parallel", {}).get("tensor_parallel_size", 1))
    if int(model["kv_heads"]) > int(model["attention_heads"]):
        problems.append("field 'model.kv_heads' exceeds 'model.attention_heads'")
    if int(model["attention_heads"]) % tp:
        problems.append(
            f"field 'parallel.tensor_parallel_size' {tp} does not divide 'model.attention_heads' "
            f"{model['attention_heads']}"
        )
    if model.get("kv_dtype_bytes") is not None:
        want = expected_kv_bytes_per_token(model, tp)
        if int(model["kv_bytes_per_token"]) != want:
            problems.append(
                f"field 'model.kv_bytes_per_token' is {model['kv_bytes_per_token']} but the dimensions "
                f"give {want} per GPU at tensor_parallel_size {tp}"
            )
    return problems


def schema_markdown() -> str:
    """The field table of profiles/README.md (kept in step by a test)."""
    lines = ["| field | type | required | meaning |", "|---|---|---|---|"]
    for f in FIELDS:
        kind = f.kind + (f", {f.minimum}" if f.minimum else "")
        lines.append(f"| `{f.key}` | {kind} | {'yes' if f.required else 'no'} | {f.doc} |")
    return "\n".join(lines)
