"""The analytic step-cost model: what each kernel group of one vLLM-v1 step costs on a GPU.

This module owns the functional form and its constants. It is used only to *generate* profile
tables (`lmsim profile generate`, `lmsim profile new`) and to predict kernel measurements
(`lmsim profile check`); the simulator prices steps from the tables (`tables.py`), never from
this formula, so a measured table can replace a generated one without code changes.

A step with prefill chunks (q_i, c_i) and B_d decodes costs (costmodel.md section 3)

    t = fixed + dense(T) + moe(T) + allreduce(T) + lm_head(B) + host(B, T)
        + decode_attention(B_d, C_d) + sum_i prefill_attention(q_i, c_i)

Kernel groups, per layer unless said (`Kernels`, vectorised over numpy arrays):

* GEMMs (dense projections and MLP, lm_head): compute `2·M'·N·K / (P·mfu)` with M' = max(M,
  tile rows) and memory `(weights + M·K inputs + M·N outputs) / (BW·bw_eff)`, the bytes the
  GEMM moves, combined by a roofline (below);
* routed experts: the same roofline over the distinct experts a step touches under uniform
  routing, rows padded to the fused-MoE block;
* prefill attention (FA3 on Hopper, FA2 class elsewhere): causal FLOPs at an efficiency that
  saturates with the KV length L = c + q, `mfu(L) = attn_mfu · L / (L + attn_half_kv)`, plus a
  per-chunk intercept;
* decode attention: a launch per layer, the KV bytes read at a kernel efficiency (times the
  small-batch engine term in an engine step), and the compute the engine's kernel really runs:
  on tensor cores each (sequence, KV head)'s query group is padded to a tile of rows (64 for
  FA2/FA3 in vLLM, 16 for FlashInfer's tensor-core decode), priced at the GPU's attention
  efficiency, which on a low-FLOP GPU (H20: 148 TFLOPS against 4 TB/s) rivals the KV read;
  FlashInfer's CUDA-core kernel (GQA group <= 4) computes every query head on CUDA cores, at
  the engine's fitted fraction of the FP32 peak (`decode_cuda_core_eff`);
* all-reduce with tensor parallelism: two per layer, `latency + 2(N-1)/N · bytes / link`.

The engine (`hardware.EngineSpec`, `lmsim/data/hardware/engines.yaml`; vLLM v1 by default)
chooses the decode kernel path and whether host work overlaps the GPU: with `host_overlap`
(SGLang's overlap scheduler) a step costs max(host, GPU) instead of their sum.

The roofline. The original form (costmodel.md) takes `max(compute, memory)`: a hard knee.
The alternative is a smooth roofline `(tc^n + tm^n)^(1/n)`, which is slower than both bounds
near the ridge, where real kernels are (neither pipe saturates). `Efficiency.roofline_n` picks
it per GPU (None = hard knee); `calibrate.py` fits both and `profiles/README.md` records which
won on the check split and why.

Every function here is vectorised over numpy arrays and may use exp/log freely: speed and
bit-exactness matter only in the table predictor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import numpy as np

from lmsim.errors import ProfileError
from lmsim.profile.hardware import (
    EngineSpec,
    GpuSpec,
    ModelSpec,
    load_engine,
    load_gpu,
    load_model,
    shard,
)

GIB = float(1 << 30)
MIB = float(1 << 20)


def _pairs(v: Any) -> tuple[tuple[float, float], ...]:
    return tuple((float(a), float(b)) for a, b in v)


@dataclass(frozen=True)
class Efficiency:
    """The form's constants for one GPU. Defaults are costmodel.md section 3.2's (calibrated
    on H20); a GPU's YAML (`efficiency:`) overrides them with its fitted values."""

    # GEMMs
    gemm_min_rows: int = 64
    mfu_gemm: tuple[tuple[float, float], ...] = (
        (64, 0.68), (128, 0.74), (256, 0.78), (512, 0.80), (2048, 0.82), (8192, 0.83),
    )
    gemm_mfu: float | None = None  # set: one large-M MFU replaces the mfu_gemm table
    weight_stream_eff: float = 0.80
    roofline_n: float | None = None  # None: hard knee max(compute, memory)
    gemm_launch_s: float = 0.0  # per GEMM (4 per layer, 1 lm_head)
    gemm_launch_fp8_s: float | None = None  # per FP8 GEMM (DeepGEMM: scales, TMA descriptors)
    # FP8 GEMM kernels (DeepGEMM) differ from BF16 cuBLAS: their own constants, used only
    # to predict FP8 kernel rows (lmsim serves BF16)
    gemm_mfu_fp8: float | None = None
    weight_stream_eff_fp8: float | None = None
    # The FP8 kernel group's own roofline exponent (None: roofline_n, the BF16 GEMMs'). An
    # alternative measured and not adopted (profiles/README.md "Which form won"): fitted on
    # half of InferSim's DeepGEMM shapes and checked on the rest it is a tie (H20 402 rows:
    # 90% within 10% against 91%; H800 110 rows: 59% against 60%, and with the weights-only
    # memory side 92/90% and 52/55%; benchmarks/fp8_gemm_heldout.py).
    roofline_n_fp8: float | None = None
    # What the GEMM roofline's memory side moves: True, the weights and the activation rows
    # (M x K read, M x N written in BF16); False, the weights alone. Both forms fitted and
    # checked (profiles/README.md "Which form won"): the table's check split 143/173 within
    # 10% and none beyond 25% against 140/173 and one; held out on InferSim's DeepGEMM shapes
    # (benchmarks/fp8_gemm_heldout.py) H800 60% within 10% against 55%, 16 beyond 25%
    # against 24, H20 91% against 90%. Near the ridge a GEMM's output is a large share of
    # its traffic: 7.3 MB of 23 MB for H800's m512 n7168 k2048, the row the weights-only form
    # priced at 0.72 of measured.
    gemm_moves_activations: bool = True
    # routed experts
    moe_block: int = 16
    # vLLM's fused_moe default config tiles each expert's rows by 16 while the step has at most
    # as many tokens as experts, by 64 above (vllm/model_executor/layers/fused_moe/fused_moe.py
    # get_default_config: BLOCK_SIZE_M 16 "if M <= E", else 64)
    moe_block_large: int = 64
    mfu_moe: tuple[tuple[float, float], ...] = (
        (16, 0.45), (64, 0.60), (256, 0.72), (512, 0.75), (2048, 0.78),
    )
    moe_mfu: float | None = None  # set: mfu(r) = moe_mfu * r / (r + moe_half_rows), r = max(n, block), replaces the table
    moe_mfu_fp8: float | None = None  # FP8 grouped GEMMs (DeepGEMM kernel rows only; lmsim serves BF16)
    moe_half_rows: float = 16.0
    moe_launch_s: float = 0.0  # per MoE layer (routing, align/sort, two grouped GEMMs)
    # The fraction of HBM bandwidth at which the fused-MoE kernel streams expert weights (None:
    # weight_stream_eff, the dense GEMMs'). Its tiles gather scattered token rows per expert,
    # so it streams weights more slowly than cuBLAS: aiconfigurator's vLLM 0.14 fused_moe rows
    # run 256 tokens of Qwen3-30B-A3B (all 128 experts touched, 1.2 GB) at 1.05 ms on A100
    # and 2.50 ms on L40S, 0.57 and 0.56 of their HBM bandwidth.
    moe_stream_eff: float | None = None
    # The roofline exponent the MoE constants were fitted with (None: roofline_n). A GPU that
    # borrows its MoE constants from another (too few kernel rows of its own) borrows the
    # exponent they were fitted with too: the stream efficiency and the exponent trade off
    # against each other near the ridge (A100's fit: n 2.14 with 0.75; L40S's GEMMs alone
    # fit n 4.2-6.8), so pairing one GPU's efficiency with another's exponent prices L40S's
    # memory-bound fused_moe (256-1,024 tokens) 27% fast instead of 17-23%.
    moe_roofline_n: float | None = None
    # prefill attention
    mfu_attn: tuple[tuple[float, float], ...] = (
        (128, 0.30), (1024, 0.52), (2048, 0.70), (4096, 0.80), (8192, 0.86),
        (16384, 0.89), (32768, 0.92),
    )
    attn_mfu: float | None = None  # set: mfu(L) = attn_mfu * L / (L + attn_half_kv) replaces the table
    attn_half_kv: float = 0.0
    mfu_attn_small_q: float = 0.5
    small_q: int = 16
    attn_mfu_scale: float = 1.0  # FA2-class kernels (costmodel.md section 5 rows 6b, 7)
    prefill_chunk_s: float = 0.0  # per chunk per layer (varlen metadata, tile tail)
    # FA3 over a dense, contiguous KV (a bare benchmark) against the paged KV an engine reads
    # through a block table (no TMA: the producer warps gather pages, which costs where the
    # tensor cores are fast; H100: aiconfigurator's vLLM rows against tritonbench's)
    attn_dense_gain: float = 1.0
    # decode attention
    kv_read_eff: float = 0.85
    attn_launch_per_layer_s: float = 17e-6
    decode_head_s: float = 0.0  # per (sequence, KV head): split/merge and page-table work
    # FlashInfer's CUDA-core decode kernel inside an engine: the fraction of the FP32 peak at
    # which it computes 4 x query heads x head_dim FLOPs per KV token (an engine constant:
    # engines.yaml overrides it)
    decode_cuda_core_eff: float = 0.13
    # Kernel efficiency by (kv heads per GPU, batch, per-sequence context), multiplying
    # kv_read_eff; an empty table means 1 everywhere.
    kv_eff_heads: tuple[float, ...] = ()
    kv_eff_batch: tuple[float, ...] = ()
    kv_eff_context: tuple[float, ...] = ()
    kv_eff_values: tuple = ()  # [heads][batch][context]
    # The small-batch engine term: in serving engines a decode step reads its KV slower than
    # the bare kernel when it has few (sequence, KV head) pairs to spread over the SMs: the
    # kernel's KV time is multiplied by 1 + engine_kv_half_units / (B x KV heads per GPU)
    # (None: no term).
    engine_kv_half_units: float | None = None
    # per-layer kernels outside the groups above (norms, RoPE, activation; MoE routing)
    layer_fixed_s: float = 8e-6
    layer_fixed_moe_s: float = 45e-6
    # host (the engine's CPU work) and sampling
    cpu_base_s: float = 1.2e-3
    cpu_per_seq_s: float = 6e-6
    cpu_per_token_s: float = 0.05e-6
    sample_base_s: float = 0.1e-3
    sample_per_seq_s: float = 3e-6
    allreduce_eff: float = 0.7  # achieved fraction of the per-direction link bandwidth

    @classmethod
    def from_mapping(cls, raw: dict[str, Any], where: str) -> Efficiency:
        known = {f.name: f for f in fields(cls)}
        values: dict[str, Any] = {}
        for k, v in raw.items():
            if k not in known:
                raise ProfileError(f"{where}: unknown field 'efficiency.{k}' (known: {', '.join(known)})")
            if k in ("mfu_gemm", "mfu_moe", "mfu_attn"):
                values[k] = _pairs(v)
            elif k == "kv_eff_values":
                values[k] = tuple(tuple(tuple(float(x) for x in row) for row in plane) for plane in v)
            elif k.startswith("kv_eff_"):
                values[k] = tuple(float(x) for x in v)
            elif v is None:
                values[k] = None
            elif k == "gemm_moves_activations":
                if not isinstance(v, bool):
                    raise ProfileError(f"{where}: field 'efficiency.{k}' must be true or false, got {v!r}")
                values[k] = v
            else:
                try:
                    values[k] = float(v)
                except (TypeError, ValueError):
                    raise ProfileError(f"{where}: field 'efficiency.{k}' must be a number, got {v!r}") from None
        for k in ("gemm_min_rows", "moe_block", "moe_block_large", "small_q"):
            if k in values:
                values[k] = int(values[k])
        return cls(**values)

    def as_mapping(self) -> dict[str, Any]:
        def plain(v: Any) -> Any:
            return [plain(x) for x in v] if isinstance(v, tuple | list) else v

        return {k: plain(v) for k, v in asdict(self).items()}


