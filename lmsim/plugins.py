"""User plug-ins: modules that register policies (or trace formats, generators) by importing.

Two ways in, both only import a module (its `@POLICIES.register(...)` decorators do the
rest): `--plugin MODULE` on the command line (a module name, searched in the working
directory first, or a path to a `.py` file), and the `lmsim.policies` entry-point group of
installed distributions, e.g. in a plug-in's pyproject.toml:

    [project.entry-points."lmsim.policies"]
    fewest_waiting = "my_policies"

A module that cannot be imported is one line of error (exit 2), not a traceback.

Sweep workers get the same plug-ins (`loaded_plugins`, `install_plugins`): a pool worker
forked from this process has them already, but a spawned or remote worker (Dask) starts
from nothing. Each `--plugin` module is therefore described by what a worker needs to
import it again: the source text of a single-file module (a `.py` path, or a top-level
module found as one file), so a worker on another machine needs no copy of the file; or
the module's name (a package), with the folder it was found in, for workers that share the
filesystem or have it installed. A worker imports each description once per version (a
digest of the source), and a new version replaces the old one's registrations.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
import threading
import types
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path

from lmsim.errors import ConfigError

ENTRY_POINT_GROUP = "lmsim.policies"
_loaded: set[str] = set()


@dataclass(frozen=True)
class PluginModule:
    """How a worker imports one `--plugin` module again (picklable, sent with each task)."""

    spec: str  # as the user gave it
    module: str  # the name it is imported under
    source: str | None  # the file's text, or None: import `module` by name
    origin: str  # the file it came from (tracebacks), or the folder to search by name
    digest: str


_shipped: dict[str, PluginModule] = {}  # spec -> description, in load order
_installed: dict[str, str] = {}  # module name -> digest of the version this process has
_install_lock = threading.Lock()  # a Dask worker may run tasks in several threads


def _reason(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _describe(spec: str, module: types.ModuleType, folder: str) -> PluginModule:
    file = getattr(module, "__file__", None)
    single_file = file is not None and file.endswith(".py") and not hasattr(module, "__path__") and "." not in module.__name__
    if single_file:
        source = Path(file).read_text(encoding="utf-8")
        return PluginModule(spec, module.__name__, source, file, hashlib.sha256(source.encode()).hexdigest())
    return PluginModule(spec, module.__name__, None, folder, "")


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
            folder = str(path.resolve().parent)
        else:
            # The console script's sys.path lacks the working directory, where a user's
            # policy module usually sits; it stays on the path for the module's own imports.
            folder = str(Path.cwd())
            if folder not in sys.path:
                sys.path.insert(0, folder)
            module = importlib.import_module(spec)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"--plugin {spec}: cannot import it ({_reason(exc)})") from None
    _loaded.add(spec)
    described = _describe(spec, module, folder)
    _shipped[spec] = described
    _installed[described.module] = described.digest


def loaded_plugins() -> list[PluginModule]:
    """The `--plugin` modules this process imported, as workers re-import them."""
    return list(_shipped.values())


def install_plugins(modules: list[PluginModule] | tuple[PluginModule, ...]) -> None:
    """In a sweep worker: import every plug-in the sweep's process had, and the entry points
    installed here. A module that fails is one line naming it and this worker's problem."""
    with _install_lock:
        for m in modules:
            if _installed.get(m.module) == m.digest:
                continue
            try:
                if m.source is not None:
                    module = types.ModuleType(m.module)
                    module.__file__ = m.origin
                    sys.modules[m.module] = module
                    exec(compile(m.source, m.origin, "exec"), module.__dict__)
                else:
                    if Path(m.origin).is_dir() and m.origin not in sys.path:
                        sys.path.insert(0, m.origin)
                    importlib.import_module(m.module)
            except Exception as exc:
                if m.source is not None:
                    sys.modules.pop(m.module, None)
                raise ConfigError(
                    f"--plugin {m.spec}: cannot import it on this worker ({_reason(exc)}); a plug-in that is "
                    "a package must be installed on every worker"
                ) from None
            _installed[m.module] = m.digest
    load_entry_points()


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
