"""Import Vidur's per-operator profiling data as an lmsim profile (`lmsim profile import vidur`).

Vidur (microsoft/vidur; read at PyPI `vidur` 0.0.26) measures one transformer layer's
operators on one GPU of a tensor-parallel group and prices a batch as the sum of per-operator
predictions. This module composes the measured medians into lmsim's four tables by the same
rules, each cited to the Vidur source that applies it (paths inside the `vidur` package):

* Layers [R1]: a step is `num_layers x (one layer)`; embedding, LM head, sampling and CPU time
  are not counted (`entities/execution_time.py`, `ExecutionTime.model_time`).
* One layer [R2]: attention pre/post projections, RoPE, decode and prefill attention, the
  input and (when the model has one) post-attention norms, MLP up/down projections and
  activation, the residual add; the KV-cache save kernel is left out
  (`entities/execution_time.py`, `_get_attention_layer_execution_time`,
  `_get_mlp_layer_execution_time`, `_get_block_execution_time`).
* All-reduces [R3]: with tensor parallelism each layer pays the all-reduce twice (after
  attention and after the MLP), each `all_reduce(tokens) + nccl_cpu_launch_overhead_ms
  (0.02) + nccl_cpu_skew_overhead_per_device_ms (0) x tp^1.25`; the all-reduce size in bytes
  is `2 x hidden x tokens` (`execution_time_predictor/sklearn_execution_time_predictor.py`,
  `_get_tensor_parallel_communication_time`, `_get_all_reduce_df_with_derived_features`,
  `_load_all_reduce_df`; defaults in `config/config.py`, `BaseExecutionTimePredictorConfig`).
* Token rounding [R4]: every token-keyed operator is looked up at the step's tokens rounded
  up to a multiple of 8 (`entities/batch.py`, `_total_num_q_tokens_rounded`).
* Decode attention [R5]: one lookup at (decodes, their mean KV length), the mean truncated to
  an integer and rounded up to `kv_cache_prediction_granularity` (256), times
  `1 + attention_decode_batching_overhead_fraction (0.1)` when more than one request decodes
  and the model has fewer KV heads than query heads (`sklearn_execution_time_predictor.py`,
  `_get_batch_decode_attention_params`, `_get_attention_decode_execution_time`, `__init__`).
  A decode's KV length there counts the token sampled at prefill, one more than lmsim's
  `c_i + 1` (`entities/request.py`, `on_batch_end`; `scheduler/replica_scheduler/
  sarathi_replica_scheduler.py`, `next_num_kv_tokens`).
* Prefill attention [R6]: one lookup per chunk at (KV length rounded up to 256, chunk rounded
  up to 32), where the KV length is cached context plus the chunk, c + q
  (`_get_batch_prefill_attention_params`, `_get_attention_prefill_execution_time`).
* Beyond the data [R7]: Vidur's default predictor is a random forest
  (`execution_time_predictor/random_forrest_execution_time_predictor.py`), which cannot
  extrapolate: outside the measured points it holds the nearest measured value. Table cells
  outside the measured data are filled the same way and counted in the provenance.
* Memory [R8]: KV memory per GPU = `total_memory_gb x 2^30 x (1 - memory_margin_fraction
  (0.1)) - 2 B x parameters per GPU`; KV bytes per token per GPU = `2 x 2 B x head_dim x
  ceil(kv_heads / tp) x layers`; parameters per GPU per layer = `hidden x head_dim x (q/tp +
  2 kv/tp)` + `hidden x head_dim x q/tp` + `3 (gated) or 2 x hidden x mlp / tp`
  (`utils/memory_planner.py`, `utils/param_counter.py`). The pool is then cut to whole slots
  of `max_tokens` (4096) tokens: `blocks = (max_tokens // block) x (tokens // max_tokens)`
  (`scheduler/replica_scheduler/base_replica_scheduler.py`, `__init__`).

* Token-keyed predictions [R9]: Vidur's forest (bootstrap samples, fully grown trees; sklearn
  `RandomForestRegressor` defaults under `random_forrest_execution_time_predictor.py`) does
  not return the median at a measured token count but a bagged mix of it and its nearest
  neighbours; `_forest` computes that mix's expectation. It matters where the medians dip:
  Llama-2-70B at 512 tokens measures 2.13 ms per layer, Vidur predicts 2.18 ms (2.5% more).

Attention (two features) is interpolated linearly between measured medians; the rounding rules
[R4] and [R6] are exact at every table grid point. The decode
rounding [R5] depends on the mean over a batch, which a table keyed by the summed context
cannot carry as a step, so it is applied in expectation: mean KV = C/B + 1 (sampled token)
- 0.5 (truncation) + 127.5 (round up to 256) = C/B + 128.
"""