def efficiency_for(gpu: GpuSpec, engine: EngineSpec | None = None) -> Efficiency:
    """The GPU's fitted constants, with the engine's fitted constants (host time, its decode
    kernel's efficiency) on top; a user spec without its own borrows those of
    `efficiency_like` or, failing that, of the shipped GPU of the same architecture."""
    raw = gpu.efficiency
    if not raw:
        like = gpu.efficiency_like or {"hopper": "h100", "ampere": "a100", "ada": "l40s"}.get(gpu.arch)
        if like and like != gpu.key:
            raw = load_gpu(like).efficiency
    eff = Efficiency.from_mapping(raw or {}, f"{gpu.key} GPU spec")
    if engine is not None and engine.efficiency:
        parsed = Efficiency.from_mapping(engine.efficiency, f"engine {engine.key}")
        eff = replace(eff, **{k: getattr(parsed, k) for k in engine.efficiency})
    return eff


EFFICIENCY_SOURCES = {
    "mfu_gemm": "costmodel.md 3.2(1): fitted to Qwen3 batch-1 H20 decode [D1]; shape from InferSim H20 GEMM table [D2]",
    "gemm_min_rows": "costmodel.md 3.2(1): Hopper wgmma 64-row tile, InferSim H20 GEMM m=16/32/64 flat [D2]",
    "weight_stream_eff": "costmodel.md 2: weight streaming ~80% of spec bandwidth (InferSim [H3], aiconfigurator [H4])",
    "mfu_moe": "costmodel.md 3.2(3): Triton fused_moe BF16, calibrated on section 5 rows 8, 9, 11",
    "mfu_attn": "costmodel.md 3.2(4): InferSim H20 FA3 prefill table [D2], flash-attention#1310 [D3]",
    "kv_read_eff": "costmodel.md 3.2(4): InferSim H20 FlashInfer decode table, 17 us/layer + 3.4 TB/s [D2]",
    "attn_launch_per_layer_s": "costmodel.md 3.2(4): same fit as kv_read_eff [D2]",
    "layer_fixed_s": "costmodel.md 3.2(5): norms/RoPE/activation kernels, assumed 8 us per layer",
    "layer_fixed_moe_s": "costmodel.md 3.2(5): calibrated to Qwen3-30B-A3B batch-1 decode 7.29 ms [D1]",
    "cpu": "costmodel.md 3.2(6): vLLM PR #17866 [V10], RFC #6854 [V11]; cpu_base_s per engine, fitted on its end-to-end rows (lmsim/data/hardware/engines.yaml)",
    "decode_tile": "vllm-project/flash-attention PR #63 (decode runs one 64-row MMA warpgroup); FA2 seqlenq_ngroups_swapped (the query group in the 64-row M tile); flashinfer include/flashinfer/utils.cuh FA2DetermineCtaTileQ (16 rows for a packed group <= 16)",
    "decode_cuda_core_eff": "fitted on SGLang 0.4.6 H20 end-to-end rows (FlashInfer CUDA-core decode for GQA groups <= 4, sglang flashinfer_backend.py should_use_tensor_core)",
    "attn_dense_gain": "H100: aiconfigurator vLLM 0.14 paged FA3 rows against tritonbench#1267 dense FA3 rows",
    "moe_block_large": "vllm/model_executor/layers/fused_moe/fused_moe.py get_default_config: BLOCK_SIZE_M 16 if M <= E, else 64",
    "kernel_rows": "lmsim/data/hardware/engines.yaml kernel-benchmark entries: dense FA3, bare FlashInfer, aiconfigurator's power-law MoE routing, DeepGEMM's 128-row expert alignment",
    "sample": "costmodel.md 3.2(7): top-p/top-k sort over ~152k vocabulary, assumed",
}


