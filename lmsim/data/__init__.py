"""Data that ships inside the package: cost profiles, the sample trace, the bundled
experiments and their measured capacities (`experiments/capacity.json`).

Found through `importlib.resources`, so a wheel install (`pip install .`) and a source
checkout (`pip install -e .`, where `profiles/`, `traces/` and `experiments/` at the
repository root point here) see the same files. Nothing writes here except the developer
command `lmsim capacity --bundle`, from a source checkout.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

DATA_DIR = Path(str(files("lmsim.data")))
PROFILES_DIR = DATA_DIR / "profiles"
TRACES_DIR = DATA_DIR / "traces"
EXPERIMENTS_DIR = DATA_DIR / "experiments"
BUNDLED_CAPACITIES = EXPERIMENTS_DIR / "capacity.json"


def bundled_experiment(name: str) -> Path | None:
    """The bundled experiment a bare name means (`quickstart`, `traces/coder`,
    `paper/fig11`, with or without `.yaml`), or None."""
    stem = name[:-5] if name.endswith(".yaml") else name
    stem = stem.removeprefix("experiments/")
    candidate = EXPERIMENTS_DIR / f"{stem}.yaml"
    return candidate if candidate.is_file() else None


def bundled_experiment_names() -> list[str]:
    return sorted(
        str(p.relative_to(EXPERIMENTS_DIR).with_suffix(""))
        for p in EXPERIMENTS_DIR.rglob("*.yaml")
    )
