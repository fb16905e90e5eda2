"""Single-file outputs: whether a path may receive one, and writing it atomically.

A command writes a file (a trace, a figure, a report, a JSON table) only where nothing of the
user's is lost: the path is absent, or holds a file lmsim recognises as its own (each writer
passes a recogniser), or the user passed `--overwrite`. The file is written to a temporary
sibling and renamed into place, so a reader never sees half of it. Run and sweep
directories have their own rule (`lmsim.study.rundir.check_output_dir`).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

from lmsim.errors import ConfigError

# Stamped into every figure's metadata (PNG text chunk, SVG/PDF creator) and the report's
# <meta name="generator">, so a later command can tell its own file from the user's.
SIGNATURE = "written by lmsim"


def check_output_file(
    path: str | os.PathLike[str], *, overwrite: bool = False,
    ours: Callable[[Path], bool] | None = None, option: str = "--out",
) -> Path:
    """Refuse, with one line, a file path that would replace something lmsim did not write.

    Returns the path. `ours(path)` says whether an existing file is one lmsim wrote; such a
    file is replaced freely, anything else only with `overwrite`."""
    path = Path(path)
    resolved = path.resolve()
    blocker = file_in_the_way(path)
    if blocker is not None:
        raise ConfigError(f"{path}: cannot create the output file, {blocker} is a file")
    if resolved.is_dir():
        raise ConfigError(f"{path}: is a directory; {option} names a file")
    if resolved.exists() and not overwrite and not (ours is not None and _safe(ours, resolved)):
        raise ConfigError(
            f"{path}: file exists and was not written by lmsim; pass --overwrite to replace it"
        )
    return path


def file_in_the_way(path: Path) -> Path | None:
    """The existing non-directory among `path`'s parents, named as the user wrote it when
    possible, else resolved (a `..` in the path)."""
    for parent in (*path.parents, *path.resolve().parents):
        if parent.exists() and not parent.is_dir():
            return parent
    return None


def _safe(ours: Callable[[Path], bool], path: Path) -> bool:
    try:
        return bool(ours(path))
    except Exception:  # an unreadable or malformed file is not recognisably ours
        return False


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary sibling of `path` to write; on success it replaces `path`, on
    failure it is removed and `path` is untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}{path.suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def write_text(path: str | os.PathLike[str], text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def is_signed_figure(path: Path) -> bool:
    """A PNG, SVG or PDF lmsim drew (`SIGNATURE` in its metadata; PDF keeps it near the end)."""
    with open(path, "rb") as fh:
        head = fh.read(1 << 16)
        fh.seek(max(path.stat().st_size - (1 << 14), 0))
        tail = fh.read()
    needle = SIGNATURE.encode()
    return needle in head or needle in tail


def is_signed_report(path: Path) -> bool:
    """An HTML page `lmsim report` wrote (`SIGNATURE` in its head)."""
    with open(path, "rb") as fh:
        return SIGNATURE.encode() in fh.read(4096)


FIGURE_FORMATS = ("png", "svg", "pdf")
# Left in a folder `lmsim plot` created or wrote figures into, so a later `plot` knows the
# folder's same-named files are its own.
FIGURE_DIR_MARKER = ".lmsim-figures"
_TEMPORARY = re.compile(r"\..+\.tmp-\d+(\.\w+)?")


def is_signed_output(path: Path) -> bool:
    """A figure or report lmsim signed, or a temporary `atomic_path` left when its process
    died mid-write (`.NAME.tmp-PID.EXT`). Such a file is lmsim's wherever it lies."""
    if path.is_symlink() or not path.is_file():
        return False
    if _TEMPORARY.fullmatch(path.name):
        return True
    suffix = path.suffix.lstrip(".").lower()
    try:
        if suffix in FIGURE_FORMATS:
            return is_signed_figure(path)
        if suffix == "html":
            return is_signed_report(path)
    except OSError:
        return False
    return False


def figure_metadata(fmt: str) -> dict[str, str]:
    """The matplotlib `savefig(metadata=...)` that signs a figure of format `fmt`."""
    # No dates: the same results redraw to the same SVG/PDF bytes.
    if fmt == "png":
        return {"Software": SIGNATURE}
    return {"Creator": SIGNATURE, ("Date" if fmt == "svg" else "CreationDate"): None}


def save_figure(fig, path: str | os.PathLike[str], **kwargs) -> Path:
    """Save a matplotlib figure atomically, signed as lmsim's."""
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower() or "png"
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=fmt, metadata=figure_metadata(fmt), **kwargs)
    return path