from __future__ import annotations

import csv
import datetime
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lmsim.errors import ProfileError
from lmsim.profile.tables import ProfileData

TOKEN_ROUNDING = 8  # [R4]
CHUNK_ROUNDING = 32  # [R6]
KV_GRANULARITY = 256  # [R5], [R6]: kv_cache_prediction_granularity default
DECODE_BATCHING_OVERHEAD = 0.1  # [R5]: attention_decode_batching_overhead_fraction default
NCCL_LAUNCH_OVERHEAD_MS = 0.02  # [R3]: nccl_cpu_launch_overhead_ms default
NCCL_SKEW_PER_DEVICE_MS = 0.0  # [R3]: nccl_cpu_skew_overhead_per_device_ms default
MEMORY_MARGIN = 0.1  # [R8]: CacheConfig.memory_margin_fraction default
MAX_TOKENS = 4096  # [R8]: TraceRequestGeneratorConfig.max_tokens default
DECODE_KV_OFFSET = 1 - 0.5 + (KV_GRANULARITY - 1) / 2  # [R5] in expectation

# Vidur's model registry (vidur/config/model_config.py): layers and whether a post-attention
# norm is priced. The CSVs carry every other dimension.
VIDUR_MODELS = {
    "meta-llama/Llama-2-7b-hf": (32, True),
    "meta-llama/Llama-2-70b-hf": (80, True),
    "meta-llama/Llama-3-8B": (32, True),
    "meta-llama/Llama-3-70B": (80, True),
    "meta-llama/Meta-Llama-3-8B": (32, True),
    "meta-llama/Meta-Llama-3-70B": (80, True),
    "codellama/CodeLlama-34b-Instruct-hf": (48, True),
    "internlm/internlm-20b": (60, True),
    "internlm/internlm2-20b": (48, True),
    "microsoft/phi-2": (32, False),
    "Qwen/Qwen-72B": (80, True),
}
# vidur/config/device_sku_config.py: total_memory_gb (used as GiB by the planner) and
# fp16_tflops; HBM bandwidths are the public spec sheets (informational: no table uses them).
VIDUR_DEVICES = {
    "a100": ("NVIDIA A100 80GB", 80, 312e12, 2.039e12),
    "h100": ("NVIDIA H100 80GB", 80, 1000e12, 3.35e12),
    "a40": ("NVIDIA A40", 45, 150e12, 0.696e12),
    "l40": ("NVIDIA L40", 48, 181e12, 0.864e12),
}

LINEAR_OPS = (
    "attn_pre_proj", "attn_post_proj", "attn_rope", "mlp_up_proj", "mlp_down_proj", "mlp_act",
    "input_layernorm", "add",
)  # [R2]; post_attention_layernorm is added when the model has one