def _loglin(points: Sequence[tuple[float, float]], x: np.ndarray) -> np.ndarray:
    """Log-linear interpolation of an efficiency curve, held flat beyond both ends."""
    xs = np.log([p[0] for p in points])
    ys = np.array([p[1] for p in points])
    return np.interp(np.log(np.maximum(x, 1e-9)), xs, ys)


def roofline(compute: np.ndarray, memory: np.ndarray, n: float | None) -> np.ndarray:
    """max(compute, memory) (n None) or the smooth (compute^n + memory^n)^(1/n)."""
    if n is None:
        return np.maximum(compute, memory)
    hi = np.maximum(np.maximum(compute, memory), 1e-300)
    return hi * ((compute / hi) ** n + (memory / hi) ** n) ** (1.0 / n)


@dataclass(frozen=True)
class Kernels:
    """One GPU's kernel groups, priced from its facts and fitted constants."""

    gpu: GpuSpec
    eff: Efficiency

    @classmethod
    def named(cls, gpu: str | GpuSpec) -> Kernels:
        spec = gpu if isinstance(gpu, GpuSpec) else load_gpu(gpu)
        return cls(spec, efficiency_for(spec))

    def peak(self, fp8: bool = False) -> float:
        if fp8:
            if not self.gpu.peak_fp8_flops:
                raise ProfileError(f"{self.gpu.key}: no FP8 peak in the GPU spec")
            return self.gpu.peak_fp8_flops
        return self.gpu.peak_bf16_flops

    # -- GEMMs ------------------------------------------------------------------------------
    def gemm_mfu(self, m: np.ndarray) -> np.ndarray:
        if self.eff.gemm_mfu is not None:
            return np.full(np.shape(m), self.eff.gemm_mfu)
        return _loglin(self.eff.mfu_gemm, m)

    def gemm(self, m: np.ndarray, weights: float, *, fp8: bool = False, launches: int = 1,
             inputs_per_row: float = 0.0, outputs_per_row: float = 0.0) -> np.ndarray:
        """`m` rows times a weight matrix of `weights` elements (N·K), one or more GEMMs;
        each row reads `inputs_per_row` activations (the K's) and writes `outputs_per_row`
        (the N's, in BF16)."""
        m = np.asarray(m, dtype=float)
        e = self.eff
        rows = np.maximum(m, e.gemm_min_rows)
        mfu = self.gemm_mfu(rows)
        bw_eff = e.weight_stream_eff
        if fp8 and e.gemm_mfu_fp8 is not None:
            mfu = np.full(np.shape(rows), e.gemm_mfu_fp8)
        if fp8 and e.weight_stream_eff_fp8 is not None:
            bw_eff = e.weight_stream_eff_fp8
        compute = 2.0 * weights * rows / (self.peak(fp8) * mfu)
        moved = weights * (1.0 if fp8 else 2.0)
        if e.gemm_moves_activations:
            moved = moved + m * (inputs_per_row * (1.0 if fp8 else 2.0) + outputs_per_row * 2.0)
        memory = moved / (self.gpu.hbm_bandwidth_bytes_s * bw_eff)
        launch = e.gemm_launch_fp8_s if fp8 and e.gemm_launch_fp8_s is not None else e.gemm_launch_s
        n = e.roofline_n_fp8 if fp8 and e.roofline_n_fp8 is not None else e.roofline_n
        return launches * launch + roofline(compute, memory, n)

    # -- routed experts -------------------------------------------------------------------------
    def moe(self, tokens: np.ndarray, experts: int, per_token: int, expert_params: float,
            *, fp8: bool = False, power_law_alpha: float | None = None,
            block_rows: int | None = None) -> np.ndarray:
        """One MoE layer's routed experts. Under uniform routing (an upper bound on distinct
        experts, what lmsim prices in an engine): E_act = E(1 - (1 - k/E)^T), n = T·k/E_act
        rows each, padded to blocks of `moe_block` rows while T <= E and of `moe_block_large`
        above (vLLM's fused_moe tiles: at T = 256 on 128 experts each expert's 16 rows run a
        64-row tile). With `power_law_alpha` the experts' loads follow aiconfigurator's
        synthetic routing instead (`power_law_routing`); `block_rows` fixes the row block (a
        grouped GEMM that aligns every expert to it, DeepGEMM's contiguous layout: 128)."""
        t = np.maximum(np.asarray(tokens, dtype=float), 1.0)
        e, k = float(experts), float(per_token)
        blk = np.where(t <= e, float(self.eff.moe_block), float(self.eff.moe_block_large))
        if block_rows is not None:
            blk = np.full(np.shape(t), float(block_rows))
        if power_law_alpha is None:
            e_act = e * (1.0 - (1.0 - k / e) ** t)
            n = t * k / e_act
            # Expected blocks per touched expert: one while its rows fit a block, n/blk plus
            # half a block of padding once they overflow it, joined continuously (1.5 r for
            # r = n/blk in [2/3, 1]) so tabulated steps interpolate cleanly.
            r = n / blk
            rows = e_act * blk * np.maximum(1.0, r + 0.5 * np.minimum(1.0, r))
        else:
            e_act, rows, n = power_law_routing(t, experts, per_token, power_law_alpha, blk)
        ef = self.eff
        # Efficiency keyed by the rows each expert's GEMM really runs (n padded to the block).
        padded = np.maximum(n, blk)
        top = ef.moe_mfu_fp8 if fp8 and ef.moe_mfu_fp8 is not None else ef.moe_mfu
        mfu = _loglin(ef.mfu_moe, n) if top is None else top * padded / (padded + ef.moe_half_rows)
        compute = 2.0 * rows * expert_params / (self.peak(fp8) * mfu)
        stream = ef.weight_stream_eff if ef.moe_stream_eff is None else ef.moe_stream_eff
        memory = e_act * expert_params * (1.0 if fp8 else 2.0) / (self.gpu.hbm_bandwidth_bytes_s * stream)
        return ef.moe_launch_s + roofline(compute, memory, ef.roofline_n if ef.moe_roofline_n is None else ef.moe_roofline_n)

    # -- attention ------------------------------------------------------------------------------
    def attn_mfu(self, q: np.ndarray, kv_len: np.ndarray) -> np.ndarray:
        e = self.eff
        if e.attn_mfu is not None:
            return e.attn_mfu * kv_len / (kv_len + e.attn_half_kv) * e.attn_mfu_scale
        # Spec 3.2(4) uses 0.5 for q <= 16 ("memory-bound anyway"). Over a long cached context
        # a 16-token chunk is compute-bound, and a flat 0.5 would make it dearer than a 17-token
        # chunk; max(0.5, mfu_attn) keeps the cost monotone in q.
        long_mfu = _loglin(e.mfu_attn, kv_len)
        mfu = np.where(q <= e.small_q, np.maximum(e.mfu_attn_small_q, long_mfu), long_mfu)
        if e.attn_mfu_scale != 1.0:
            mfu = np.where(q <= e.small_q, mfu, mfu * e.attn_mfu_scale)
        return mfu

    def prefill_attention(self, q: np.ndarray, c: np.ndarray, q_heads: int, kv_heads: int,
                          head_dim: int, batch: int = 1, *, dense: bool = False) -> np.ndarray:
        """One layer: `batch` chunks of q new tokens over c cached ones each, causal inside
        the chunk, in one kernel; over a paged KV (an engine) or a dense one (`dense`, a bare
        benchmark: `attn_dense_gain` times the efficiency)."""
        q = np.asarray(q, dtype=float)
        c = np.asarray(c, dtype=float)
        flops = batch * 4.0 * q_heads * head_dim * (q * c + q * (q + 1) / 2.0)
        kv_bytes = batch * (c + q) * 4.0 * kv_heads * head_dim
        mfu = self.attn_mfu(q, c + q) * (self.eff.attn_dense_gain if dense else 1.0)
        compute = flops / (self.peak() * mfu)
        memory = kv_bytes / (self.gpu.hbm_bandwidth_bytes_s * self.eff.kv_read_eff)
        return batch * self.eff.prefill_chunk_s + roofline(compute, memory, self.eff.roofline_n)

    def kv_kernel_eff(self, batch: np.ndarray, context: np.ndarray, kv_heads: int) -> np.ndarray:
        """Decode kernel KV-read efficiency (fraction of HBM bandwidth)."""
        e = self.eff
        base = np.full(np.broadcast(np.asarray(batch), np.asarray(context)).shape, e.kv_read_eff)
        if not e.kv_eff_values:
            return base
        vals = np.asarray(e.kv_eff_values, dtype=float)
        lb = np.log(np.maximum(np.asarray(batch, float), 1.0))
        lc = np.log(np.maximum(np.asarray(context, float), 1.0))
        out = []
        for plane in vals:  # per head count: bilinear in (log batch, log context), held at the edges
            by_ctx = np.array([np.interp(lc, np.log(e.kv_eff_context), row) for row in plane])
            out.append(_interp_axis0(np.log(e.kv_eff_batch), by_ctx, lb))
        out = np.array(out)
        heads = np.asarray(e.kv_eff_heads, float)
        if not heads[0] <= kv_heads <= heads[-1]:
            # A head layout the table was not fitted on: its planes describe another kernel
            # path (FlashInfer: CUDA cores at 32q/8kv, tensor cores at 32q/4kv), so only the
            # fitted constants apply.
            return base
        return base * _interp_axis0(heads, out, np.full(lb.shape, float(kv_heads)))

    def engine_kv_factor(self, batch: np.ndarray, kv_heads: int) -> np.ndarray:
        """Engine KV time / kernel KV time (>= 1): 1 + half_units / (B x KV heads)."""
        b = np.maximum(np.asarray(batch, float), 1.0)
        if self.eff.engine_kv_half_units is None:
            return np.ones_like(b)
        return 1.0 + self.eff.engine_kv_half_units / (b * kv_heads)

    def decode_attention(self, batch: np.ndarray, context: np.ndarray, q_heads: int, kv_heads: int,
                         head_dim: int, *, engine: bool = True, path: str = "tensor_tile",
                         tile_rows: int = 64) -> np.ndarray:
        """One layer: `batch` decodes each attending to `context` KV tokens (launch included).

        Memory: the KV read, at `kv_read_eff` times the small-batch engine term in an engine
        step (`engine=True`), at the benchmarked kernel efficiency table otherwise.
        Compute, by the kernel `path`:
        * `tensor_tile`: tensor cores run each (sequence, KV head)'s query group padded to
          `tile_rows` rows, 4 x max(group, tile_rows) x head_dim FLOPs per KV token, at the
          GPU's attention efficiency for that KV length (`attn_mfu`);
        * `cuda_core` (FlashInfer, GQA group <= 4): every query head on CUDA cores, 4 x
          q_heads x head_dim FLOPs per KV token; in an engine at `decode_cuda_core_eff` of the
          FP32 peak, in a bare-kernel benchmark (where the KV read binds) as before at
          `mfu_attn_small_q` of the BF16 peak."""
        b = np.asarray(batch, dtype=float)
        ctx = np.asarray(context, dtype=float)
        kv_bytes = b * ctx * 4.0 * kv_heads * head_dim
        if engine:
            # In an engine step the kernel runs with the engine's launch configuration: the
            # benchmark table does not apply, the engine term does.
            memory = kv_bytes / (self.gpu.hbm_bandwidth_bytes_s * self.eff.kv_read_eff)
            memory = memory * self.engine_kv_factor(b, kv_heads)
        else:
            memory = kv_bytes / (self.gpu.hbm_bandwidth_bytes_s * self.kv_kernel_eff(b, ctx, kv_heads))
        group = q_heads / kv_heads
        if path == "tensor_tile":
            flops = 4.0 * b * kv_heads * max(group, float(tile_rows)) * head_dim * ctx
            # The asymptotic attention efficiency: the prefill form's KV-length saturation
            # describes one long causal pipeline, not many short decode CTAs.
            compute = flops / (self.peak() * self.attn_mfu(1.0, np.asarray(1e12)))
        elif path == "cuda_core":
            flops = 4.0 * q_heads * head_dim * b * ctx
            if engine:
                if not self.gpu.peak_fp32_flops:
                    raise ProfileError(f"{self.gpu.key}: no 'peak_fp32_flops' in the GPU spec "
                                       "(FlashInfer's CUDA-core decode kernel needs it)")
                compute = flops / (self.gpu.peak_fp32_flops * self.eff.decode_cuda_core_eff)
            else:
                compute = flops / (self.peak() * self.eff.mfu_attn_small_q)
        else:
            raise ProfileError(f"unknown decode attention path {path!r}")
        per_head = self.eff.decode_head_s * b * kv_heads
        return self.eff.attn_launch_per_layer_s + per_head + roofline(compute, memory, self.eff.roofline_n)

    @staticmethod
    def decode_path(engine: EngineSpec, q_heads: int, kv_heads: int) -> tuple[str, int]:
        """The decode kernel an engine runs for a head layout: (path, tile rows)."""
        if engine.decode_attention == "flashinfer" and q_heads <= 4 * kv_heads:
            return "cuda_core", 0
        return "tensor_tile", engine.decode_tile_rows

    # -- communication --------------------------------------------------------------------------
    def allreduce(self, nbytes: np.ndarray, tp: int) -> np.ndarray:
        if tp <= 1:
            return np.zeros_like(np.asarray(nbytes, dtype=float))
        link = self.gpu.interconnect_bandwidth_bytes_s * self.eff.allreduce_eff
        return self.gpu.allreduce_latency_s + 2.0 * (tp - 1) / tp * np.asarray(nbytes, float) / link


