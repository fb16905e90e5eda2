"""`lmsim profile ...`: generate, show, plot and fit step-cost profiles."""

from __future__ import annotations

import argparse
from pathlib import Path

from lmsim.cli.options import add_overwrite_option, command_help
from lmsim.data import PROFILES_DIR, check_source_checkout
from lmsim.errors import ProfileError
from lmsim.outputs import check_output_file, is_signed_figure
from lmsim.profile.analytic import (
    DATA_POINTS,
    SHIPPED,
    AnalyticModel,
    decode_step_seconds,
    evaluate_point,
    fit_report,
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
    prov = data.meta["provenance"]
    rows = fit_report(table, name)
    if rows:
        prov["fit_error"] = rows
    else:
        prov["fit_error"] = "none: costmodel.md section 5 has no public data point for this GPU and model"
    if name == "h20/qwen2-7b":
        # No public H20 Qwen2-7B numbers exist; its dense path shares the constants that
        # section 5 rows 1-4 calibrate on the Qwen3 dense models.
        prov["fit_error_shared_constants"] = [
            {"row": p.row, "what": p.what, "unit": p.unit, "measured": p.measured,
             "model": round(v, 4), "ratio": round(v / p.measured, 3)}
            for p in DATA_POINTS if p.kind == "tpot_b1" and p.model != "h20/qwen3-30b-a3b"
            for v in [float(evaluate_point(p, TableCostModel(tabulate(AnalyticModel.named(p.model)))))]
        ]
    out_dir = out_root / name
    write_profile(data, out_dir)
    if plot:
        from lmsim.profile.plot import plot_profile

        plot_profile(table, out_dir / "plot.png")
    return out_dir


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
    fit = prov.get("fit_error")
    shared = prov.get("fit_error_shared_constants") or []
    if shared:
        lines += ["", "shared-constant calibration (other models, same constants; section 5)"]
    for r in shared:
        lines.append(f"  row {r['row']:<9}{r['what'][:58]:<60}measured {r['measured']:>9g} "
                     f"model {r['model']:>9g} {r['unit']:<9} ratio {r['ratio']:.2f}")
    if isinstance(fit, list) and fit:
        lines += ["", "fit against public data points (costmodel.md section 5)"]
        for r in fit:
            lines.append(f"  row {r['row']:<9}{r['what'][:58]:<60}measured {r['measured']:>9g} "
                         f"model {r['model']:>9g} {r['unit']:<9} ratio {r['ratio']:.2f}")
    elif isinstance(fit, str):
        lines += ["", f"fit: {fit}"]
    elif isinstance(fit, dict):
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
