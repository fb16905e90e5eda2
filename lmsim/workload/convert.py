"""Convert a raw trace file to canonical Parquet without holding it in memory.

`convert_trace(path, out)` streams formats that can be streamed (Claude Code sessions, the
largest raw trace lmsim reads: 572 sessions, 460 MB of JSON) and loads the others whole.
Streaming is two passes. Pass 1 reads one session at a time, checks its rows exactly as
`ClaudeCodeFormat.load` does, keeps the per-row scalars (tens of bytes a row) and spills
the rows' block ids to a temporary file beside the output. Pass 2 orders rows by arrival
(stable, as the loader) and writes Parquet row groups of a few thousand rows, reading each
row's ids back from the spill. Peak memory is one session plus one row group, instead of
every id several times over; the output equals `load_trace(...).save(out)` (tested).
"""

from __future__ import annotations

import os
from array import array
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from lmsim.errors import TraceError
from lmsim.workload.formats import (
    FORMATS,
    ClaudeCodeFormat,
    _check_file,
    infer_format,
    load_trace,
    progress_bar,
)
from lmsim.workload.trace import Trace

ROW_GROUP_IDS = 1 << 20  # ids per Parquet row group (8 MB of int64 before compression)


def convert_trace(
    path: str | os.PathLike[str], out: str | os.PathLike[str], *, format: str | None = None,
    skip_bad_rows: bool = False, progress: bool = False, params: dict[str, Any] | None = None,
) -> tuple[str, int, int]:
    """Write `path` as canonical Parquet at `out` (a temporary file renamed into place).
    Returns (format, rows written, bad rows skipped). `params`: the format's parameters."""
    path, out = Path(path), Path(out)
    name = format or infer_format(path)
    FORMATS.create(name, params, where=f"format {name}")
    if name == "claude_code":
        rows, skipped = _stream_claude_code(path, out, skip_bad_rows=skip_bad_rows, progress=progress)
        return name, rows, skipped
    trace = load_trace(path, format=name, skip_bad_rows=skip_bad_rows, progress=progress, params=params)
    trace.save(out)
    return name, len(trace), int(trace.meta.get("skipped_rows", "0"))


def _stream_claude_code(path: Path, out: Path, *, skip_bad_rows: bool, progress: bool) -> tuple[int, int]:
    from lmsim.workload.formats import _PROGRESS

    _check_file(path)
    fmt = ClaudeCodeFormat()
    rows = fmt.new_rows(path, skip_bad_rows)  # for its field checks and skip counting only
    bs = fmt.block_size
    arrival, think = array("d"), array("d")
    inp, outp, nids, sess, prev = array("q"), array("q"), array("q"), array("q"), array("q")
    stats = {"sessions": 0, "clamped": 0}
    out.parent.mkdir(parents=True, exist_ok=True)
    spill_path = out.with_name(f".{out.name}.ids-{os.getpid()}")
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        kept = 0
        token = _PROGRESS.set(progress)
        try:
            with open(spill_path, "wb") as spill:
                for n, index, entries in fmt.sessions(path, rows, stats):
                    row_of: list[int] = []  # kept row of each entry, -1 if dropped
                    for arr_t, p, i, o, ids, tt, where in entries:
                        problem = _row_problem(i, o, len(ids), bs)
                        if problem is not None:
                            rows.bad(n, problem, where)  # raises unless skipping; counts the row
                            row_of.append(-1)
                            continue
                        parent = row_of[p] if p >= 0 else -1
                        row_of.append(kept)
                        kept += 1
                        arrival.append(arr_t)
                        think.append(tt if parent >= 0 else 0.0)
                        inp.append(i)
                        outp.append(o)
                        nids.append(len(ids))
                        sess.append(index)
                        prev.append(parent)
                        spill.write(np.ascontiguousarray(ids, dtype="<i8").tobytes())
        finally:
            _PROGRESS.reset(token)
        if kept == 0:
            raise TraceError(f"{path}: no valid rows ({rows.skipped} skipped)")
        meta = {"skipped_rows": str(rows.skipped), **fmt.meta(stats), "block_size": str(bs), "source": str(path)}
        _write_sorted(spill_path, tmp, meta, bs, progress, arrival=np.frombuffer(arrival, dtype=np.float64),
                      think=np.frombuffer(think, dtype=np.float64), inp=np.frombuffer(inp, dtype=np.int64),
                      outp=np.frombuffer(outp, dtype=np.int64), nids=np.frombuffer(nids, dtype=np.int64),
                      sess=np.frombuffer(sess, dtype=np.int64), prev=np.frombuffer(prev, dtype=np.int64))  # fmt: skip
        os.replace(tmp, out)
    finally:
        spill_path.unlink(missing_ok=True)
        tmp.unlink(missing_ok=True)
    return kept, rows.skipped


def _row_problem(inp: int, out: int, nids: int, bs: int) -> str | None:
    """The loader's row checks (`_Rows.finish`), one row at a time."""
    if inp < 1:
        return f"in must be >= 1, got {inp}"
    if out < 1:
        return f"out must be >= 1, got {out}"
    lo, hi = inp // bs, -(-inp // bs)
    if nids < lo or nids > hi:
        return (f"hash_ids has {nids} ids but in {inp} with {bs}-token blocks needs {lo}"
                + ("" if lo == hi else f" to {hi}"))
    return None


def _write_sorted(
    spill_path: Path, tmp: Path, meta: dict[str, str], block_size: int, progress: bool, *,
    arrival: np.ndarray, think: np.ndarray, inp: np.ndarray, outp: np.ndarray, nids: np.ndarray,
    sess: np.ndarray, prev: np.ndarray,
) -> None:
    n = len(arrival)
    order = np.argsort(arrival, kind="stable")
    new_row = np.empty(n, dtype=np.int64)
    new_row[order] = np.arange(n)
    after = np.where(prev >= 0, new_row[np.maximum(prev, 0)], -1)[order]
    starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(nids, out=starts[1:])
    metadata = {k.encode(): v.encode() for k, v in meta.items()}
    writer: Any = None
    with open(spill_path, "rb") as spill, progress_bar(progress, total=n, unit="row", desc="writing") as bar:
        begin = 0
        while begin < n:
            # a row group: rows until about ROW_GROUP_IDS ids
            ends = np.cumsum(nids[order[begin:]])
            end = begin + max(1, int(np.searchsorted(ends, ROW_GROUP_IDS, side="right")))
            rows = order[begin:end]
            values = []
            for r in rows.tolist():
                spill.seek(int(starts[r]) * 8)
                values.append(np.fromfile(spill, dtype="<i8", count=int(nids[r])))
            offsets = np.zeros(len(rows) + 1, dtype=np.int64)
            np.cumsum(nids[rows], out=offsets[1:])
            chunk = Trace(
                arrival_s=arrival[rows], input_tokens=inp[rows], output_tokens=outp[rows],
                hash_offsets=offsets, hash_values=np.concatenate(values),
                block_size=block_size, session_id=sess[rows], parent_id=after[begin:end],
                after_id=after[begin:end], delay_s=np.where(after[begin:end] >= 0, think[rows], 0.0),
            )  # fmt: skip
            table = chunk.to_arrow().replace_schema_metadata(metadata)
            if writer is None:
                writer = pq.ParquetWriter(tmp, table.schema, compression="zstd")
            writer.write_table(table)
            bar.update(len(rows))
            begin = end
    if writer is not None:
        writer.close()