def power_law_routing(tokens: np.ndarray, experts: int, per_token: int, alpha: float,
                      block: np.ndarray, points: int = 4096) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Experts touched, padded rows and mean rows per touched expert when the experts' loads
    follow aiconfigurator's synthetic power law (collector/helper.py power_law_logits_v3:
    each expert draws x from a power law of exponent `alpha` on [1, 0.8 T] (on [0.01, 2] when
    T·k <= E), loads are x scaled to sum to T·k, rounded, and the remainder handed out from the
    largest load down). The expectation is taken over
    x's quantiles (`points` midpoints of its inverse CDF), the sum of x at its mean, so the
    result is deterministic."""
    t = np.atleast_1d(np.asarray(tokens, dtype=float))
    blk = np.broadcast_to(np.asarray(block, dtype=float), t.shape)
    e, k = float(experts), float(per_token)
    u = (np.arange(points) + 0.5) / points
    e_act, rows, mean_rows = (np.empty_like(t) for _ in range(3))
    for i, (ti, bi) in enumerate(zip(t, blk)):
        lo, hi = (1.0, 0.8 * ti) if ti * k > e else (0.01, 2.0)
        a = 1.0 - alpha
        x = ((hi ** a - lo ** a) * u + lo ** a) ** (1.0 / a) if hi > lo else np.full(points, lo)
        n = np.round(x / x.mean() * ti * k / e)
        # The collector hands the rounding's remainder out one token at a time, from the most
        # loaded expert down (or takes it back from the least loaded).
        short = int(np.rint((ti * k - e * float(n.mean())) / e * points))
        if short > 0:
            n[points - min(short, points):] += 1.0
        elif short < 0:
            positive = np.flatnonzero(n > 0)[: -short]
            n[positive] -= 1.0
        touched = float(np.mean(n >= 1.0))
        e_act[i] = max(e * touched, 1.0)
        rows[i] = e * float(np.mean(np.ceil(n / bi))) * bi
        mean_rows[i] = ti * k / e_act[i]
    shape = np.shape(tokens)
    return e_act.reshape(shape), rows.reshape(shape), mean_rows.reshape(shape)


def _interp_axis0(xs: np.ndarray, table: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Linear interpolation along the first axis of `table` (held at the ends), element-wise."""
    x = np.clip(x, xs[0], xs[-1])
    i = np.clip(np.searchsorted(xs, x, side="right") - 1, 0, max(len(xs) - 2, 0))
    if len(xs) == 1:
        return table[0]
    w = (x - xs[i]) / (xs[i + 1] - xs[i])
    idx = np.indices(x.shape)
    lo = table[(i, *idx)]
    hi = table[(i + 1, *idx)]
    return lo * (1.0 - w) + hi * w


