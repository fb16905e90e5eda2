"""`lmsim profile ...`: generate, show, plot and fit step-cost profiles."""

from __future__ import annotations

import argparse
from pathlib import Path

from lmsim.cli.options import add_overwrite_option, command_help
from lmsim.errors import ProfileError
from lmsim.outputs import check_output_file, is_signed_figure
from lmsim.profile.analytic import (
    SHIPPED,
    AnalyticModel,
    decode_step_seconds,
    prefill_seconds,
    split_name,
    tabulate,
)
from lmsim.profile.tables import (
    TABLE_FILES,
    TableCostModel,
    is_profile_dir,
    load_table_profile,
    write_profile,
)
from lmsim.shipped import PROFILES_DIR, check_source_checkout


def register_cli(subparsers) -> None:
    p = subparsers.add_parser("profile", help=command_help("profile"))
    sub = p.add_subparsers(dest="profile_command", required=True)

    g = sub.add_parser("generate", help="regenerate profile tables from the analytic model")
    g.add_argument("--out", type=Path, default=None,
                   help="profiles folder (default: the shipped profiles/, only from a source checkout)")
    add_overwrite_option(g, "file in a folder that is not an lmsim profile")
    g.add_argument("--only", metavar="NAME", help="one profile, e.g. h20/qwen3-30b-a3b")
    g.add_argument("--no-plot", action="store_true", help="skip drawing plot.png")
    g.set_defaults(func=cmd_generate)

    s = sub.add_parser("show", help="print a profile's facts, KV capacity and step-time tables")
    s.add_argument("name", help="profile name or path")
    s.set_defaults(func=cmd_show)

    pl = sub.add_parser("plot", help="draw prefill and decode curves as a PNG")
    pl.add_argument("name", help="profile name or path")
    pl.add_argument("--out", type=Path,
                    help="PNG path (default: <gpu>-<model>.png in the working directory)")
    add_overwrite_option(pl, "--out file lmsim did not draw")
    pl.set_defaults(func=cmd_plot)

    f = sub.add_parser("fit", help="fit a profile's tables to measured step times")
    f.add_argument("measurements", type=Path, help="CSV: " + ",".join(
        ("prefill_tokens", "cached_context", "decode_count", "decode_context", "step_s")))
    start = f.add_mutually_exclusive_group(required=True)
    start.add_argument("--base", help="any profile (name or path) whose shapes are kept")
    start.add_argument("--spec", type=Path,
                       help="YAML of model dimensions and GPU facts to start from (lmsim.profile.spec)")
    f.add_argument("--out", type=Path, required=True, help="folder for the fitted profile")
    f.add_argument("--name", help="name recorded in the new profile (default: <base>-fit)")
    add_overwrite_option(f, "file in a folder that is not an lmsim profile")
    f.set_defaults(func=cmd_fit)

    imp = sub.add_parser("import", help="compose another simulator's profiling data into a profile")
    isub = imp.add_subparsers(dest="import_format", required=True)
    v = isub.add_parser("vidur", help="Vidur's per-operator medians (compute/, network/ folders)")
    v.add_argument("dir", type=Path, help="Vidur profiling folder holding compute/ and network/")
    v.add_argument("--model", required=True, help="e.g. meta-llama/Llama-2-70b-hf")
    v.add_argument("--device", required=True, help="e.g. a100")
    v.add_argument("--network", required=True, help="e.g. a100_dgx")
    v.add_argument("--tp", type=int, required=True, help="tensor parallel size")
    v.add_argument("--out", type=Path, required=True, help="new folder for the profile")
    v.add_argument("--layers", type=int, help="layers, for a model outside Vidur's registry")
    v.add_argument("--block-size", type=int, default=16, help="KV block size of the attention rows (16)")
    v.add_argument("--max-tokens", type=int, default=4096,
                   help="Vidur's request max_tokens: the KV pool holds whole slots of it (4096)")
    v.add_argument("--memory-margin", type=float, default=0.1, help="Vidur's memory_margin_fraction (0.1)")
    v.add_argument("--name", help="profile name (default: <device>/<model>-tp<N>)")
    v.set_defaults(func=cmd_import_vidur)

    val = sub.add_parser("validate", help="check a profile against the schema; one line per problem")
    val.add_argument("name", help="profile name or path")
    val.set_defaults(func=cmd_validate)

    n = sub.add_parser("new", help="a profile for any model and GPU from public facts (HF config.json, GPU spec)")
    n.add_argument("--model", required=True, metavar="HF_CONFIG.json|NAME",
                   help="a Hugging Face config.json, or a model lmsim knows by name (qwen3-8b, llama-3-8b, ...)")
    n.add_argument("--gpu", required=True, metavar="NAME|SPEC.yaml",
                   help="h20, h100, h200, h800, a100, l40s, rtx5090, or your own GPU spec YAML")
    n.add_argument("--tp", type=int, default=1, help="tensor-parallel size of one instance (default 1)")
    n.add_argument("--engine", default=None, metavar="NAME",
                   help="serving engine whose kernels and host time to price (lmsim/data/hardware/engines.yaml: "
                        "vllm-v1, the default and what lmsim simulates; vllm-v1-async, sglang-0.4, vllm-0.6, vllm-0.4)")
    n.add_argument("--out", type=Path, required=True, help="new (or empty) folder for the profile")
    n.add_argument("--name", help="profile name (default: <gpu>/<model>[-tpN])")
    n.add_argument("--no-plot", action="store_true", help="skip drawing plot.png")
    n.set_defaults(func=cmd_new)

    pr = sub.add_parser("predict", help="ask a profile for one step or one request alone (JSON)")
    pr.add_argument("name", help="profile name or path (or <gpu>/<model>[-tpN], built on the fly)")
    pr.add_argument("--engine", default=None, metavar="NAME",
                    help="with a <gpu>/<model>[-tpN] built on the fly: the engine to build it for (default vllm-v1)")
    what = pr.add_mutually_exclusive_group(required=True)
    what.add_argument("--prefill", type=int, metavar="TOKENS", help="one prefill chunk step of TOKENS new tokens")
    what.add_argument("--decode-batch", type=int, metavar="B", help="one decode step of B sequences")
    what.add_argument("--request", type=int, nargs=2, metavar=("INPUT", "OUTPUT"),
                      help="one request alone: TTFT, mean TPOT and end-to-end")
    pr.add_argument("--context", type=int, default=0, metavar="L",
                    help="--prefill: tokens already cached; --decode-batch: KV length each sequence attends to")
    pr.add_argument("--budget", type=int, default=8192, help="prefill chunk size of --request (default 8192)")
    pr.set_defaults(func=cmd_predict)

    cal = sub.add_parser("calibrate", help="fit the per-GPU constants on the fit split (developer command)")
    cal.add_argument("--form", choices=("smooth", "knee"), default="smooth",
                     help="smooth roofline (default, chosen by evidence: profiles/README.md) or the hard knee")
    cal.add_argument("--measurements", type=Path, default=None, help="table (default: the shipped one)")
    cal.add_argument("--kv-table", action="store_true",
                     help="also fit a per-GPU decode efficiency table (batch x context) over the constants")
    cal.add_argument("--write", action="store_true",
                     help="write the constants into lmsim/data/hardware/gpus/*.yaml (source checkout only)")
    cal.add_argument("--only", default=None, metavar="GPU[,GPU]",
                     help="with --write: write only these GPUs' files (and engines.yaml); for adding a GPU "
                          "whose rows leave the others' constants as printed before")
    cal.set_defaults(func=cmd_calibrate)

    c = sub.add_parser("check", help="lmsim's prediction for every public measurement, and the ratio")
    c.add_argument("profiles", nargs="*", metavar="PROFILE",
                   help="only the rows these profiles can answer (default: every row)")
    c.add_argument("--json", action="store_true", help="print rows and summary as JSON")
    c.add_argument("--all", action="store_true",
                   help="also list the rows marked out of scope (they are always counted)")
    c.add_argument("--measurements", type=Path, default=None,
                   help="a measurement table in the same schema (default: the shipped one)")
    c.set_defaults(func=cmd_check)