@dataclass
class _Csv:
    path: Path
    header: list[str]
    rows: list[list[str]]

    def col(self, name: str) -> list[str]:
        if name not in self.header:
            raise ProfileError(f"{self.path}: missing column {name!r}")
        i = self.header.index(name)
        return [r[i] for r in self.rows]

    def num(self, name: str, *, missing_zero: bool = False) -> np.ndarray:
        if missing_zero and name not in self.header:
            return np.zeros(len(self.rows))
        out = []
        for n, v in enumerate(self.col(name), start=2):
            if v.strip() == "":
                out.append(np.nan)
                continue
            try:
                out.append(float(v))
            except ValueError:
                raise ProfileError(f"{self.path}: line {n} column {name!r}: not a number ({v!r})") from None
        return np.array(out)

    def flag(self, name: str) -> np.ndarray:
        return np.array([v.strip().lower() == "true" for v in self.col(name)])

    def take(self, mask: np.ndarray) -> _Csv:
        return _Csv(self.path, self.header, [r for r, keep in zip(self.rows, mask) if keep])


def _read_csv(path: Path) -> _Csv:
    try:
        with path.open(newline="") as fh:
            rows = [r for r in csv.reader(fh) if r]
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read ({exc.strerror})") from None
    if len(rows) < 2:
        raise ProfileError(f"{path}: no data rows")
    header = [h.strip() for h in rows[0]]
    for n, r in enumerate(rows[1:], start=2):
        if len(r) != len(header):
            raise ProfileError(f"{path}: line {n} has {len(r)} cells, header has {len(header)}")
    return _Csv(path, header, rows[1:])