@dataclass(frozen=True)
class AnalyticModel:
    """One GPU (or tensor-parallel group) serving one model: the step split into the
    components a profile tabulates."""

    gpu: GpuSpec
    model: ModelSpec  # one rank's share when model.tp > 1
    eff: Efficiency = field(default_factory=Efficiency)
    engine: EngineSpec = field(default_factory=load_engine)

    @classmethod
    def build(cls, gpu: str | GpuSpec, model: str | ModelSpec, tp: int = 1,
              engine: str | EngineSpec | None = None, **eff_overrides: Any) -> AnalyticModel:
        g = gpu if isinstance(gpu, GpuSpec) else load_gpu(gpu)
        m = model if isinstance(model, ModelSpec) else load_model(model)
        e = engine if isinstance(engine, EngineSpec) else load_engine(engine)
        eff = efficiency_for(g, e)
        if eff_overrides:
            eff = replace(eff, **eff_overrides)
        return cls(g, shard(m, tp) if m.tp == 1 else m, eff, e)

    @classmethod
    def named(cls, name: str, engine: str | EngineSpec | None = None, **eff_overrides: Any) -> AnalyticModel:
        gpu, model, tp = split_name(name)
        return cls.build(gpu, model, tp, engine, **eff_overrides)

    @property
    def name(self) -> str:
        return profile_name(self.gpu.key, self.model.key, self.model.tp)

    @property
    def kernels(self) -> Kernels:
        return Kernels(self.gpu, self.eff)

    # -- components ---------------------------------------------------------------------
    def dense(self, tokens: np.ndarray) -> np.ndarray:
        """Dense GEMMs (projections, dense MLP, router) and the tensor-parallel all-reduces
        for T tokens in the step."""
        t = np.asarray(tokens, dtype=float)
        m = self.model
        inputs, outputs = m.dense_activations_per_layer
        gemms = self.kernels.gemm(t, m.layers * m.dense_params_per_layer, launches=4 * m.layers,
                                  inputs_per_row=m.layers * inputs, outputs_per_row=m.layers * outputs)
        comm = 2 * m.layers * self.kernels.allreduce(t * m.hidden_size * 2.0, m.tp)
        return gemms + comm

    def lm_head(self, seqs: np.ndarray) -> np.ndarray:
        """Logits for one row per scheduled sequence, and sampling: GPU work (so the host
        part, `cpu`, is what an engine with async scheduling overlaps)."""
        b = np.asarray(seqs, dtype=float)
        e = self.eff
        logits = self.kernels.gemm(b, float(self.model.vocab_size * self.model.hidden_size),
                                   inputs_per_row=self.model.hidden_size, outputs_per_row=self.model.vocab_size)
        return logits + e.sample_base_s + e.sample_per_seq_s * b

    def moe(self, tokens: np.ndarray) -> np.ndarray:
        t = np.asarray(tokens, dtype=float)
        m = self.model
        if not m.is_moe:
            return np.zeros_like(t)
        per_layer = self.kernels.moe(t, m.experts, m.experts_per_token, m.expert_params)
        return m.moe_layer_count * per_layer

    def prefill_attention(self, q: np.ndarray, c: np.ndarray) -> np.ndarray:
        """Attention of one chunk of q new tokens over c cached ones, every layer."""
        m = self.model
        return m.layers * self.kernels.prefill_attention(q, c, m.attention_heads, m.kv_heads, m.head_dim)

    def decode_attention(self, batch: np.ndarray, total_context: np.ndarray) -> np.ndarray:
        """Attention of `batch` decodes whose KV lengths (c_i + 1) sum to total_context, every
        layer, launch excluded (it is in `fixed`); each decode at the mean context, with the
        engine's decode kernel."""
        m = self.model
        b = np.maximum(np.asarray(batch, dtype=float), 1.0)
        ctx = np.asarray(total_context, dtype=float) / b
        path, rows = Kernels.decode_path(self.engine, m.attention_heads, m.kv_heads)
        per_layer = self.kernels.decode_attention(b, ctx, m.attention_heads, m.kv_heads, m.head_dim,
                                                  path=path, tile_rows=rows)
        return m.layers * (per_layer - self.eff.attn_launch_per_layer_s)

    def fixed(self) -> float:
        """GPU time every step pays regardless of size: per-layer kernels and attention launch."""
        e = self.eff
        per_layer = e.layer_fixed_s + e.attn_launch_per_layer_s
        return self.model.layers * per_layer + self.model.moe_layer_count * e.layer_fixed_moe_s

    def cpu(self, seqs: np.ndarray) -> np.ndarray:
        """Host time per step: scheduler, input preparation, output processing."""
        b = np.asarray(seqs, dtype=float)
        return self.eff.cpu_base_s + self.eff.cpu_per_seq_s * b

    def host(self, seqs: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """The step's host part: `cpu` plus the per-token CPU cost."""
        return self.cpu(seqs) + self.eff.cpu_per_token_s * np.asarray(tokens, dtype=float)

    def combine(self, host: np.ndarray, gpu: np.ndarray) -> np.ndarray:
        """A step from its host and GPU parts: their sum, or, in an engine whose host work
        overlaps the GPU (`host_overlap`), the larger of the two."""
        return np.maximum(host, gpu) if self.engine.host_overlap else host + gpu

    # -- the whole step (reference for tests and provenance) ----------------------------
    def step_time(
        self, prefill_chunks: Sequence[tuple[int, int]], num_decodes: int, decode_context_tokens: int
    ) -> float:
        b = len(prefill_chunks) + num_decodes
        t = sum(q for q, _ in prefill_chunks) + num_decodes
        gpu = self.fixed() + float(self.dense(t)) + float(self.moe(t)) + float(self.lm_head(b))
        if num_decodes:
            gpu += float(self.decode_attention(num_decodes, decode_context_tokens))
        for q, c in prefill_chunks:
            gpu += float(self.prefill_attention(q, c))
        return float(self.combine(float(self.host(b, t)), gpu))

    def decode_run_times(self, batch: int, first_context_tokens: int, num_steps: int) -> np.ndarray:
        """`num_steps` decode-only steps of `batch` sequences whose summed context starts at
        `first_context_tokens` and grows by `batch` a step (vectorised `step_time`)."""
        ctx = first_context_tokens + batch * np.arange(num_steps, dtype=float)
        gpu = (self.fixed() + float(self.dense(batch)) + float(self.moe(batch)) + float(self.lm_head(batch))
               + self.decode_attention(np.full(num_steps, float(batch)), ctx))
        return self.combine(float(self.host(batch, batch)), gpu)

    # -- memory -------------------------------------------------------------------------
    def kv_capacity_tokens(self, gpu_memory_utilization: float = 0.9, block_size: int = 16) -> int:
        pool = (
            gpu_memory_utilization * self.gpu.memory_gib * GIB
            - self.model.weight_bytes
            - self.model.non_kv_overhead_gib * GIB
        )
        return int(pool // (block_size * self.model.kv_bytes_per_token)) * block_size


def profile_name(gpu: str, model: str, tp: int = 1) -> str:
    return f"{gpu}/{model}" + (f"-tp{tp}" if tp > 1 else "")


def split_name(name: str, *, where: str = "profile") -> tuple[str, str, int]:
    """`h20/qwen3-8b` or `a100/llama-3-70b-tp4` -> (gpu, model, tp); unknown parts raise."""
    gpu_key, _, model_key = name.partition("/")
    tp = 1
    head, sep, tail = model_key.rpartition("-tp")
    if sep and tail.isdigit():
        model_key, tp = head, int(tail)
    from lmsim.profile.hardware import _model_names, shipped_gpus

    if gpu_key not in shipped_gpus():
        raise ProfileError(f"{where}: unknown GPU {gpu_key!r} in {name!r} (known: {', '.join(shipped_gpus())})")
    if model_key.lower() not in _model_names():
        raise ProfileError(f"{where}: unknown model {model_key!r} in {name!r} "
                           f"(known: see lmsim/data/hardware/models.yaml)")
    return gpu_key, model_key, tp


# The profiles shipped under profiles/: every GPU with the two served models.
SHIPPED = [f"{g}/{m}" for g in ("h20", "h100", "h200") for m in ("qwen2-7b", "qwen3-30b-a3b")]


# -- composite workloads: a request alone, as the simulator prices it -----------------------
def prefill_seconds(model, tokens: int, cached: int = 0, budget: int = 8192) -> float:
    """A request alone: its new tokens in chunks of `budget`, each chunk one step."""
    total, done = 0.0, 0
    while done < tokens:
        q = min(budget, tokens - done)
        total += model.step_time([(q, cached + done)], 0, 0)
        done += q
    return total


def decode_step_seconds(model, batch: int, context: int) -> float:
    """One decode-only step of `batch` sequences, each attending to `context` KV tokens."""
    return model.step_time((), batch, batch * context)


def decode_seconds(model, prompt: int, output: int) -> float:
    """The output-1 decode steps of a request alone after a `prompt`-token prefill: step k
    attends to prompt + 1 + k tokens."""
    if output <= 1:
        return 0.0
    if hasattr(model, "decode_run_times"):
        return float(np.sum(model.decode_run_times(1, prompt + 1, output - 1)))
    return float(sum(model.step_time((), 1, prompt + 1 + k) for k in range(output - 1)))


def end_to_end_seconds(model, prompt: int, output: int, budget: int = 8192) -> float:
    """Batch-1 request: chunked prefill (emits the first token), then output-1 decode steps."""
    return prefill_seconds(model, prompt, 0, budget) + decode_seconds(model, prompt, output)


# -- tabulation -------------------------------------------------------------------------------
def _log_grid(start: int, stop: int, per_octave: int, dense_until: int) -> np.ndarray:
    """Every integer up to dense_until (where kinks such as the MoE block-padding step sit),
    then per_octave log-spaced integers up to stop."""
    head = np.arange(start, dense_until + 1)
    octaves = np.log2(stop / dense_until)
    tail = np.round(dense_until * 2.0 ** (np.arange(1, round(octaves * per_octave) + 1) / per_octave))
    return np.unique(np.concatenate([head, tail])).astype(float)


GRIDS = {
    "tokens": lambda: _log_grid(1, 262144, 16, 512),
    "seqs": lambda: _log_grid(1, 8192, 16, 256),
    "chunk_tokens": lambda: _log_grid(1, 131072, 8, 16),
    "cached_context": lambda: np.concatenate([[0.0], _log_grid(16, 262144, 8, 16)]),
    # Every batch to 16 (the engine term 1 + u/(B x heads) bends most there), then 4 per
    # octave to 4096; summed context at 4 points per octave (the decode efficiency table is log-bilinear
    # in the per-sequence context).
    "batch": lambda: np.unique(np.concatenate([np.arange(1.0, 17.0), np.round(16 * 2.0 ** (np.arange(1, 33) / 4))])),
    "total_context": lambda: np.unique(np.concatenate([[0.0], np.round(2.0 ** (np.arange(0, 113) / 4))])),
}


def tabulate(analytic: AnalyticModel, *, date: str | None = None, generated_by: str | None = None):
    """The analytic model sampled on the standard grids, as an in-memory profile."""
    import datetime

    from lmsim.profile.tables import ProfileData

    g = {k: f() for k, f in GRIDS.items()}
    qq, cc = np.meshgrid(g["chunk_tokens"], g["cached_context"], indexing="ij")
    bb, tc = np.meshgrid(g["batch"], g["total_context"], indexing="ij")
    gpu, model, eff = analytic.gpu, analytic.model, analytic.eff
    tp = model.tp
    meta: dict[str, Any] = {
        "hardware": {
            "gpu": gpu.name,
            "memory_gb_nominal": gpu.memory_gb_nominal,
            "memory_gib": round(gpu.memory_gib, 6),
            "hbm_bandwidth_bytes_s": gpu.hbm_bandwidth_bytes_s,
            "peak_bf16_flops": gpu.peak_bf16_flops,
        },
    }
    if tp > 1:
        meta["parallel"] = {"tensor_parallel_size": tp}
    meta["model"] = {
        "name": model.name,
        "layers": model.layers,
        "hidden_size": model.hidden_size,
        "attention_heads": model.attention_heads * tp,
        "kv_heads": _whole_kv_heads(model),
        "head_dim": model.head_dim,
        "vocab_size": model.vocab_size * tp if tp > 1 else model.vocab_size,
        "kv_bytes_per_token": model.kv_bytes_per_token,
        "weight_bytes": model.weight_bytes,
        "dense_params_per_layer": int(model.dense_params_per_layer),
        "experts": model.experts,
        "experts_per_token": model.experts_per_token,
        "moe_intermediate_size": model.moe_intermediate_size,
    }
    if tp > 1:
        meta["model"]["kv_dtype_bytes"] = 2
    meta["memory"] = {
        "non_kv_overhead_gib": model.non_kv_overhead_gib,
        "note": "KV pool = utilization * memory_gib - weight_bytes - non_kv_overhead_gib "
                "(costmodel.md 3.3)",
    }
    meta["step"] = {
        "fixed_s": float(analytic.fixed()),
        "cpu_per_token_s": eff.cpu_per_token_s,
    }
    if analytic.engine.host_overlap:
        meta["step"]["host_overlap"] = True
    meta["provenance"] = {
        "generated_by": generated_by or f"lmsim profile generate --only {analytic.name} "
                                        "(lmsim.profile.analytic)",
        "date": date or datetime.date.today().isoformat(),
        "spec": "lmsim/profile/analytic.py (form), lmsim/data/hardware/ (GPU and model facts)",
        "efficiency_constants": {
            "gpu": gpu.key,
            "values": eff.as_mapping(),
            "sources": EFFICIENCY_SOURCES,
        },
        "engine": {"key": analytic.engine.key, "name": analytic.engine.name,
                   "decode_attention": analytic.engine.decode_attention,
                   "decode_tile_rows": analytic.engine.decode_tile_rows,
                   "host_overlap": analytic.engine.host_overlap, "sources": analytic.engine.sources},
        "hardware_sources": gpu.sources,
        "model_sources": model.sources,
        "interpolation": "piecewise linear in each table axis (bilinear for matrices); first "
                         "value held below the grid, last segment extended linearly above it",
    }
    return ProfileData(
        name=analytic.name, meta=meta,
        tokens=g["tokens"], dense_s=analytic.dense(g["tokens"]), moe_s=analytic.moe(g["tokens"]),
        seqs=g["seqs"], lm_head_s=analytic.lm_head(g["seqs"]), cpu_s=analytic.cpu(g["seqs"]),
        pa_q=g["chunk_tokens"], pa_c=g["cached_context"], pa=analytic.prefill_attention(qq, cc),
        da_b=g["batch"], da_c=g["total_context"], da=analytic.decode_attention(bb, tc),
    )


def _whole_kv_heads(model: ModelSpec) -> int:
    return model.whole_kv_heads or model.kv_heads