PROFILE_FILES = ("profile.yaml", *TABLE_FILES.values(), "plot.png")


def check_profile_dir(out_dir: Path, *, overwrite: bool) -> None:
    """A profile folder may be written when it is new, empty or an lmsim profile; the files
    of another folder are replaced only with --overwrite."""
    for name in PROFILE_FILES:
        check_output_file(out_dir / name, overwrite=overwrite, ours=lambda p: is_profile_dir(p.parent))


def generate_one(name: str, out_root: Path, *, plot: bool = True) -> Path:
    split_name(name, where="--only")
    analytic = AnalyticModel.named(name)
    data = tabulate(analytic)
    table = TableCostModel(data)
    data.meta["provenance"]["check"] = provenance_check(table, name)
    out_dir = out_root / name
    write_profile(data, out_dir)
    if plot:
        from lmsim.profile.plot import plot_profile

        plot_profile(table, out_dir / "plot.png")
    return out_dir


def provenance_check(table: TableCostModel, name: str) -> list[dict] | str:
    """This profile's rows of the shipped measurement table: those of its engine predicted
    through `table`, those of another engine (SGLang, vLLM V0) through a profile built for
    theirs, as `profile check` prices them."""
    from lmsim.profile.measurements import (
        Checker,
        default_table,
        read_measurements,
        rows_for_profile,
    )

    if not default_table().is_file():
        return "none: no measurement table shipped"
    gpu, model, tp = split_name(name)
    checker = Checker()
    key = (gpu, checker.model_spec(model).key, tp)
    checker = Checker({key: (table, name)})
    rows = rows_for_profile(read_measurements(), gpu, key[1], tp, checker)
    out = []
    for p in map(checker.predict, rows):
        if p.ratio is None or p.row.kind.startswith("kernel_"):
            continue
        entry = {"id": p.row.id, "split": p.row.split, "kind": p.row.kind, "unit": p.row.unit,
                 "measured": p.row.measured, "model": round(p.predicted, 4), "ratio": round(p.ratio, 3)}
        if p.profile != name:
            entry["priced_by"] = p.profile
        if not p.row.in_scope:
            entry["scope"] = p.row.scope
        out.append(entry)
    return out or "none: the measurement table has no engine row for this GPU and model"


