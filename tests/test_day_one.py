"""The snags a new user met on day one (issue 35), each pinned: what a plug-in without a
docstring is described as, the lists of models, GPUs and engines, the experiment list without
internal or empty entries, a sweep that leaves no lock file, says nothing false about a named
--out and draws no progress bar into a pipe, a `load:` on a P/D cluster naming whose capacity
it is, and a warning for a model config field the cost model ignores."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _lmsim(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "XDG_CACHE_HOME": str(cwd / "cache"), "COLUMNS": "100"}
    return subprocess.run([sys.executable, "-m", "lmsim", *args], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=600)  # fmt: skip


def test_a_plugin_without_a_docstring_is_not_described_by_the_base_class(tmp_path: Path) -> None:
    (tmp_path / "bare.py").write_text(
        "from lmsim.policies.base import POLICIES, Policy\n\n"
        "@POLICIES.register('bare')\nclass Bare(Policy):\n"
        "    def choose(self, request, cluster):\n        return 0\n")
    proc = _lmsim("--plugin", "bare", "policies", "bare", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "(no description)" in proc.stdout
    assert "Base class" not in proc.stdout
    listing = _lmsim("--plugin", "bare", "list", "policies", cwd=tmp_path).stdout
    assert "Base class" not in listing


@pytest.mark.parametrize(("what", "expected"), [
    ("models", ["qwen3-30b-a3b", "30.5B parameters, 48 layers, 128 experts (8 a token)", "llama-3-8b"]),
    ("gpus", ["h20", "NVIDIA H20 96GB: 148 TFLOPS BF16, 4.00 TB/s, 96 GB", "h100"]),
    ("engines", ["vllm-0.11", "vllm-0.33", "async_scheduling=True", "vllm-v1", "sglang-0.4"]),
])
def test_list_models_gpus_and_engines(tmp_path: Path, what: str, expected: list[str]) -> None:
    proc = _lmsim("list", what, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    for text in expected:
        assert text in proc.stdout, (text, proc.stdout)
    assert "kernel" not in proc.stdout  # kernel-timing setups are measurement contexts, not engines


def test_list_experiments_has_no_internal_or_empty_entries(tmp_path: Path) -> None:
    proc = _lmsim("list", "experiments", cwd=tmp_path)
    names = [line.split()[0] for line in proc.stdout.splitlines() if line and not line[0].isspace()
             and not line.startswith("(")]  # fmt: skip
    assert "quickstart" in names and not any(n.startswith("bench/") for n in names)
    bare = [line for line in proc.stdout.splitlines() if line and not line[0].isspace() and len(line.split()) == 1]
    assert not bare, bare


def test_a_sweep_leaves_no_lock_says_nothing_false_and_draws_no_bar_into_a_pipe(tmp_path: Path) -> None:
    proc = _lmsim("sweep", "quickstart", "--set", "sweep={router.policy: [vllm, round_robin]}",
                  "--set", "workload.limit=20", "--set", "output.figures=false", "--out", "mine", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "mine" / ".sweep.lock").exists()
    assert "holds another configuration" not in proc.stdout  # nothing was at runs/quickstart
    assert "%|" not in proc.stderr and "run/s" not in proc.stderr  # stderr is a pipe here


def test_load_on_a_disaggregated_cluster_names_whose_capacity(tmp_path: Path) -> None:
    (tmp_path / "pd.yaml").write_text(
        "name: pd\nworkload:\n  generator: {name: chatbot, params: {num_requests: 200}}\n  load: 0.5\n"
        "cluster:\n  profile: h20/qwen3-30b-a3b\n  pools:\n"
        "    - {name: prefill, role: prefill, num_instances: 2}\n    - {name: decode, role: decode, num_instances: 2}\n"
        "router:\n  policy: pd\n")
    proc = _lmsim("validate", "pd.yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "capacity of this disaggregated cluster" in proc.stdout
    assert "under pd (vllm on the prefill and on the decode instances)" in proc.stdout


def test_a_sliding_window_the_cost_model_ignores_is_named() -> None:
    from lmsim.profile.hardware import ModelConfigWarning, model_from_config

    mistral = {"architectures": ["MistralForCausalLM"], "num_hidden_layers": 32, "hidden_size": 4096,
               "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
               "vocab_size": 32000, "max_position_embeddings": 32768, "sliding_window": 4096}
    with pytest.warns(ModelConfigWarning, match=r"config.json: field 'sliding_window' \(4096\) is ignored"):
        model_from_config(mistral, "config.json", key="m", name="m", source="s")
    # Qwen2 carries the field switched off, and a window as wide as the context changes nothing
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model_from_config({**mistral, "sliding_window": 131072, "use_sliding_window": False}, "c", key="m", name="m", source="s")
        model_from_config({**mistral, "sliding_window": 32768}, "c", key="m", name="m", source="s")
