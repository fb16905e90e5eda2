"""The public-measurement table and lmsim's prediction for each row (`lmsim profile check`).

The table (`lmsim/data/profiles/measurements.csv`, one published number per row, each with its
source; columns and kinds in notes/measurements_schema.md) is read by `read_measurements`. For
every row, `Checker.predict` gives lmsim's value in the row's unit:

* end-to-end, TTFT, TPOT, decode-step and prefill-throughput rows go through the table
  predictor (`TableCostModel`), exactly as the simulator prices steps: a request alone is its
  prompt in chunks of 8192 tokens, one engine step each, then output-1 decode steps at batch
  1 (`analytic.end_to_end_seconds`). The profile is the shipped one for the row's GPU, model
  and tensor-parallel size when lmsim ships it, else one built on the fly exactly as
  `lmsim profile new` builds it;
* kernel rows are predicted from the analytic kernel groups of the row's GPU (the functional
  form, `analytic.Kernels`), with the row's own shapes.

Scope. A row whose `scope` column says `out: <reason>` measures something lmsim does not model
(an eager-mode engine, a synthetic kernel layout, a cache-resident benchmark...): it is still
predicted and counted, on its own line, but the summary's bar (`in_scope`) and calibration
leave it out. An empty `scope` (or a table without the column) means in scope.

Engines. Engine rows are priced with the engine their `engine` column names
(`lmsim/data/hardware/engines.yaml`: decode kernel path, host overlap, host time): the shipped
profile when the engine is the default (vLLM v1), else a profile built as `lmsim profile new
--engine` builds it. Kernel decode-attention rows take their kernel path from the same table
(FlashInfer's CUDA-core/tensor-core dispatch, FlashAttention's 64-row tile).

Split. Every row is either `fit` or `check`, by the first byte of sha256(id): `check` when it
is divisible by 3 (about a third of the rows), `fit` otherwise. Only fit rows may calibrate
constants (`lmsim.profile.calibrate`); the check rows are what the summary reports as the
check. The rule depends on the id alone, so adding rows never moves an old row between sets.
"""

from __future__ import annotations

import csv
import hashlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lmsim.errors import ProfileError

COLUMNS = (
    "id", "source", "url", "gpu", "num_gpus", "tp", "model", "engine", "dtype", "kind", "batch",
    "input_tokens", "output_tokens", "context_tokens", "chunk_tokens", "q_heads", "kv_heads",
    "head_dim", "gemm_m", "gemm_n", "gemm_k", "measured", "unit", "condition",
)
OPTIONAL_COLUMNS = ("scope",)  # empty: in scope; "out: <reason>": predicted, not held to the bar
INT_COLUMNS = ("num_gpus", "tp", "batch", "input_tokens", "output_tokens", "context_tokens",
               "chunk_tokens", "q_heads", "kv_heads", "head_dim", "gemm_m", "gemm_n", "gemm_k")
KINDS = {
    # kind: (required integer columns, allowed units)
    "e2e_b1": (("input_tokens", "output_tokens"), ("s", "ms")),
    "tpot_b1": (("input_tokens", "output_tokens"), ("ms", "s", "us", "tok/s")),
    "ttft_b1": (("input_tokens",), ("s", "ms")),
    "decode_step": (("batch", "context_tokens"), ("ms", "s", "us", "tok/s")),
    "prefill_throughput": (("batch", "input_tokens"), ("tok/s",)),
    "kernel_decode_attention": (("batch", "context_tokens", "q_heads", "kv_heads", "head_dim"), ("us", "ms")),
    "kernel_prefill_attention": (("chunk_tokens", "q_heads", "kv_heads", "head_dim"), ("us", "ms")),
    "kernel_gemm": (("gemm_m", "gemm_n", "gemm_k"), ("us", "ms")),
    "kernel_layer_gemms": (("batch",), ("us", "ms")),
    "kernel_moe": (("batch",), ("us", "ms")),
}
KERNEL_KINDS = tuple(k for k in KINDS if k.startswith("kernel_"))
SECONDS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
DEFAULT_BUDGET = 8192