def cmd_generate(args: argparse.Namespace) -> int:
    names = [args.only] if args.only else SHIPPED
    if args.out is None:
        check_source_checkout(PROFILES_DIR, "profile generate")
        args.out = PROFILES_DIR
    for name in names:
        split_name(name, where="--only")
        check_profile_dir(args.out / name, overwrite=args.overwrite)
    for name in names:
        out = generate_one(name, args.out, plot=not args.no_plot)
        print(f"wrote {out}")
    return 0


def _kv_fits(kv_tokens: int | None, batch: int, ctx: int) -> str:
    return "*" if kv_tokens is not None and batch * ctx > kv_tokens else ""


def _off_grid(model: TableCostModel, chunks: list[tuple[int, int]], batch: int, context: int) -> str:
    """'!' when any of these steps leaves the profile's grid (its time is extrapolated)."""
    return "!" if model.outside_grid(chunks, batch, context) else ""


def _prefill_off_grid(model: TableCostModel, tokens: int, cached: int, budget: int = 8192) -> str:
    chunks = [(min(budget, tokens - done), cached + done) for done in range(0, tokens, budget)]
    return "!" if any(model.outside_grid([c], 0, 0) for c in chunks) else ""


def format_show(model: TableCostModel) -> str:
    d = model.data
    hw, mf, mem = d.meta["hardware"], d.meta["model"], d.meta["memory"]
    lines = [f"profile {model.name}  ({d.source})", ""]
    lines.append(f"hardware: {hw['gpu']}, {hw['memory_gib']:.2f} GiB visible, "
                 f"{hw['hbm_bandwidth_bytes_s'] / 1e12:.2f} TB/s, {hw['peak_bf16_flops'] / 1e12:.0f} TFLOPS BF16 dense")
    moe = f", {mf['experts']} experts (top-{mf.get('experts_per_token', '?')})" if mf["experts"] else ", dense"
    lines.append(f"model:    {mf['name']}: {mf['layers']} layers, {mf['attention_heads']} heads / "
                 f"{mf['kv_heads']} KV heads x {mf['head_dim']}{moe}")
    lines.append(f"          weights {mf['weight_bytes'] / 2**30:.2f} GiB, KV {mf['kv_bytes_per_token']} B/token "
                 f"({mf['kv_bytes_per_token'] / 1024:g} KiB), non-KV overhead {mem['non_kv_overhead_gib']} GiB")
    lines.append("")
    kv_tokens = None
    for util in (0.9, 0.92):
        blocks = model.num_kv_blocks(16, util)
        if util == 0.9:
            kv_tokens = blocks * 16
        lines.append(f"KV capacity at gpu_memory_utilization {util}: {blocks:,} blocks of 16 = {blocks * 16:,} tokens")
    lines += ["", "(a) prefill time of one request alone, engine only, budget 8192 [ms]; "
              "! = outside the profile's grid (extrapolated)"]
    sizes = (512, 1024, 2048, 4096, 8192, 32768, 65536)
    lines.append(f"{'new tokens':>16}" + "".join(f"{s:>9}" for s in sizes))
    for cached in (0, 8192):
        cells = [f"{prefill_seconds(model, s, cached) * 1e3:.1f}{_prefill_off_grid(model, s, cached)}"
                 for s in sizes]
        lines.append(f"{f'{cached // 1024}k cached':>16}" + "".join(f"{c:>9}" for c in cells))
    lines += ["", "(b) decode step time [ms]; * = the batch does not fit in the KV pool, ! = outside the grid"]
    batches = (1, 8, 32, 64, 128, 256)
    lines.append(f"{'batch':>16}" + "".join(f"{b:>9}" for b in batches))
    for ctx in (1024, 8192):
        cells = [f"{decode_step_seconds(model, b, ctx) * 1e3:.1f}{_kv_fits(kv_tokens, b, ctx)}"
                 f"{_off_grid(model, [], b, b * ctx)}" for b in batches]
        lines.append(f"{f'ctx {ctx // 1024}k':>16}" + "".join(f"{c:>9}" for c in cells))
    lines += ["", "(e) mixed steps: decodes at ctx 2048 plus one fresh chunk [ms]"]
    for b, q in ((64, 0), (64, 512), (64, 2048), (64, 8128), (200, 0), (200, 2048)):
        chunks = [(q, 0)] if q else []
        label = f"{b} decodes" + (f" + {q}-token chunk" if q else "")
        mark = _off_grid(model, chunks, b, b * 2048)
        lines.append(f"  {label:<34}{model.step_time(chunks, b, b * 2048) * 1e3:>9.1f}{mark}")
    prov = d.meta.get("provenance", {})
    check, fit = prov.get("check"), prov.get("fit_error")
    if isinstance(check, list) and check:
        lines += ["", "public measurements of this GPU and model (lmsim profile check)"]
        for r in check:
            by = f"  ({r['priced_by']})" if r.get("priced_by") else ""
            out = "  out of scope" if r.get("scope") else ""
            lines.append(f"  {r['id'][:50]:<51}{r['split']:<6}measured {r['measured']:>9g} "
                         f"model {r['model']:>9g} {r['unit']:<6} ratio {r['ratio']:.2f}{by}{out}")
    elif isinstance(check, str):
        lines += ["", f"check: {check}"]
    if isinstance(fit, dict):
        lines += ["", "fit error against measurements: " + ", ".join(
            f"{k} {v['median_abs_rel_err']:.2%} median / {v['max_abs_rel_err']:.2%} max" for k, v in fit.items())]
    return "\n".join(lines)


