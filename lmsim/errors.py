"""User-facing errors.

Every expected failure (bad YAML, unknown policy, malformed trace row, missing file) raises an
`LmsimError` whose message is one line naming the file, the field and the problem. The CLI
prints that line and exits with code 2; only `--debug` shows a traceback.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class LmsimError(Exception):
    """An expected, user-caused failure; its message is shown verbatim on one line."""

    exit_code = 2


class ConfigError(LmsimError):
    """The experiment or a parameter in it is invalid."""


class TraceError(LmsimError):
    """A trace file is missing, malformed or inconsistent."""


class ProfileError(LmsimError):
    """A cost profile is missing, malformed or inconsistent."""


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """`1 run`, `2 runs`: a count with its noun agreeing (messages and reports)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def suggest(name: str, known: Iterable[str], *, label: str = "known") -> str:
    """The tail of an "unknown name" message: `; did you mean 'x'?` for the closest of
    `known` (when one is close), then ` (label: a, b, ...)`."""
    known = list(known)
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"{hint} ({label}: {', '.join(known) or 'none'})"


class InvariantError(Exception):
    """An internal invariant was violated during a checked run (`--check`): a bug, not bad input."""


class PolicyError(LmsimError):
    """A routing policy (typically a plug-in) broke its contract, e.g. chose an instance that
    does not exist: a bug in that policy, reported as one line with exit code 3."""

    exit_code = 3