@dataclass(frozen=True)
class Measurement:
    id: str
    source: str
    gpu: str
    model: str
    engine: str
    dtype: str
    kind: str
    measured: float
    unit: str
    condition: str
    values: dict[str, int | None]  # the integer columns, None where empty
    url: str = ""
    line: int = 0
    scope: str = ""  # "" in scope, else "out: <reason>"

    def get(self, column: str, default: int | None = None) -> int | None:
        v = self.values.get(column)
        return default if v is None else v

    @property
    def split(self) -> str:
        return split_of(self.id)

    @property
    def tp(self) -> int:
        return int(self.get("tp", 1) or 1)

    @property
    def in_scope(self) -> bool:
        return not self.scope

    @property
    def scope_reason(self) -> str:
        return self.scope.removeprefix("out:").strip()


def split_of(row_id: str) -> str:
    return "check" if hashlib.sha256(row_id.encode()).digest()[0] % 3 == 0 else "fit"


def default_table() -> Path:
    from lmsim.shipped import PROFILES_DIR

    return PROFILES_DIR / "measurements.csv"


def read_measurements(path: str | Path | None = None) -> list[Measurement]:
    """Every row of the table, checked: one ProfileError naming the file, line and column."""
    path = Path(path) if path is not None else default_table()
    try:
        fh = path.open(newline="")
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read the measurement table ({exc.strerror})") from None
    with fh:
        lines = [(n, line) for n, line in enumerate(fh, start=1) if line.strip() and not line.startswith("#")]
    if not lines:
        raise ProfileError(f"{path}: no header and no rows")
    reader = csv.reader([line for _, line in lines])
    header = [h.strip() for h in next(reader)]
    for col in COLUMNS:
        if col not in header:
            raise ProfileError(f"{path}: line {lines[0][0]}: missing column {col!r}")
    rows, seen = [], set()
    for (n, _), cells in zip(lines[1:], reader):
        where = f"{path}: line {n}"
        if len(cells) != len(header):
            raise ProfileError(f"{where}: {len(cells)} cells, the header has {len(header)}")
        raw = {h: c.strip() for h, c in zip(header, cells)}
        raw.setdefault("scope", "")
        rows.append(_row(raw, where, n))
        if rows[-1].id in seen:
            raise ProfileError(f"{where}: column 'id': duplicate id {rows[-1].id!r}")
        seen.add(rows[-1].id)
    return rows


def _row(raw: dict[str, str], where: str, line: int) -> Measurement:
    for col in ("id", "source", "gpu", "kind", "measured", "unit"):
        if not raw[col]:
            raise ProfileError(f"{where}: column {col!r} is empty")
    kind = raw["kind"]
    if kind not in KINDS:
        raise ProfileError(f"{where}: column 'kind': unknown kind {kind!r} (known: {', '.join(KINDS)})")
    values: dict[str, int | None] = {}
    for col in INT_COLUMNS:
        cell = raw[col]
        if not cell:
            values[col] = None
            continue
        try:
            v = float(cell)
        except ValueError:
            raise ProfileError(f"{where}: column {col!r}: not a number ({cell!r})") from None
        if v < 0 or v != int(v):
            raise ProfileError(f"{where}: column {col!r}: must be a whole number >= 0, got {cell!r}")
        values[col] = int(v)
    try:
        measured = float(raw["measured"])
    except ValueError:
        raise ProfileError(f"{where}: column 'measured': not a number ({raw['measured']!r})") from None
    if not math.isfinite(measured) or measured <= 0:
        raise ProfileError(f"{where}: column 'measured': must be a finite number > 0")
    required, units = KINDS[kind]
    for col in required:
        if values[col] is None:
            raise ProfileError(f"{where}: column {col!r} is required for kind {kind!r}")
    if raw["unit"] not in units:
        raise ProfileError(f"{where}: column 'unit': {raw['unit']!r} is not one of {', '.join(units)} "
                           f"for kind {kind!r}")
    if kind in ("kernel_layer_gemms", "kernel_moe") and not raw["model"]:
        raise ProfileError(f"{where}: column 'model' is required for kind {kind!r}")
    if not kind.startswith("kernel_") and not raw["model"]:
        raise ProfileError(f"{where}: column 'model' is required for kind {kind!r}")
    scope = raw["scope"]
    if scope and (not scope.startswith("out: ") or len(scope) < 15):
        raise ProfileError(f"{where}: column 'scope': empty (in scope) or 'out: <reason>', got {scope!r}")
    return Measurement(
        id=raw["id"], source=raw["source"], gpu=raw["gpu"].lower(), model=raw["model"].lower(),
        engine=raw["engine"], dtype=(raw["dtype"] or "bf16").lower(), kind=kind, measured=measured,
        unit=raw["unit"], condition=raw["condition"], values=values, url=raw["url"], line=line,
        scope=scope,
    )


