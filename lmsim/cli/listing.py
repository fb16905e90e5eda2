"""`lmsim list ...` and `lmsim policies [NAME]`: what ships with lmsim (bundled experiments,
profiles and traces; registered policies and generators), so an installed user can see the
names every command accepts in place of a path."""

from __future__ import annotations

import argparse
import dataclasses
import re
import shutil
import textwrap
from typing import Any

from lmsim.cli.options import command_help

KINDS = ("experiments", "profiles", "traces", "policies", "autoscalers", "generators", "models", "gpus", "prices",
         "engines")


def register_cli(subparsers: Any) -> None:
    lst = subparsers.add_parser("list", help=command_help("list"))
    lst.add_argument("what", choices=KINDS, help="which names to list")
    lst.set_defaults(func=cmd_list)

    pol = subparsers.add_parser("policies", help=command_help("policies"))
    pol.add_argument("name", nargs="?", help="print this policy's whole description")
    pol.set_defaults(func=cmd_policies)


# -- descriptions ------------------------------------------------------------------------

_DOCUMENT = re.compile(r"[\w./-]+\.(?:md|txt)\b")
_PARENTHETICAL = re.compile(r"\s*\(([^()]*)\)")
# A sentence ends at . ! or ? followed by a space and a capital, a backquote or a bracket.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`(\"])")


def document_exists(name: str) -> bool:
    """A cited document is in the repository (a source checkout) or ships in lmsim/data."""
    from lmsim.shipped import DATA_DIR

    return any((base / name).is_file() for base in (DATA_DIR, DATA_DIR.parent.parent))


def cite_only_shipped_documents(text: str) -> str:
    """Drop a parenthetical reference to a document the user does not have (the specs
    under ../shared/docs that docstrings cite for developers), so what the CLI prints
    only points at files that exist."""

    def keep(match: re.Match[str]) -> str:
        cited = _DOCUMENT.findall(match.group(1))
        return "" if cited and not all(document_exists(d) for d in cited) else match.group(0)

    return _PARENTHETICAL.sub(keep, text)


def first_paragraph(doc: str) -> str:
    """A docstring's first paragraph on one line: its summary, whole sentences only."""
    paragraph = " ".join(doc.strip().split("\n\n")[0].split())
    return cite_only_shipped_documents(paragraph)


def first_sentence(text: str) -> str:
    """The first sentence of a one-line text (a trailing "Parameters:" and the like,
    which introduce what follows, are not a sentence of their own)."""
    sentences = _SENTENCE_END.split(" ".join(text.split()))
    return sentences[0] if sentences else ""


def _print_entries(entries: list[tuple[str, str]], name_width: int | None = None) -> None:
    """Name, then its text wrapped to the terminal beside it (never cut)."""
    name_width = name_width or max((len(name) for name, _ in entries), default=0) + 2
    width = max(shutil.get_terminal_size((100, 24)).columns, 60)
    for name, text in entries:
        lines = textwrap.wrap(text, width=max(width - name_width, 30)) or [""]
        print(f"{name:{name_width}}{lines[0]}")
        for line in lines[1:]:
            print(f"{'':{name_width}}{line}")


# -- list --------------------------------------------------------------------------------


def cmd_list(args: argparse.Namespace) -> int:
    {"experiments": _list_experiments, "profiles": _list_profiles, "traces": _list_traces,
     "policies": _list_policies, "autoscalers": _list_autoscalers, "generators": _list_generators, "models": _list_models,
     "gpus": _list_gpus, "prices": _list_prices, "engines": _list_engines}[args.what]()  # fmt: skip
    return 0


# Bundled experiments that only a command runs (`lmsim bench`), not a user.
INTERNAL_EXPERIMENTS = ("bench/",)


def _list_experiments() -> None:
    import yaml

    from lmsim.shipped import EXPERIMENTS_DIR, bundled_experiment_names

    entries = []
    for name in bundled_experiment_names():
        if name.startswith(INTERNAL_EXPERIMENTS):
            continue
        try:
            raw = yaml.safe_load((EXPERIMENTS_DIR / f"{name}.yaml").read_text()) or {}
        except (OSError, yaml.YAMLError):
            raw = {}
        what = "sweep: " if raw.get("sweep") or raw.get("seeds") else ""
        entries.append((name, what + first_sentence(str(raw.get("description") or ""))))
    _print_entries(entries)
    print("(`lmsim run NAME` runs one from any directory; `lmsim sweep NAME` a sweep)")


def _list_profiles() -> None:
    import yaml

    from lmsim.profile.tables import _known_profiles
    from lmsim.shipped import PROFILES_DIR

    entries = []
    for name in _known_profiles():
        try:
            facts = yaml.safe_load((PROFILES_DIR / name / "profile.yaml").read_text()) or {}
        except (OSError, yaml.YAMLError):
            facts = {}
        model = (facts.get("model") or {}).get("name", "?")
        gpu = (facts.get("hardware") or {}).get("gpu", "?")
        entries.append((name, f"{model} on {gpu}"))
    _print_entries(entries)
    print("(`cluster.profile: NAME`; `lmsim profile show NAME` prints one)")


def _list_traces() -> None:
    import pyarrow.parquet as pq

    from lmsim.shipped import TRACES_DIR

    _print_entries([(path.stem, f"{pq.ParquetFile(path).metadata.num_rows:,} requests ({path.name})")
                    for path in sorted(TRACES_DIR.glob("*.parquet"))])  # fmt: skip
    print("(`workload.trace: NAME` or `lmsim trace stats NAME`; the format: traces/README.md)")


