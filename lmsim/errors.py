"""User-facing errors.

Every expected failure (bad YAML, unknown policy, malformed trace row, missing file) raises an
`LmsimError` whose message is one line naming the file, the field and the problem. The CLI
prints that line and exits with code 2; only `--debug` shows a traceback.
"""

from __future__ import annotations


class LmsimError(Exception):
    """An expected, user-caused failure; its message is shown verbatim on one line."""

    exit_code = 2


class ConfigError(LmsimError):
    """The experiment or a parameter in it is invalid."""


class TraceError(LmsimError):
    """A trace file is missing, malformed or inconsistent."""


class ProfileError(LmsimError):
    """A cost profile is missing, malformed or inconsistent."""


class InvariantError(Exception):
    """An internal invariant was violated during a checked run (`--check`): a bug, not bad input."""