# -- prediction ---------------------------------------------------------------------------
def _to_unit(seconds: float, unit: str) -> float:
    return seconds / SECONDS[unit]


def prefill_steps(batch: int, prompt: int, budget: int) -> list[list[tuple[int, int]]]:
    """The steps that prefill `batch` prompts of `prompt` tokens together, FCFS under a token
    budget (vLLM's chunked prefill): each step's chunks as (q, c) pairs."""
    left = [prompt] * batch
    done = [0] * batch
    steps = []
    while any(left):
        room, chunks = budget, []
        for i in range(batch):
            if left[i] and room:
                q = min(left[i], room)
                chunks.append((q, done[i]))
                done[i] += q
                left[i] -= q
                room -= q
        steps.append(chunks)
    return steps


@dataclass
class Prediction:
    row: Measurement
    predicted: float | None  # in the row's unit; None when lmsim cannot answer the row
    profile: str  # what priced it: a profile name, `<gpu> kernels`, or why not
    note: str = ""

    @property
    def ratio(self) -> float | None:
        return None if self.predicted is None else self.predicted / self.row.measured


class Checker:
    """Predicts rows; caches one profile per (gpu, model, tp)."""

    def __init__(self, profiles: dict[tuple[str, str, int], Any] | None = None) -> None:
        from lmsim.profile.hardware import load_engines

        self._profiles: dict[tuple[str, str, int, str], tuple[Any, str]] = {}
        self._given = profiles or {}
        self._kernels: dict[str, Any] = {}
        self._models: dict[str, Any] = {}
        self.engines = load_engines()

    def engine_of(self, row: Measurement):
        """The engine spec the row's `engine` column names (engines.yaml `matches`)."""
        return self.engines.for_text(row.engine)

    # -- what prices a row --------------------------------------------------------------------
    def model_spec(self, name: str):
        from lmsim.profile.hardware import load_model

        if name not in self._models:
            self._models[name] = load_model(name, where="measurements: column 'model'")
        return self._models[name]

    def kernels(self, gpu: str):
        from lmsim.profile.analytic import Kernels

        if gpu not in self._kernels:
            self._kernels[gpu] = Kernels.named(gpu)
        return self._kernels[gpu]

    def table_model(self, gpu: str, model: str, tp: int, engine: str | None = None) -> tuple[Any, str]:
        """For (gpu, model, tp) and an engine (default: vLLM v1): a profile given to the
        checker for that engine, else the shipped one when the engine is the default, else
        one built as `profile new --engine` would."""
        engine = engine or self.engines.default
        key = (gpu, self.model_spec(model).key, tp)
        given = self._given.get(key)
        if given is not None and _profile_engine(given[0], self.engines.default) == engine:
            return given
        full = (*key, engine)
        if full not in self._profiles:
            from lmsim.profile.analytic import AnalyticModel, profile_name, tabulate
            from lmsim.profile.tables import TableCostModel, load_table_profile
            from lmsim.shipped import PROFILES_DIR

            name = profile_name(*key)
            shipped = PROFILES_DIR / name / "profile.yaml"
            if engine == self.engines.default and shipped.is_file():
                self._profiles[full] = (load_table_profile(name), name)
            else:
                analytic = AnalyticModel.build(gpu, self.model_spec(model), tp, self.engines.engines[engine])
                label = f"{name} (built)" if engine == self.engines.default else f"{name} (built, {engine})"
                self._profiles[full] = (TableCostModel(tabulate(analytic, date="-")), label)
        return self._profiles[full]

    # -- rows ---------------------------------------------------------------------------------
    def predict(self, row: Measurement) -> Prediction:
        try:
            if row.kind in KERNEL_KINDS:
                value, label = self._kernel(row), f"{row.gpu} kernels"
            else:
                model, label = self.table_model(row.gpu, row.model, row.tp, self.engine_of(row).key)
                value = self._engine(row, model)
        except ProfileError as exc:
            return Prediction(row, None, f"cannot predict: {exc}")
        note = "per-GPU analogue" if (row.get("num_gpus", 1) or 1) > row.tp else ""
        return Prediction(row, float(value), label, note)

    def _engine(self, row: Measurement, model) -> float:
        from lmsim.profile.analytic import decode_seconds, prefill_seconds

        unit = row.unit
        budget = row.get("chunk_tokens", DEFAULT_BUDGET) if row.kind != "prefill_throughput" else None
        if row.kind == "e2e_b1":
            prompt, output = row.get("input_tokens"), row.get("output_tokens")
            seconds = prefill_seconds(model, prompt, 0, budget) + decode_seconds(model, prompt, output)
            return _to_unit(seconds, unit)
        if row.kind == "ttft_b1":
            cached = row.get("context_tokens", 0)
            return _to_unit(prefill_seconds(model, row.get("input_tokens") - cached, cached, budget), unit)
        if row.kind == "tpot_b1":
            prompt, output = row.get("input_tokens"), row.get("output_tokens")
            tpot = decode_seconds(model, prompt, output) / max(output - 1, 1)
            return 1.0 / tpot if unit == "tok/s" else _to_unit(tpot, unit)
        if row.kind == "decode_step":
            b, ctx = row.get("batch"), row.get("context_tokens")
            step = model.step_time((), b, b * ctx)
            return b / step if unit == "tok/s" else _to_unit(step, unit)
        if row.kind == "prefill_throughput":
            b, prompt = row.get("batch"), row.get("input_tokens")
            steps = prefill_steps(b, prompt, row.get("chunk_tokens", b * prompt))
            return b * prompt / sum(model.step_time(chunks, 0, 0) for chunks in steps)
        raise AssertionError(row.kind)

    def _kernel(self, row: Measurement) -> float:
        k = self.kernels(row.gpu)
        unit = row.unit
        fp8 = row.dtype.startswith("fp8")
        if row.kind == "kernel_gemm":
            m, n, kk = row.get("gemm_m"), row.get("gemm_n"), row.get("gemm_k")
            return _to_unit(float(k.gemm(m, float(n) * kk, fp8=fp8, inputs_per_row=kk, outputs_per_row=n)), unit)
        if row.kind == "kernel_decode_attention":
            qh, kvh = row.get("q_heads"), row.get("kv_heads")
            path, rows = k.decode_path(self.engine_of(row), qh, kvh)
            t = k.decode_attention(row.get("batch"), row.get("context_tokens"), qh, kvh, row.get("head_dim"),
                                   engine=False, path=path, tile_rows=rows)
            return _to_unit(float(t), unit)
        if row.kind == "kernel_prefill_attention":
            b = row.get("batch", 1) or 1
            dense = self.engine_of(row).prefill_kv_layout == "dense"
            t = k.prefill_attention(row.get("chunk_tokens"), row.get("context_tokens", 0), row.get("q_heads"),
                                    row.get("kv_heads"), row.get("head_dim"), batch=b, dense=dense)
            return _to_unit(float(t), unit)
        from lmsim.profile.hardware import shard

        spec = shard(self.model_spec(row.model), row.tp, where=f"measurements line {row.line}: column 'tp'")
        tokens = row.get("batch")
        if row.kind == "kernel_layer_gemms":
            inputs, outputs = spec.dense_activations_per_layer
            return _to_unit(float(k.gemm(tokens, spec.dense_params_per_layer, fp8=fp8, launches=4,
                                         inputs_per_row=inputs, outputs_per_row=outputs)), unit)
        if row.kind == "kernel_moe":
            if not spec.is_moe:
                raise ProfileError(f"model {row.model!r} has no experts")
            kernel = self.engine_of(row)
            return _to_unit(float(k.moe(tokens, spec.experts, spec.experts_per_token, spec.expert_params, fp8=fp8,
                                        power_law_alpha=kernel.moe_power_law_alpha,
                                        block_rows=kernel.moe_block_rows)), unit)
        raise AssertionError(row.kind)