def cmd_show(args: argparse.Namespace) -> int:
    print(format_show(load_table_profile(args.name)))
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from lmsim.profile.plot import plot_profile

    model = load_table_profile(args.name)
    out = args.out or Path(f"{model.name.replace('/', '-')}.png")
    check_output_file(out, overwrite=args.overwrite, ours=is_signed_figure)
    print(f"wrote {plot_profile(model, out)}")
    return 0


def cmd_fit(args: argparse.Namespace) -> int:
    from lmsim.profile.fit import fit_profile

    if getattr(args, "spec", None) is not None:
        from lmsim.profile.spec import base_from_spec

        base = TableCostModel(base_from_spec(args.spec))
    else:
        base = load_table_profile(args.base)
    name = args.name or f"{base.name}-fit"
    if getattr(args, "spec", None) is None and args.out.resolve() == Path(base.data.source).resolve().parent:
        raise ProfileError(f"{args.out}: --out must differ from the base profile's folder")
    check_profile_dir(args.out, overwrite=args.overwrite)
    data, report = fit_profile(base, args.measurements, name)
    write_profile(data, args.out)
    print(f"wrote {args.out / 'profile.yaml'}")
    print(f"{'':8}{'rows':>7}{'median':>9}{'p90':>9}{'max':>9}{'bias':>9}   |relative error| of step time")
    for label in ("base", "fitted"):
        s = report[label]
        print(f"{label:<8}{s['rows']:>7}{s['median_abs_rel_err']:>9.2%}{s['p90_abs_rel_err']:>9.2%}"
              f"{s['max_abs_rel_err']:>9.2%}{s['mean_rel_bias']:>+9.2%}")
    return 0