def _list_policies() -> None:
    from lmsim.policies import POLICIES

    _print_entries([(name, first_paragraph(own_doc(POLICIES.get(name)) or "(no description)")) for name in POLICIES.names()])
    print("(`lmsim policies` adds their parameters; `lmsim policies NAME` prints one in full)")


def _list_autoscalers() -> None:
    import inspect

    from lmsim.autoscalers import AUTOSCALERS

    width = max(len(name) for name in AUTOSCALERS.names()) + 2
    for name in AUTOSCALERS.names():
        cls = AUTOSCALERS.get(name)
        _print_entries([(name, first_paragraph(own_doc(cls) or "(no description)"))], width)
        params = AUTOSCALERS.parameters(name)
        shown = ", ".join(
            f"{key}={q.default!r}" if q.default is not inspect.Parameter.empty else key for key, q in params.items()
        )
        print(f"{' ' * width}params: {shown or '(none)'}")
    print("(`autoscaler: {name: NAME, interval_s: ..., params: {...}}` with a `fleet:` section)")


def _list_generators() -> None:
    import inspect

    from lmsim.workload.generators import GENERATORS

    _print_entries([(name, first_sentence(first_paragraph(inspect.getdoc(GENERATORS.get(name)) or "")))
                    for name in GENERATORS.names()])  # fmt: skip
    print("(`workload.generator: {name: NAME, params: {...}}` or `lmsim trace generate NAME`)")


# -- policies ----------------------------------------------------------------------------


def cmd_policies(args: argparse.Namespace) -> int:

    from lmsim.policies import POLICIES

    if args.name is not None:
        cls = POLICIES.get(args.name, where="lmsim policies")
        print(args.name)
        print(cite_only_shipped_documents(own_doc(cls) or "(no description)"))
        print()
        _print_parameters(args.name, cls)
        return 0
    width = max(len(name) for name in POLICIES.names()) + 2
    for name in POLICIES.names():
        cls = POLICIES.get(name)
        role = "[P/D] " if getattr(cls, "disaggregated", False) else ""  # routes prefill + decode pools
        _print_entries([(name, role + first_paragraph(own_doc(cls) or "(no description)"))], width)
        _print_parameters(name, cls, indent=width)
    return 0


def own_doc(cls: type) -> str | None:
    """The class's own docstring: a plug-in without one is not described by its base class's
    text (`inspect.getdoc` inherits it)."""
    import inspect

    doc = cls.__dict__.get("__doc__")
    return inspect.cleandoc(doc) if doc else None


def _print_parameters(name: str, cls: type, indent: int = 0) -> None:
    import inspect

    from lmsim.policies import POLICIES

    params = POLICIES.parameters(name)
    shown = ", ".join(
        f"{key}={p.default!r}" if p.default is not inspect.Parameter.empty else key for key, p in params.items()
    )
    pad = " " * indent
    print(f"{pad}params: {shown or '(none)'}")
    for key, why in getattr(cls, "default_reasons", {}).items():
        default = params[key].default if key in params else "?"
        print(f"{pad}default {key}={default!r}: {why}")


def _list_models() -> None:
    from lmsim.profile.hardware import count_parameters, load_model, shipped_models

    entries = []
    for key, entry in shipped_models().items():
        model = load_model(key)
        aliases = ", ".join(str(a) for a in entry.get("aliases") or ())
        shape = f"{count_parameters(model) / 1e9:.1f}B parameters, {model.layers} layers"
        if model.experts:
            shape += f", {model.experts} experts ({model.experts_per_token} a token)"
        entries.append((key, shape + (f" (also: {aliases})" if aliases else "")))
    _print_entries(entries)
    print("(`lmsim profile new --model NAME --gpu GPU` builds a profile; any Hugging Face config.json works too)")


def _list_gpus() -> None:
    from lmsim.profile.hardware import load_gpu, shipped_gpus

    entries = []
    for key in shipped_gpus():
        gpu = load_gpu(key)
        entries.append((key, f"{gpu.name}: {gpu.peak_bf16_flops / 1e12:,.0f} TFLOPS BF16, "
                             f"{gpu.hbm_bandwidth_bytes_s / 1e12:.2f} TB/s, {gpu.memory_gb_nominal:g} GB"))
    _print_entries(entries)
    print("(`lmsim profile new --gpu NAME`, or your own spec YAML with the same fields)")


def _list_prices() -> None:
    from lmsim.shipped import shipped_gpu_prices

    _print_entries([(key, f"${float(e['usd_per_gpu_hour']):.2f} per GPU-hour, {e['basis']}: {e['provider']}, "
                          f"{e['product']} ({e['date']}; {e['url']})")
                    for key, e in sorted(shipped_gpu_prices().items())])  # fmt: skip
    print("(`cost.gpu_price_per_hour: {h20: 1.2}` in an experiment overrides; sources: lmsim/data/hardware/gpu_prices.yaml)")


def _list_engines() -> None:
    from lmsim.config import DEFAULT_ENGINE, ENGINE_PRESETS
    from lmsim.profile.hardware import load_engines

    print("engine releases a cluster schedules as (cluster.engine):")
    _print_entries([(key, ", ".join(f"{k}={v}" for k, v in dataclasses.asdict(preset).items())
                     + (" (default)" if key == DEFAULT_ENGINE else ""))
                    for key, preset in ENGINE_PRESETS.items()])  # fmt: skip
    table = load_engines()
    print("serving engines a profile is priced for (lmsim profile new --engine):")
    _print_entries([(key, spec.name + (" (default)" if key == table.default else ""))
                    for key, spec in table.engines.items() if not key.endswith("-kernel")])  # fmt: skip
