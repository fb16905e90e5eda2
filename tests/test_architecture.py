"""The package's layering, read from its source: every import statement counts, including
imports inside functions and under `if TYPE_CHECKING:`, because a lazy import is still a
dependency (it only moves the failure to run time).

Layers (README, "Layout"): `engine/` runs one simulation; `policies/` choose instances
through the view protocol; `profile/` prices steps; `workload/` makes and reads traces;
`study/` turns experiments into runs, sweeps and capacities; `viz/` draws saved results;
`cli/` parses arguments. `config`, `errors` and `registry` are the shared foundation."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "lmsim"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE_DIR.rglob("*.py"))}


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The lmsim module an imported dotted name lands in (a submodule, else its package)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(module: str) -> set[str]:
    """Every lmsim module `module` imports, by any import statement anywhere in its body."""
    path = MODULES[module]
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            # `from pkg import sub` imports the submodule when there is one
            names = [f"{prefix}.{a.name}" for a in node.names] + [prefix]
        for name in names:
            if name == "lmsim" or name.startswith("lmsim."):
                target = _resolve(name)
                if target and target != module:
                    found.add(target)
    return found


GRAPH = {m: imports_of(m) for m in MODULES}


def _third_party(module: str) -> set[str]:
    path = MODULES[module]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
    return out


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "lmsim"


def test_the_reader_finds_lazy_and_relative_imports():
    # A hand-checkable case: simulation imports invariants only inside a method.
    assert "lmsim.engine.invariants" in GRAPH["lmsim.engine.simulation"]
    assert "lmsim.engine.request" in GRAPH["lmsim.policies._common"]
    assert len(MODULES) > 40


def test_no_import_cycles():
    seen: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(m: str) -> None:
        seen[m] = 1
        stack.append(m)
        for n in sorted(GRAPH[m]):
            if seen.get(n) == 1:
                cycle = [*stack[stack.index(n):], n]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if n not in seen:
                visit(n)
        stack.pop()
        seen[m] = 2

    for m in sorted(GRAPH):
        if m not in seen:
            visit(m)


def _violations(layer: str, forbidden: set[str]) -> list[str]:
    return sorted(
        f"{m} imports {n}"
        for m in GRAPH if _layer(m) == layer
        for n in GRAPH[m] if _layer(n) in forbidden
    )  # fmt: skip


def test_engine_imports_no_study_viz_or_cli():
    assert _violations("engine", {"study", "viz", "cli"}) == []


def test_engine_knows_policies_only_through_the_routing_contract():
    """The engine is handed a policy object (lmsim.study.compose creates it from the registry)
    and reads the contract in lmsim.routing; it never imports the policies package."""
    assert _violations("engine", {"policies"}) == []
    assert "lmsim.routing" in GRAPH["lmsim.engine.router"]


def test_engine_knows_autoscalers_only_through_the_scaling_contract():
    """The engine is handed an autoscaler object (lmsim.study.compose creates it from the
    registry) and reads the contract in lmsim.scaling; it never imports the autoscalers."""
    assert _violations("engine", {"autoscalers"}) == []
    assert "lmsim.scaling" in GRAPH["lmsim.engine.fleet"]
    assert not [m for m in GRAPH["lmsim.scaling"] if _layer(m) in ("engine", "autoscalers")]


def test_the_routing_contract_sits_below_engine_and_policies():
    assert GRAPH["lmsim.routing"] == set()
    assert "lmsim.routing" in GRAPH["lmsim.policies.base"]


def test_data_folders_hold_data_not_code():
    """Analysis code lives in the package's modules; lmsim/data/ ships YAML, CSV, Parquet,
    Markdown, shell recipes and figures only."""
    code = sorted(str(p.relative_to(PACKAGE_DIR)) for p in (PACKAGE_DIR / "data").rglob("*.py"))
    assert code == []


def test_simpy_is_imported_only_by_the_engine():
    users = sorted(m for m in MODULES if "simpy" in _third_party(m))
    assert users and all(_layer(m) == "engine" for m in users), users


def test_policies_see_the_engine_only_through_the_request_and_the_view_protocol():
    allowed = {"lmsim.engine.request"}
    bad = sorted(
        f"{m} imports {n}"
        for m in GRAPH if _layer(m) == "policies"
        for n in GRAPH[m] if _layer(n) == "engine" and n not in allowed
    )  # fmt: skip
    assert bad == []
    assert _violations("policies", {"study", "viz", "cli", "workload"}) == []


def test_workload_imports_no_engine_policies_study_or_viz():
    assert _violations("workload", {"engine", "policies", "study", "viz", "cli"}) == []


def test_viz_draws_saved_results_without_the_engine():
    assert _violations("viz", {"engine", "cli"}) == []


def test_foundation_modules_import_no_layer():
    for m in ("lmsim.errors", "lmsim.registry"):
        assert GRAPH[m] <= {"lmsim.errors"}, (m, GRAPH[m])
