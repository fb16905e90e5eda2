"""Progress bars for long commands: tqdm on stderr, shown only when stderr is a terminal
(tqdm's `disable=None`) and not turned off with `--no-progress`; never in stdout, so
printed results stay machine-readable."""

from __future__ import annotations

import sys
from typing import Any


def progress_bar(enabled: bool, **kwargs: Any) -> Any:
    """A tqdm bar on stderr, or a disabled one (same interface) when not `enabled`."""
    from tqdm import tqdm

    return tqdm(file=sys.stderr, disable=None if enabled else True, dynamic_ncols=True, **kwargs)