def _write_new_profile(data, out: Path) -> Path:
    """Write into a new (or empty) folder via a temporary sibling, so nothing else is touched
    and a crash leaves no half-written profile."""
    import os
    import shutil
    import tempfile

    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ProfileError(f"{out}: --out exists and is not an empty folder; choose a new one")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        write_profile(data, tmp)
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return out / "profile.yaml"


def cmd_import_vidur(args: argparse.Namespace) -> int:
    from lmsim.profile.vidur import import_vidur

    data = import_vidur(
        args.dir, model=args.model, device=args.device, network=args.network, tp=args.tp,
        layers=args.layers, block_size=args.block_size, max_tokens=args.max_tokens,
        memory_margin=args.memory_margin, name=args.name,
    )
    path = _write_new_profile(data, args.out)
    model = TableCostModel(data)
    util = data.meta["memory"]["reference_gpu_memory_utilization"]
    print(f"wrote {path}")
    print(f"KV pool at gpu_memory_utilization {util}: {model.num_kv_blocks(args.block_size, util):,} "
          f"blocks of {args.block_size} per instance")
    print(data.meta["provenance"]["rules"]["outside_data"])
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from lmsim.profile.tables import resolve_profile, validate_profile

    problems = validate_profile(args.name)
    for problem in problems:
        print(problem)
    if problems:
        return 2
    print(f"{resolve_profile(args.name)}: ok")
    return 0


# -- new, predict, check ----------------------------------------------------------------------
def build_new(model: str, gpu: str, tp: int = 1, name: str | None = None, engine: str | None = None):
    """The profile `lmsim profile new` writes, in memory, and the analytic model behind it."""
    import sys

    from lmsim.profile.hardware import load_engine, load_gpu, load_model

    if tp < 1:
        raise ProfileError(f"--tp: must be >= 1, got {tp}")
    gpu_spec = load_gpu(gpu)
    model_spec = load_model(model)
    engine_spec = load_engine(engine)
    analytic = AnalyticModel.build(gpu_spec, model_spec, tp, engine_spec)
    command = "lmsim profile new " + " ".join(sys.argv[3:]) if sys.argv[1:3] == ["profile", "new"] else (
        f"lmsim profile new --model {model} --gpu {gpu} --tp {tp}" + (f" --engine {engine}" if engine else ""))
    data = tabulate(analytic, generated_by=command)
    data.name = name or analytic.name
    data.meta["provenance"]["inputs"] = {
        "model": str(model), "model_config": model_spec.sources.get("config", ""),
        "gpu": str(gpu), "gpu_spec": gpu_spec.name, "tensor_parallel_size": tp, "engine": engine_spec.key,
    }
    return data, analytic


def cmd_new(args: argparse.Namespace) -> int:
    data, _ = build_new(args.model, args.gpu, args.tp, args.name, args.engine)
    path = _write_new_profile(data, args.out)
    model = TableCostModel(data)
    if not args.no_plot:
        from lmsim.profile.plot import plot_profile

        plot_profile(model, args.out / "plot.png")
    print(f"wrote {path}")
    print(f"KV pool at gpu_memory_utilization 0.9: {model.num_kv_blocks(16, 0.9):,} blocks of 16 "
          f"({data.meta['model']['kv_bytes_per_token']:,} B/token per GPU)")
    return 0


def load_or_build(name: str, engine: str | None = None) -> TableCostModel:
    """A shipped profile or a path; else a `<gpu>/<model>[-tpN]` name built as `profile new`
    would. With an engine other than the default (vLLM v1, what shipped profiles are built
    for) a `<gpu>/<model>[-tpN]` name is always built for that engine."""
    from lmsim.profile.hardware import load_engine
    from lmsim.profile.tables import resolve_profile

    other_engine = engine is not None and load_engine(engine).key != load_engine().key
    try:
        resolve_profile(name)
    except ProfileError as missing:
        not_found: ProfileError | None = missing
    else:
        not_found = None
        if not other_engine:
            return load_table_profile(name)
    try:
        gpu, model, tp = split_name(name, where=f"profile {name!r} (not shipped: built as <gpu>/<model>[-tpN])")
    except ProfileError as unbuildable:
        if not_found is not None:
            # A <gpu>/<model> name says which part is unknown; a path says it does not exist.
            raise (unbuildable if name.count("/") == 1 and not Path(name).exists() else not_found) from None
        raise ProfileError(f"--engine: {name!r} is a profile folder built for its own engine; "
                           "--engine applies to a <gpu>/<model>[-tpN] name") from None
    data, _ = build_new(model, gpu, tp, engine=engine)
    data.source = "<built by profile new>"
    return TableCostModel(data)


