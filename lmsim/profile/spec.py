"""A starting profile from model dimensions and GPU facts alone (`lmsim profile fit --spec`).

For a GPU or model lmsim ships no profile for, `profile fit` needs a base whose shapes the
measurements then correct. This builds one from the analytic model (`analytic.py`) given a
small YAML:

```yaml
gpu: {name: NVIDIA A100 80GB, memory_gib: 80, peak_bf16_flops: 312e12, hbm_bandwidth_bytes_s: 2.039e12}
model: {name: Llama-2-70B, layers: 80, hidden_size: 8192, attention_heads: 64, kv_heads: 8,
        head_dim: 128, intermediate_size: 28672, vocab_size: 32000}
parallel: {tensor_parallel_size: 2}     # optional
```

Optional model keys: `weight_bytes` (whole model; default 2 B per parameter of the dense
formula), `qkv_bias`, `experts`, `experts_per_token`, `moe_intermediate_size`,
`non_kv_overhead_gib` (default 3). With tensor parallelism the analytic model prices one rank
(heads, KV heads rounded up, MLP and expert widths, vocabulary and weights divided by N); the
all-reduces are not modelled, so the fit's fixed and token corrections absorb them. Memory facts
are per GPU, as the profile schema requires.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from lmsim.errors import ProfileError
from lmsim.profile.analytic import AnalyticModel, tabulate
from lmsim.profile.hardware import GpuSpec, ModelSpec, check_fields
from lmsim.profile.tables import ProfileData

GPU_KEYS = ("name", "memory_gib", "peak_bf16_flops", "hbm_bandwidth_bytes_s")
MODEL_KEYS = ("name", "layers", "hidden_size", "attention_heads", "kv_heads", "head_dim",
              "intermediate_size", "vocab_size")
OPTIONAL_MODEL = {"weight_bytes": None, "qkv_bias": False, "experts": 0, "experts_per_token": 0,
                  "moe_intermediate_size": 0, "non_kv_overhead_gib": 3.0}


def _section(spec: dict[str, Any], where: str, name: str, keys: tuple[str, ...], extra: dict) -> dict:
    sec = spec.get(name)
    if not isinstance(sec, dict):
        raise ProfileError(f"{where}: missing field {name!r}")
    check_fields(sec, where, keys, extra, prefix=f"{name}.")
    for key in keys + tuple(extra):
        value = sec.get(key)
        if key in ("name", "qkv_bias") or value is None:
            continue
        try:
            value = float(value)
        except (TypeError, ValueError):
            raise ProfileError(f"{where}: field '{name}.{key}' must be a number, got {sec[key]!r}") from None
        if value < 0 or (value == 0 and key in keys):
            raise ProfileError(f"{where}: field '{name}.{key}' must be > 0, got {sec[key]!r}")
    return {**extra, **sec}


def base_from_spec(path: str | Path) -> ProfileData:
    """The analytic profile of one tensor-parallel rank described by the YAML at `path`."""
    path = Path(path)
    try:
        spec = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read ({exc.strerror})") from None
    except yaml.YAMLError:
        raise ProfileError(f"{path}: invalid YAML") from None
    if not isinstance(spec, dict):
        raise ProfileError(f"{path}: expected a mapping at the top level")
    gpu = _section(spec, str(path), "gpu", GPU_KEYS, {})
    model = _section(spec, str(path), "model", MODEL_KEYS, OPTIONAL_MODEL)
    tp = int(spec.get("parallel", {}).get("tensor_parallel_size", 1))
    if tp < 1 or int(model["attention_heads"]) % tp:
        raise ProfileError(f"{path}: field 'parallel.tensor_parallel_size' must divide the attention heads")
    gpu_spec = GpuSpec("spec", str(gpu["name"]), float(gpu["peak_bf16_flops"]),
                       float(gpu["hbm_bandwidth_bytes_s"]), float(gpu["memory_gib"]) * 1.073741824,
                       float(gpu["memory_gib"]) * 1024.0, {"all": f"given in {path.name}"})
    shard = ModelSpec(
        "spec", str(model["name"]), layers=int(model["layers"]), hidden_size=int(model["hidden_size"]),
        attention_heads=int(model["attention_heads"]) // tp, kv_heads=-(-int(model["kv_heads"]) // tp),
        head_dim=int(model["head_dim"]), vocab_size=-(-int(model["vocab_size"]) // tp),
        intermediate_size=int(model["intermediate_size"]) // tp, qkv_bias=bool(model["qkv_bias"]),
        experts=int(model["experts"]), experts_per_token=int(model["experts_per_token"]),
        moe_intermediate_size=int(model["moe_intermediate_size"]) // tp,
        non_kv_overhead_gib=float(model["non_kv_overhead_gib"]),
        sources={"config": f"given in {path.name}, one rank of tensor parallel {tp}"},
    )
    shard_weights = model["weight_bytes"]
    if shard_weights is None:
        per_layer = shard.dense_params_per_layer + shard.experts * shard.expert_params
        shard_weights = 2 * (shard.layers * per_layer + 2 * shard.vocab_size * shard.hidden_size)
    else:
        shard_weights = float(shard_weights) / tp
    from dataclasses import replace

    shard = replace(shard, weight_bytes=int(shard_weights))
    data = tabulate(AnalyticModel(gpu_spec, shard))
    data.name = str(model["name"])
    data.meta["parallel"] = {"tensor_parallel_size": tp}
    data.meta["model"].update(
        name=str(model["name"]), attention_heads=int(model["attention_heads"]),
        kv_heads=int(model["kv_heads"]), vocab_size=int(model["vocab_size"]),
        intermediate_size=int(model["intermediate_size"]), kv_dtype_bytes=2,
    )
    data.meta["provenance"]["generated_by"] = f"lmsim.profile.spec from {path.name} (analytic, one rank)"
    return data
