"""Titles in words, from a run's flattened config (`workload.load` -> "load 50% of
capacity"): what figures, reports and a run's own CDF call a trace, a model, a load and a
policy variant that has a name of its own (llm-d as deployed vs its oracle)."""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmsim.policies import POLICIES
from lmsim.policies.predictive import DEPLOYED_NOISE_REL
from lmsim.shipped import DATA_DIR, PROFILES_DIR

_GPU_DIR = DATA_DIR / "hardware" / "gpus"
TRACE_NAMES = {"chatbot": "ChatBot", "coder": "Coder", "agent": "Agent", "toolagent": "ToolAgent",
               "hotspot": "Hotspot", "conversation": "Conversation"}  # fmt: skip


def _model_name(model: str) -> str:
    """'qwen3-30b-a3b' -> 'Qwen3-30B-A3B'."""
    model = "-".join(p.upper() if re.fullmatch(r"[a-z]?\d+(\.\d+)?[bm]", p) else p for p in model.split("-"))
    return re.sub(r"^qwen", "Qwen", re.sub(r"^llama", "Llama", model))


_PROFILE_NAME = re.compile(r"[A-Za-z0-9_.+-]+/[A-Za-z0-9_.+-]+")


def _is_path(profile: str) -> bool:
    """A profile given by path (a folder, or its profile.yaml), not by the `gpu/model` name
    of a bundled one."""
    if _PROFILE_NAME.fullmatch(profile) and (PROFILES_DIR / profile / "profile.yaml").is_file():
        return False
    return Path(profile).expanduser().exists() or not _PROFILE_NAME.fullmatch(profile) or profile.endswith(
        (".yaml", ".yml")
    )


def _profile_words(path: str) -> str:
    """What the profile at `path` records: its `name` (`gpu/model`), else its hardware.gpu
    and model.name; when the file cannot be read (the results moved to another machine), the
    folder's last two names if they read as gpu/model, else "profile <folder>"."""
    import yaml

    folder = Path(path).expanduser()
    if folder.suffix in (".yaml", ".yml"):
        folder = folder.parent
    try:
        raw = yaml.safe_load((folder / "profile.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        raw = {}
    if isinstance(raw, dict):
        name = raw.get("name")
        if isinstance(name, str) and _PROFILE_NAME.fullmatch(name):
            return model_words(name)
        gpu = (raw.get("hardware") or {}).get("gpu") if isinstance(raw.get("hardware"), dict) else None
        model = (raw.get("model") or {}).get("name") if isinstance(raw.get("model"), dict) else None
        if gpu and model:
            return f"{_model_name(str(model))} on {gpu}"
    if folder.parent.name and (_GPU_DIR / f"{folder.parent.name.lower()}.yaml").exists():
        return model_words(f"{folder.parent.name}/{folder.name}")
    return f"profile {folder.name or path}"


def model_words(profile: Any) -> str:
    """'h20/qwen3-30b-a3b' -> 'Qwen3-30B-A3B on H20'. A profile given by path is named by
    the GPU and model it records (_profile_words), never by the folder it sits in (a path
    used to read as 'myprofiles/custom' -> 'custom on MYPROFILES')."""
    if isinstance(profile, str) and _is_path(profile):
        return _profile_words(profile)
    if isinstance(profile, str) and "/" in profile:
        gpu, model = profile.split("/", 1)
        return f"{_model_name(model)} on {gpu.upper()}"
    return str(profile)


def trace_words(config: dict[str, Any]) -> str:
    name = config.get("workload.generator.name")
    if name:
        return TRACE_NAMES.get(str(name), str(name))
    trace = config.get("workload.trace")
    return Path(str(trace)).stem if trace else "workload"


def load_words(config: dict[str, Any]) -> str | None:
    if config.get("workload.load") is not None:
        return f"load {100 * float(config['workload.load']):.0f}% of capacity"
    if config.get("workload.rate") is not None:
        return f"{float(config['workload.rate']):g} req/s"
    if config.get("workload.time_scale") is not None:
        return f"time scale ×{float(config['workload.time_scale']):g}"
    return None


@dataclass(frozen=True)
class NamedVariant:
    """A policy configured as the study means something by: `name` labels the runs whose
    router params equal `params` (an unset param counts as the policy's default)."""

    name: str
    params: dict[str, Any]


# llm-d's exact estimator replays lmsim's own engine, which no deployment has (issue 27): its
# figures say so, and name the Figure 16 error "deployed". Other estimator settings (the
# untuned profile of Figure 15, other noise levels) keep the policy name and their params.
_LLMD_EXACT = {"estimator_profile": None, "in_flight_step": True}
NAMED_VARIANTS: dict[str, tuple[NamedVariant, ...]] = {
    "llmd": (
        NamedVariant("llm-d (oracle)", {**_LLMD_EXACT, "noise_rel": 0.0}),
        NamedVariant("llm-d (deployed)", {**_LLMD_EXACT, "noise_rel": DEPLOYED_NOISE_REL}),
    ),
}
ROUTER_PARAMS = "router.params."


def _default(policy: str, param: str) -> Any:
    parameter = POLICIES.parameters(policy).get(param)
    return None if parameter is None or parameter.default is inspect.Parameter.empty else parameter.default


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return float(a) == float(b)
    return a == b


def policy_words(policy: str, config: dict[str, Any]) -> tuple[str, set[str]]:
    """(name, keys): what a figure or table calls this run's policy, and the config keys
    that name already says (left out of the label). A named variant of the policy
    (`NAMED_VARIANTS`) by its name; any other run by the registered policy name."""
    for variant in NAMED_VARIANTS.get(policy, ()):
        values = {p: config.get(ROUTER_PARAMS + p, _default(policy, p)) for p in variant.params}
        if all(_same(values[p], v) for p, v in variant.params.items()):
            return variant.name, {ROUTER_PARAMS + p for p in variant.params}
    return policy, set()
