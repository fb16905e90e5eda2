"""The `GENERATORS` registry (kept apart from `__init__` so generator modules can import it
without a cycle)."""

from __future__ import annotations

from typing import Any

from lmsim.registry import Registry

GENERATORS: Registry[Any] = Registry("trace generator")