def _profile_engine(model: Any, default: str) -> str:
    """The engine a table profile was built for (its provenance), the default when unrecorded."""
    prov = (getattr(getattr(model, "data", None), "meta", None) or {}).get("provenance") or {}
    engine = prov.get("engine") if isinstance(prov, dict) else None
    return str(engine.get("key", default)) if isinstance(engine, dict) else default


# -- selection and summary ----------------------------------------------------------------
def rows_for_profile(rows: list[Measurement], gpu: str, model: str, tp: int, checker: Checker) -> list[Measurement]:
    """The rows a profile of (gpu, model, tp) can answer: its engine rows, and the kernel
    rows of its GPU whose model is its model or unnamed."""
    out = []
    for r in rows:
        if r.gpu != gpu:
            continue
        if not r.model:
            if r.kind in KERNEL_KINDS:
                out.append(r)
            continue
        try:
            same = checker.model_spec(r.model).key == model
        except ProfileError:
            continue
        if same and r.tp == tp:
            out.append(r)
    return out


LONG_CONTEXT_TOKENS = 30_000  # the long-context end-to-end rows: prompts of 30k and more
ENGINE_KINDS = ("e2e_b1", "tpot_b1", "ttft_b1", "decode_step", "prefill_throughput")


def summarise(preds: list[Prediction], within: float = 0.10) -> dict[str, Any]:
    """Counts within `within`, worst ratio (furthest from 1 in log terms): `all` rows;
    `in_scope` (the rows the bar applies to) and its `fit`/`check` splits; `out_of_scope`;
    `long_context`, the in-scope end-to-end rows with prompts of 30k tokens and more, per GPU."""
    def block(ps: list[Prediction]) -> dict[str, Any]:
        answered = [p for p in ps if p.ratio is not None]
        if not answered:
            return {"rows": len(ps), "answered": 0, "within_10pct": 0, "share_within_10pct": None,
                    "beyond_25pct": 0, "worst_ratio": None, "worst_id": None, "median_abs_log_ratio": None}
        logs = np.array([abs(math.log(p.ratio)) for p in answered])
        worst = answered[int(np.argmax(logs))]
        inside = sum(1 for p in answered if abs(p.ratio - 1.0) <= within + 1e-12)
        beyond = sum(1 for p in answered if abs(p.ratio - 1.0) > 0.25 + 1e-12)
        return {
            "rows": len(ps), "answered": len(answered), "within_10pct": inside,
            "share_within_10pct": round(inside / len(answered), 4), "beyond_25pct": beyond,
            "worst_ratio": round(worst.ratio, 4), "worst_id": worst.row.id,
            "median_abs_log_ratio": round(float(np.median(logs)), 4),
        }

    inside = [p for p in preds if p.row.in_scope]
    longs = [p for p in inside if p.row.kind == "e2e_b1" and (p.row.get("input_tokens") or 0) >= LONG_CONTEXT_TOKENS]
    return {
        "all": block(preds),
        "in_scope": block(inside),
        "fit": block([p for p in inside if p.row.split == "fit"]),
        "check": block([p for p in inside if p.row.split == "check"]),
        "out_of_scope": block([p for p in preds if not p.row.in_scope]),
        "long_context": {gpu: block([p for p in longs if p.row.gpu == gpu])
                         for gpu in sorted({p.row.gpu for p in longs})},
    }
