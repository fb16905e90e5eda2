"""Titles in words, from a run's flattened config (`workload.load` -> "load 50% of
capacity"): what figures, reports and a run's own CDF call a trace, a model and a load."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

TRACE_NAMES = {"chatbot": "ChatBot", "coder": "Coder", "agent": "Agent", "toolagent": "ToolAgent",
               "hotspot": "Hotspot", "conversation": "Conversation"}  # fmt: skip


def model_words(profile: Any) -> str:
    """'h20/qwen3-30b-a3b' -> 'Qwen3-30B-A3B on H20'."""
    if isinstance(profile, str) and "/" in profile:
        gpu, model = profile.split("/", 1)
        model = "-".join(p.upper() if re.fullmatch(r"[a-z]?\d+(\.\d+)?[bm]", p) else p for p in model.split("-"))
        model = re.sub(r"^qwen", "Qwen", re.sub(r"^llama", "Llama", model))
        return f"{model} on {gpu.upper()}"
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