def predict_answer(model: TableCostModel, args: argparse.Namespace) -> dict:
    from lmsim.profile.analytic import decode_seconds

    for option in ("prefill", "decode_batch"):
        value = getattr(args, option)
        if value is not None and value < 1:
            raise ProfileError(f"--{option.replace('_', '-')}: must be >= 1, got {value}")
    if args.context < 0:
        raise ProfileError(f"--context: must be >= 0, got {args.context}")
    out: dict = {"profile": model.name, "source": model.data.source}
    if args.prefill is not None:
        chunks = [(args.prefill, args.context)]
        out.update(step="prefill", prefill_tokens=args.prefill, cached_context=args.context,
                   step_s=model.step_time(chunks, 0, 0), components=model.components(chunks, 0, 0),
                   outside_grid=model.outside_grid(chunks, 0, 0))
    elif args.decode_batch is not None:
        b, ctx = args.decode_batch, args.context
        out.update(step="decode", decode_batch=b, context=ctx, step_s=model.step_time((), b, b * ctx),
                   components=model.components((), b, b * ctx), outside_grid=model.outside_grid((), b, b * ctx))
    else:
        inp, outp = args.request
        if inp < 1 or outp < 1:
            raise ProfileError(f"--request: INPUT and OUTPUT must be >= 1, got {inp} {outp}")
        if args.budget < 1:
            raise ProfileError(f"--budget: must be >= 1, got {args.budget}")
        ttft = prefill_seconds(model, inp, 0, args.budget)
        decode = decode_seconds(model, inp, outp)
        out.update(step="request", input_tokens=inp, output_tokens=outp, budget=args.budget,
                   prefill_steps=-(-inp // args.budget), decode_steps=outp - 1, ttft_s=ttft,
                   tpot_mean_s=decode / (outp - 1) if outp > 1 else None, e2e_s=ttft + decode)
    return out


def cmd_predict(args: argparse.Namespace) -> int:
    import json

    print(json.dumps(predict_answer(load_or_build(args.name, args.engine), args), indent=2))
    return 0


def _profile_key(name: str) -> tuple[str, str, int, TableCostModel]:
    model = load_table_profile(name)
    try:
        gpu, model_key, tp = split_name(model.name, where=f"{model.data.source}: name")
    except ProfileError as exc:
        raise ProfileError(f"{exc}; `profile check` needs a <gpu>/<model>[-tpN] profile name") from None
    from lmsim.profile.hardware import load_model

    return gpu, load_model(model_key).key, tp, model


def run_check(names: list[str], table: Path | None = None):
    """Predictions for the table's rows (all, or those the named profiles can answer) and
    their summary."""
    from lmsim.profile.measurements import Checker, read_measurements, rows_for_profile, summarise

    rows = read_measurements(table)
    if not names:
        checker = Checker()
        preds = [checker.predict(r) for r in rows]
    else:
        preds, seen = [], set()
        for name in names:
            gpu, model, tp, table_model = _profile_key(name)
            checker = Checker({(gpu, model, tp): (table_model, table_model.name)})
            for r in rows_for_profile(rows, gpu, model, tp, checker):
                if r.id not in seen:
                    seen.add(r.id)
                    preds.append(checker.predict(r))
    return preds, summarise(preds)


def _summary_line(label: str, s: dict) -> str:
    if not s["answered"]:
        return f"{label}: {s['rows']} rows, none answered"
    return (f"{label}: {s['answered']} rows, {s['within_10pct']} within 10% ({s['share_within_10pct']:.0%}), "
            f"{s['beyond_25pct']} beyond 25%, worst ratio {s['worst_ratio']:.3f} ({s['worst_id']})")


def _row_line(p) -> str:
    r = p.row
    pred = "-" if p.predicted is None else f"{p.predicted:.4g}"
    ratio = "-" if p.ratio is None else f"{p.ratio:.3f}"
    flag = "" if p.ratio is None or abs(p.ratio - 1) <= 0.10 else (" *" if abs(p.ratio - 1) <= 0.25 else " **")
    return (f"{r.id[:51]:<52}{r.split:<6}{r.kind:<25}{r.engine[:21]:<22}{r.measured:>11.4g}{pred:>11} "
            f"{r.unit:<6}{ratio:>7}{flag:<3} {p.profile}{' (' + p.note + ')' if p.note else ''}")


def cmd_check(args: argparse.Namespace) -> int:
    import json

    preds, summary = run_check(args.profiles, args.measurements)
    if args.json:
        print(json.dumps({
            "rows": [{"id": p.row.id, "split": p.row.split, "scope": p.row.scope or "in", "gpu": p.row.gpu,
                      "model": p.row.model, "tp": p.row.tp, "engine": p.row.engine, "kind": p.row.kind,
                      "condition": p.row.condition, "source": p.row.source, "measured": p.row.measured,
                      "unit": p.row.unit, "predicted": p.predicted, "ratio": p.ratio, "priced_by": p.profile,
                      "note": p.note}
                     for p in preds],
            "summary": summary,
        }, indent=1))
        return 0
    print(f"{'id':<52}{'split':<6}{'kind':<25}{'engine':<22}{'measured':>11}{'predicted':>11} "
          f"{'unit':<6}{'ratio':>7}  priced by")
    for p in preds:
        if p.row.in_scope:
            print(_row_line(p))
    outside = [p for p in preds if not p.row.in_scope]
    if outside and args.all:
        print()
        print("out of scope (predicted, not held to the bar):")
        for p in outside:
            print(_row_line(p))
            print(f"    {p.row.scope}")
    print()
    print("* outside 10%, ** outside 25%")
    print(_summary_line("all", summary["all"]))
    print(_summary_line("in scope", summary["in_scope"]))
    for label in ("fit", "check"):
        print("  " + _summary_line(label, summary[label]))
    for gpu, block in summary["long_context"].items():
        print("  " + _summary_line(f"{gpu} long-context end to end (prompt >= 30k)", block))
    if outside:
        reasons: dict[str, int] = {}
        for p in outside:
            reasons[p.row.scope_reason.split(":")[0]] = reasons.get(p.row.scope_reason.split(":")[0], 0) + 1
        listed = "" if args.all else " (listed with --all)"
        print(f"out of scope: {len(outside)} rows{listed}: "
              + "; ".join(f"{n} {reason}" for reason, n in reasons.items()))
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    import json

    from lmsim.profile.calibrate import (
        GPUS,
        calibrate_all,
        efficiency_mapping,
        write_engine_constants,
        write_gpu_efficiency,
    )
    from lmsim.profile.hardware import GPUS_DIR
    from lmsim.profile.measurements import read_measurements

    only = args.only.split(",") if getattr(args, "only", None) else None
    unknown = [g for g in only or () if g not in GPUS]
    if unknown:
        raise ProfileError(f"--only: unknown GPU {unknown[0]!r} (known: {', '.join(GPUS)})")
    if args.write:
        check_source_checkout(GPUS_DIR, "profile calibrate --write")
    result = calibrate_all(read_measurements(args.measurements), smooth=args.form == "smooth",
                           kv_table=getattr(args, "kv_table", False))
    out = {gpu: {"efficiency": efficiency_mapping(eff), "calibration": result["record"][gpu]}
           for gpu, eff in result["efficiency"].items()}
    out["engines"] = {k: {n: float(f"{v:.4g}") for n, v in vals.items()} for k, vals in result["engines"].items()}
    print(json.dumps(out, indent=1))
    if args.write:
        import datetime

        table = " --kv-table" if getattr(args, "kv_table", False) else ""
        note = (f"lmsim profile calibrate --form {args.form}{table} --write, "
                f"{datetime.date.today().isoformat()}: fit split of the measurement table only")
        for gpu in only or list(result["efficiency"]):
            print(f"wrote {write_gpu_efficiency(gpu, result['efficiency'][gpu], result['record'][gpu], note)}")
        print(f"wrote {write_engine_constants(result['engines'])}")
    return 0
