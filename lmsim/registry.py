"""Name -> class registries for plug-ins (routing policies, trace formats, generators).

A plug-in registers itself with a decorator; its constructor's keyword-only arguments are its
YAML `params`. Unknown names get a did-you-mean suggestion; unknown or badly typed parameters
get one line naming the plug-in, the parameter and what is allowed.
"""

from __future__ import annotations

import inspect
import keyword
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from lmsim.errors import ConfigError, suggest

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, type[T]] = {}

    def register(self, name: str) -> Callable[[type[T]], type[T]]:
        def decorate(cls: type[T]) -> type[T]:
            old = self._entries.get(name)
            # The same class of the same module registering again is that module imported
            # anew (a sweep worker receiving an edited plug-in): the new class replaces it.
            reimport = old is not None and (old.__module__, old.__qualname__) == (cls.__module__, cls.__qualname__)
            if old is not None and not reimport:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._entries[name] = cls
            cls.registry_name = name  # type: ignore[attr-defined]
            return cls

        return decorate

    def names(self) -> list[str]:
        return sorted(self._entries)

    def get(self, name: str, *, where: str = "") -> type[T]:
        if name in self._entries:
            return self._entries[name]
        prefix = f"{where}: " if where else ""
        raise ConfigError(f"{prefix}unknown {self.kind} {name!r}{suggest(name, self.names())}")

    def parameters(self, name: str) -> dict[str, inspect.Parameter]:
        """The keyword-only constructor parameters of a plug-in (its YAML `params`), by YAML
        name: a Python keyword is spelled with a trailing underscore in code (`lambda_`) and
        without it in YAML (`lambda`)."""
        sig = inspect.signature(self.get(name).__init__)  # type: ignore[misc]
        return {
            _yaml_name(p.name): p
            for p in sig.parameters.values()
            if p.kind is inspect.Parameter.KEYWORD_ONLY
        }

    def create(self, name: str, params: dict[str, Any] | None = None, *, where: str = "") -> T:
        cls = self.get(name, where=where)
        params = dict(params or {})
        allowed = self.parameters(name)
        prefix = f"{where}: " if where else ""
        for key in params:
            if key not in allowed:
                raise ConfigError(
                    f"{prefix}{self.kind} {name!r} has no parameter {key!r}"
                    f"{suggest(key, sorted(allowed), label='parameters')}"
                )
        kwargs = {allowed[key].name: value for key, value in params.items()}
        try:
            return cls(**kwargs)
        except ConfigError:
            raise
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{prefix}{self.kind} {name!r}: {exc}") from None


def _yaml_name(param: str) -> str:
    if param.endswith("_") and keyword.iskeyword(param[:-1]):
        return param[:-1]
    return param
