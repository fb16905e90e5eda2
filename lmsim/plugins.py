"""User plug-ins: modules that register policies (or trace formats, generators) by importing.

Two ways in, both only import a module (its `@POLICIES.register(...)` decorators do the
rest): `--plugin MODULE` on the command line (a module name, searched in the working
directory first, or a path to a `.py` file), and the `lmsim.policies` entry-point group of
installed distributions, e.g. in a plug-in's pyproject.toml:

    [project.entry-points."lmsim.policies"]
    fewest_waiting = "my_policies"

A module that cannot be imported is one line of error (exit 2), not a traceback.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from importlib.metadata import entry_points
from pathlib import Path

from lmsim.errors import ConfigError

ENTRY_POINT_GROUP = "lmsim.policies"
_loaded: set[str] = set()


def _reason(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def load_plugin(spec: str) -> None:
    """Import one `--plugin` module by name or `.py` path (once per process)."""
    if spec in _loaded:
        return
    try:
        if spec.endswith(".py"):
            path = Path(spec)
            if not path.is_file():
                raise ConfigError(f"--plugin {spec}: file not found")
            name = f"lmsim_plugin_{path.stem}"
            module_spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(module_spec)  # type: ignore[arg-type]
            sys.modules[name] = module
            module_spec.loader.exec_module(module)  # type: ignore[union-attr]
        else:
            # The console script's sys.path lacks the working directory, where a user's
            # policy module usually sits; it stays on the path for the module's own imports.
            cwd = str(Path.cwd())
            if cwd not in sys.path:
                sys.path.insert(0, cwd)
            importlib.import_module(spec)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"--plugin {spec}: cannot import it ({_reason(exc)})") from None
    _loaded.add(spec)


def load_entry_points() -> None:
    """Import every module registered under the `lmsim.policies` entry-point group."""
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        key = f"entry-point:{ep.value}"
        if key in _loaded:
            continue
        try:
            ep.load()
        except Exception as exc:
            raise ConfigError(
                f"entry point {ep.name!r} ({ENTRY_POINT_GROUP}, {ep.value}): cannot import it ({_reason(exc)})"
            ) from None
        _loaded.add(key)


def load_plugins(specs: list[str] | tuple[str, ...] = ()) -> None:
    """Entry points first, then the named modules, in order."""
    load_entry_points()
    for spec in specs:
        load_plugin(spec)
