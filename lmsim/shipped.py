"""Where the data that ships inside the package is (lmsim/data/, which holds data only): cost profiles, the sample trace, the bundled
experiments and their measured capacities (`experiments/capacity.json`).

Found through `importlib.resources`, so a wheel install (`pip install .`) and a source
checkout (`pip install -e .`, where `profiles/`, `traces/` and `experiments/` at the
repository root point here) see the same files. Nothing writes here except the developer
command `lmsim capacity --bundle`, from a source checkout.
"""

from __future__ import annotations

from functools import lru_cache
from importlib.resources import files
from pathlib import Path

DATA_DIR = Path(str(files("lmsim"))) / "data"
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


def bundled_trace(name: str) -> Path | None:
    """The bundled trace a bare name means (`kimi_conversation_sample`, with or without
    `.parquet` or `traces/`), or None."""
    stem = name.removeprefix("traces/").removesuffix(".parquet")
    candidate = TRACES_DIR / f"{stem}.parquet"
    return candidate if "/" not in stem and candidate.is_file() else None


def bundled_experiment_names() -> list[str]:
    return sorted(
        str(p.relative_to(EXPERIMENTS_DIR).with_suffix(""))
        for p in EXPERIMENTS_DIR.rglob("*.yaml")
    )


def check_source_checkout(path: Path, command: str) -> None:
    """Refuse to write shipped data unless this is a source checkout: `path` writable and
    not inside an installed package (site-packages), where a write would alter the
    installation for every user of it."""
    import os

    from lmsim.errors import ConfigError

    installed = any(part in ("site-packages", "dist-packages") for part in path.resolve().parts)
    target = path if path.exists() else path.parent
    if installed or not os.access(target, os.W_OK):
        raise ConfigError(
            f"{command}: {path} belongs to the installed lmsim package; run it from a source "
            "checkout (pip install -e .)"
        )


# -- GPU prices -----------------------------------------------------------------------------

GPU_PRICES = DATA_DIR / "hardware" / "gpu_prices.yaml"


def shipped_gpu_prices() -> dict[str, dict]:
    """GPU key -> its entry in `hardware/gpu_prices.yaml` (price, provider, URL, date, ...)."""
    return dict(_read_gpu_prices())


@lru_cache(maxsize=1)
def _read_gpu_prices() -> dict[str, dict]:
    import yaml

    return (yaml.safe_load(GPU_PRICES.read_text()) or {}).get("prices") or {}


def _price_entry(gpu_key: str) -> dict:
    from lmsim.errors import ConfigError

    prices = _read_gpu_prices()
    entry = prices.get(gpu_key.lower())
    if entry is None:
        raise ConfigError(f"cost: no shipped price for GPU {gpu_key!r} (priced: {', '.join(sorted(prices))}); "
                          f"set cost.gpu_price_per_hour: {{{gpu_key}: USD per GPU-hour}}")
    return entry


def gpu_price_per_hour(gpu_key: str) -> float:
    """The shipped USD per GPU-hour of a GPU key (`h20`, `h100`, ...)."""
    return float(_price_entry(gpu_key)["usd_per_gpu_hour"])


def gpu_price_source(gpu_key: str) -> str:
    """Where the shipped price comes from, on one line: provider, basis, product, URL, date."""
    e = _price_entry(gpu_key)
    return f"{e['provider']}, {e['basis']}, {e['product']}: {e['url']} ({e['date']})"