def _averaged(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted unique x with the mean y of repeated measurements (Vidur's forest averages them)."""
    ok = ~np.isnan(y)
    xs, inv = np.unique(x[ok], return_inverse=True)
    sums = np.bincount(inv, weights=y[ok])
    return xs, sums / np.bincount(inv)


def _held(xs: np.ndarray, ys: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Linear between measured points, the nearest measured value beyond them [R7]."""
    return np.interp(x, xs, ys)


def _forest(xs: np.ndarray, ys: np.ndarray, x: np.ndarray, n_rows: int, depth: int = 24) -> np.ndarray:
    """The expected prediction of Vidur's random forest on one feature [R9]: each fully grown
    tree answers with the measurement nearest to x among its bootstrap sample (a split sits
    midway between neighbours; a tie goes left), and a measurement is in a sample with
    probability p = 1 - (1 - 1/n)^n. So the k-th nearest measurement answers with probability
    p (1 - p)^k: a smoothing of the medians that pulls an isolated dip towards its neighbours,
    as Vidur's own predictions do."""
    p = 1.0 - (1.0 - 1.0 / n_rows) ** n_rows
    x = np.asarray(x, float)
    out = np.empty(x.size)
    for i, xi in enumerate(x.ravel()):
        # nearest first; on equal distance the left neighbour first (sklearn goes left on <=)
        order = np.lexsort((xs, np.abs(xs - xi)))[:depth]
        w = p * (1.0 - p) ** np.arange(len(order))
        out[i] = float(np.dot(w, ys[order]) / w.sum())
    return out.reshape(x.shape)


class _Attention:
    """Measured attention medians (ms per layer) and lookups by Vidur's keys. Beyond the
    measured KV lengths a value is the nearest measurement scaled by the analytic kernel's
    ratio (`shape(kv) / shape(kv_edge)`, see `import_vidur`), not held flat [R7'];
    `shape` None holds it, as Vidur's forest does."""

    def __init__(self, data: _Csv) -> None:
        prefill = data.flag("is_prefill")
        chunk, kv, batch = data.num("prefill_chunk_size"), data.num("kv_cache_size"), data.num("batch_size")
        t_pre, t_dec = data.num("time_stats.attn_prefill.median"), data.num("time_stats.attn_decode.median")
        self.chunks = np.unique(chunk[prefill])
        self.prefill_rows = [_averaged(kv[prefill & (chunk == s)], t_pre[prefill & (chunk == s)]) for s in self.chunks]
        dec = ~prefill
        self.batches = np.unique(batch[dec]).astype(int)
        self.decode_rows = {int(b): _averaged(kv[dec & (batch == b)], t_dec[dec & (batch == b)]) for b in self.batches}
        if not len(self.chunks) or not len(self.batches):
            raise ProfileError(f"{data.path}: needs both prefill and decode rows")
        self.max_kv = float(max(kv[prefill].max(), kv[dec].max()))
        self.decode_max_kv = float(kv[dec].max())
        self.prefill_max_kv = float(kv[prefill].max())
        self.filled = 0  # table cells priced outside the measured points [R7]
        self.prefill_shape = None  # (kv, chunk) -> analytic time, for extrapolation
        self.decode_shape = None  # (batch, kv) -> analytic time

    def _beyond(self, xs, ys, x, shape):
        """Linear between measured points, held below them, and above them the last
        measurement times the analytic ratio (held when there is no analytic shape)."""
        out = _held(xs, ys, x)
        above = x > xs[-1]
        if shape is not None and np.any(above):
            out = np.where(above, ys[-1] * shape(np.maximum(x, xs[-1])) / shape(xs[-1]), out)
        return out

    def prefill(self, kv: np.ndarray, chunk: np.ndarray) -> np.ndarray:
        """Median at (kv, chunk): linear in kv within each measured chunk size (extrapolated
        beyond it), then linear between chunk sizes; held at the chunk edges."""
        kv, chunk = np.broadcast_arrays(np.asarray(kv, float), np.asarray(chunk, float))
        flat_kv = kv.ravel()
        per_chunk = []
        for size, (xs, ys) in zip(self.chunks, self.prefill_rows):
            shape = None if self.prefill_shape is None else (lambda k, size=size: self.prefill_shape(k, size))
            per_chunk.append(self._beyond(xs, ys, flat_kv, shape))
        per_chunk = np.array(per_chunk)
        out = np.empty(kv.size)
        flat_chunk = chunk.ravel()
        for i, x in enumerate(flat_chunk):
            out[i] = np.interp(x, self.chunks, per_chunk[:, i])
        outside = (flat_chunk < self.chunks[0]) | (flat_chunk > self.chunks[-1])
        for i, (xs, _) in enumerate(self.prefill_rows):
            near = np.abs(flat_chunk - self.chunks[i]) < 1e-9
            outside |= near & ((flat_kv < xs[0]) | (flat_kv > xs[-1]))
        self.filled += int(outside.sum())
        return out.reshape(kv.shape)

    def decode(self, batch: int, kv: np.ndarray) -> np.ndarray:
        xs, ys = self.decode_rows[batch]
        kv = np.asarray(kv, float)
        self.filled += int(((kv < xs[0]) | (kv > xs[-1])).sum())
        shape = None if self.decode_shape is None else (lambda k: self.decode_shape(batch, k))
        return self._beyond(xs, ys, kv, shape)


def _analytic_kernels(device: str):
    """lmsim's analytic kernels of the same GPU, when lmsim ships its spec (a100, h100)."""
    from lmsim.profile.analytic import Kernels
    from lmsim.profile.hardware import shipped_gpus

    return Kernels.named(device) if device in shipped_gpus() else None


def _ceil(x: np.ndarray | int, step: int) -> np.ndarray:
    return -(-np.asarray(x, dtype=np.int64) // step) * step


def _pick_tp(data: _Csv, column: str, tp: int) -> _Csv:
    sizes = data.num(column)
    if not np.any(sizes == tp):
        have = ", ".join(str(int(v)) for v in np.unique(sizes))
        raise ProfileError(f"{data.path}: no rows for tensor parallel size {tp} (have: {have})")
    return data.take(sizes == tp)


def _one_value(data: _Csv, column: str) -> float:
    values = np.unique(data.num(column))
    if len(values) != 1:
        raise ProfileError(f"{data.path}: column {column!r} has several values {values.tolist()}; "
                           "keep one model per folder")
    return float(values[0])


def import_vidur(
    root: str | Path,
    *,
    model: str,
    device: str,
    network: str,
    tp: int,
    layers: int | None = None,
    block_size: int = 16,
    max_tokens: int = MAX_TOKENS,
    memory_margin: float = MEMORY_MARGIN,
    name: str | None = None,
    extrapolate: bool = True,
) -> ProfileData:
    """Compose Vidur's profiling folder (`compute/<device>/<model>/{mlp,attention}.csv`,
    `network/<network>/all_reduce.csv`) into an lmsim profile; see the module docstring."""
    root = Path(root)
    if tp < 1:
        raise ProfileError(f"--tp: must be >= 1, got {tp}")
    compute = root / "compute" / device / model
    if not compute.is_dir():
        raise ProfileError(f"{compute}: no such folder (expected DIR/compute/<device>/<model>)")
    if device not in VIDUR_DEVICES:
        raise ProfileError(f"--device: unknown device {device!r} (known: {', '.join(VIDUR_DEVICES)})")
    if layers is None:
        if model not in VIDUR_MODELS:
            raise ProfileError(f"--model: {model!r} is not in Vidur's model registry; pass --layers")
        layers, post_attn_norm = VIDUR_MODELS[model]
    else:
        post_attn_norm = VIDUR_MODELS.get(model, (layers, True))[1]

    mlp = _pick_tp(_read_csv(compute / "mlp.csv"), "num_tensor_parallel_workers", tp)
    n_head = int(_one_value(mlp, "n_head"))
    n_kv = int(_one_value(mlp, "n_kv_head"))
    hidden = int(_one_value(mlp, "n_embd"))
    mlp_hidden = int(_one_value(mlp, "n_expanded_embd"))
    vocab = int(_one_value(mlp, "vocab_size"))
    gated = bool(mlp.flag("use_gated_mlp").all())
    head_dim = hidden // n_head
    if n_head % tp:
        raise ProfileError(f"--tp: {tp} does not divide the {n_head} query heads")

    attn = _read_csv(compute / "attention.csv")
    attn = _pick_tp(attn, "num_tensor_parallel_workers", tp)
    keep = attn.num("block_size") == block_size
    if not keep.any():
        raise ProfileError(f"{attn.path}: no rows for block size {block_size}")
    attn = attn.take(keep)
    attention = _Attention(attn)
    q_rank, kv_rank = n_head // tp, -(-n_kv // tp)
    kernels = _analytic_kernels(device) if extrapolate else None
    if kernels is not None:
        # [R7']: beyond the measured KV lengths, scale the edge measurement by the analytic
        # kernel (lmsim.profile.analytic) of this GPU and this rank's head layout.
        attention.decode_shape = lambda b, k: kernels.decode_attention(
            b, k, q_rank, kv_rank, head_dim, engine=False)
        attention.prefill_shape = lambda k, q: kernels.prefill_attention(
            q, np.maximum(k - q, 0), q_rank, kv_rank, head_dim)

    # [R2], [R4]: per-layer token-keyed operators, looked up at tokens rounded up to 8.
    ops = list(LINEAR_OPS) + (["post_attention_layernorm"] if post_attn_norm else [])
    tokens_measured = mlp.num("num_tokens")
    t_max = int(tokens_measured.max())
    tokens = np.arange(1, t_max + 1)
    rounded = np.minimum(_ceil(tokens, TOKEN_ROUNDING), t_max)
    layer_ms = np.zeros(len(tokens))
    at = np.unique(rounded)  # one forest evaluation per rounded token count
    for op in ops:
        xs, ys = _averaged(tokens_measured, mlp.num(f"time_stats.{op}.median", missing_zero=True))
        layer_ms += _forest(xs, ys, at, len(mlp.rows))[np.searchsorted(at, rounded)]
    comm_note = "none (tensor parallel size 1)"
    if tp > 1:  # [R3]
        ar = _read_csv(root / "network" / network / "all_reduce.csv")
        mask = (ar.num("num_workers") == tp) & (ar.num("devices_per_node") == tp)
        mask &= np.array([c.strip() == "all_reduce" for c in ar.col("collective")])
        if not mask.any():
            raise ProfileError(f"{ar.path}: no all_reduce rows with num_workers = devices_per_node = {tp}")
        ar = ar.take(mask)
        xs, ys = _averaged(ar.num("size") / hidden / 2, ar.num("time_stats.all_reduce.median"))
        reduce_ms = _forest(xs, ys, at, len(ar.rows))[np.searchsorted(at, rounded)]
        per_call = reduce_ms + NCCL_LAUNCH_OVERHEAD_MS + NCCL_SKEW_PER_DEVICE_MS * tp**1.25
        layer_ms += 2 * per_call
        comm_note = f"2 all-reduces per layer from {ar.path.name} ({int(mask.sum())} rows)"
    dense_s = layers * layer_ms * 1e-3

    # [R6]: prefill rows in pairs (32k+1, 32k+32) so ceil32(q) is exact on the whole row range.
    q_max = int(_ceil(int(attention.chunks[-1]), CHUNK_ROUNDING))
    q_rows = sorted({1} | {q for k in range(q_max // CHUNK_ROUNDING)
                           for q in (CHUNK_ROUNDING * k + 1, CHUNK_ROUNDING * (k + 1))})
    c_cols = np.arange(0, int(attention.max_kv) + 1, CHUNK_ROUNDING)
    qq, cc = np.meshgrid(np.array(q_rows), c_cols, indexing="ij")
    pa = layers * attention.prefill(_ceil(qq + cc, KV_GRANULARITY), _ceil(qq, CHUNK_ROUNDING)) * 1e-3

    # [R5]: decode rows at every measured batch, columns geometric in the summed context.
    batches = attention.batches
    # Columns reach 1M summed tokens at least, so long single sequences stay on the grid (and
    # are counted through limits.decode_context_per_sequence, not through the grid's edge).
    c_hi = int(max(batches[-1] * attention.max_kv, 1 << 20))
    c_grid = np.unique(np.concatenate(([0], np.round(np.geomspace(16, c_hi, 16 * int(math.log2(c_hi / 16)) + 1)))))
    c_grid[-1] = c_hi
    overhead = DECODE_BATCHING_OVERHEAD if n_head > n_kv else 0.0
    da = np.vstack([
        layers * attention.decode(int(b), c_grid / b + DECODE_KV_OFFSET) * (1 + overhead * (b > 1)) * 1e-3
        for b in batches
    ])

    # [R8]: memory facts per GPU.
    q_per, kv_per = n_head // tp, -(-n_kv // tp)
    params_layer = hidden * head_dim * (q_per + 2 * kv_per) + hidden * head_dim * q_per
    params_layer += (3 if gated else 2) * hidden * mlp_hidden // tp
    weight_bytes = 2 * params_layer * layers
    kv_bytes = 2 * 2 * head_dim * kv_per * layers
    gpu_name, mem_gb, flops, bw = VIDUR_DEVICES[device]

    today = datetime.date.today().isoformat()
    src = "vidur 0.0.26 (PyPI), module docstring of lmsim/profile/vidur.py"
    meta = {
        "hardware": {"gpu": gpu_name, "memory_gib": float(mem_gb), "hbm_bandwidth_bytes_s": bw,
                     "peak_bf16_flops": flops, "network": network},
        "parallel": {"tensor_parallel_size": tp},
        "model": {"name": model, "layers": layers, "hidden_size": hidden, "attention_heads": n_head,
                  "kv_heads": n_kv, "head_dim": head_dim, "intermediate_size": mlp_hidden,
                  "vocab_size": vocab, "kv_dtype_bytes": 2, "kv_bytes_per_token": kv_bytes,
                  "weight_bytes": weight_bytes, "experts": 0},
        "memory": {"non_kv_overhead_gib": 0.0, "kv_pool_slot_tokens": max_tokens,
                   "reference_gpu_memory_utilization": round(1.0 - memory_margin, 12),
                   "note": "KV pool = utilization x memory_gib - weight_bytes, in whole slots of "
                           "kv_pool_slot_tokens (Vidur's memory planner)"},
        # Vidur looks a decode batch up at its mean KV length [R5]
        "step": {"fixed_s": 0.0, "cpu_per_token_s": 0.0, "decode_batch": "mean"},
        "limits": {
            "decode_context_per_sequence": int(attention.decode_max_kv - DECODE_KV_OFFSET),
            "prefill_kv": int(attention.prefill_max_kv),
        },
        "provenance": {
            "generated_by": f"lmsim profile import vidur {root} --model {model} --device {device} "
                            f"--network {network} --tp {tp}",
            "date": today,
            "source": f"Vidur profiling medians under {root}",
            "rules": {
                "layers": f"x{layers} per step; no embedding, LM head, sampling or CPU time [{src} R1]: "
                          "vidur/entities/execution_time.py ExecutionTime.model_time",
                "layer": f"sum of {', '.join(ops)} [R2]: vidur/entities/execution_time.py "
                         "_get_attention_layer_execution_time, _get_mlp_layer_execution_time",
                "all_reduce": f"{comm_note}, each + {NCCL_LAUNCH_OVERHEAD_MS} ms launch [R3]: "
                              "vidur/execution_time_predictor/sklearn_execution_time_predictor.py "
                              "_get_tensor_parallel_communication_time",
                "token_rounding": f"tokens rounded up to {TOKEN_ROUNDING} (exact: one table row per "
                                  "token) [R4]: vidur/entities/batch.py _total_num_q_tokens_rounded",
                "token_ops_prediction": "expected random-forest prediction over the medians (nearest "
                                        "measurement in each bootstrap sample) [R9]: "
                                        "vidur/execution_time_predictor/random_forrest_execution_time_predictor.py",
                "decode_attention": f"median at (batch, mean KV rounded up to {KV_GRANULARITY}) x "
                                    f"(1 + {overhead} if batch > 1); mean KV = C/B + "
                                    f"{DECODE_KV_OFFSET:g} (rounding in expectation) [R5]: "
                                    "sklearn_execution_time_predictor.py _get_batch_decode_attention_params, "
                                    "_get_attention_decode_execution_time",
                "prefill_attention": f"median at (ceil{KV_GRANULARITY}(c + q), ceil{CHUNK_ROUNDING}(q)), "
                                     "exact at grid points [R6]: sklearn_execution_time_predictor.py "
                                     "_get_batch_prefill_attention_params, _get_attention_prefill_execution_time",
                "outside_data": (
                    f"beyond the measured KV lengths: the edge measurement times the ratio of lmsim's "
                    f"analytic {device} kernel (lmsim.profile.analytic) [R7']; elsewhere held at the "
                    f"nearest measurement as Vidur's random forest does [R7]; {attention.filled} "
                    "attention cells filled so; steps beyond limits.* are counted as outside the grid"
                    if kernels is not None else
                    f"held at the nearest measured value, as Vidur's random forest does [R7]; "
                    f"{attention.filled} attention cells filled so; steps beyond limits.* are "
                    "counted as outside the grid"),
                "memory": f"weights {weight_bytes} B and KV {kv_bytes} B/token per GPU, "
                          f"{mem_gb} GiB, margin {memory_margin}, slots of {max_tokens} tokens [R8]: "
                          "vidur/utils/memory_planner.py, vidur/utils/param_counter.py, "
                          "vidur/scheduler/replica_scheduler/base_replica_scheduler.py __init__",
            },
            "interpolation": "token-keyed operators: expected forest prediction [R9]; attention: linear "
                             "between measured medians (Vidur: random-forest predictions)",
        },
    }
    zeros = np.zeros(2)
    return ProfileData(
        name=name or f"{device}/{model.split('/')[-1].lower()}-tp{tp}",
        meta=meta,
        tokens=tokens.astype(float), dense_s=dense_s, moe_s=np.zeros(len(tokens)),
        seqs=np.array([1.0, float(batches[-1])]), lm_head_s=zeros, cpu_s=zeros,
        pa_q=np.array(q_rows, dtype=float), pa_c=c_cols.astype(float), pa=pa,
        da_b=batches.astype(float), da_c=c_grid.astype(float), da=da,
        source="<vidur import>",
    )
