"""Trace loaders: every real trace format lmsim reads, mapped into the canonical `Trace`.

Owns the `FORMATS` registry (`canonical`, `mooncake`, `bailian`, `claude_code`, `azure`,
`vidur`, `sharegpt`) and `load_trace`, which picks a format from the file name or content. Each loader checks
every row and reports the first bad one as a single line
`<file>: line <n>: <field> <problem>` (1-based line numbers; for CSV the header is line 1).
With `skip_bad_rows` the bad rows are dropped instead and counted in
`trace.meta["skipped_rows"]`.

How each format maps in (details in `traces/README.md`):

- mooncake: `timestamp` ms -> `arrival_s` = ms / 1000; 512-token blocks; ties keep file order.
- bailian: `timestamp` s; 16-token blocks; `chat_id`/`parent_chat_id` -> `parent_id` (row of
  the parent turn) and `session_id` (row of the conversation's root turn).
- claude_code: WEKA sessions, 64-token blocks with per-session ("local") ids, so every
  session and sub-agent gets a private id range. Sessions are placed on one clock by
  `CLAUDE_CODE_SESSION_STAGGER_S` (see `ClaudeCodeFormat`).
- azure: CSV of wall-clock timestamps and lengths; no hash ids (empty lists).
- vidur: Vidur's processed trace CSV (`arrived_at` s, prefill and decode lengths); no hash ids.
- sharegpt: conversations as text (no times, no lengths): lengths and block ids estimated
  from the text, arrivals drawn (`lmsim.workload.sharegpt`). The only format with
  parameters (`workload.format: {name: sharegpt, params: {...}}`, `trace convert --param`).
"""

from __future__ import annotations

import contextlib
import contextvars
import gzip
import io
import json
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from lmsim.errors import TraceError
from lmsim.progress import progress_bar
from lmsim.registry import Registry
from lmsim.workload.sharegpt import ShareGPTOptions, conversations_to_trace, read_conversations
from lmsim.workload.trace import Trace, chain_roots, read_parquet

FORMATS: Registry[Any] = Registry("trace format")

# WEKA sessions carry no absolute time. Starting session k (file order) at k * 30 s gives
# about 120 concurrently open sessions for the shared file's median 60-min session length,
# a busy but plausible single-tenant cluster; `scale_to_rate` can re-time it afterwards.
CLAUDE_CODE_SESSION_STAGGER_S = 30.0


# Set by `load_trace(progress=True)`: loaders then show a bar of the input bytes read.
_PROGRESS: contextvars.ContextVar[bool] = contextvars.ContextVar("lmsim_trace_progress", default=False)


class _ProgressReader(io.RawIOBase):
    """A binary file that advances a progress bar by the bytes read (for gzip: the
    compressed bytes, so the bar ends at the file size)."""

    def __init__(self, raw: io.BufferedReader, bar: Any) -> None:
        super().__init__()
        self.raw, self.bar = raw, bar

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = self.raw.readinto(buffer) or 0
        self.bar.update(n)
        return n


@contextlib.contextmanager
def _open_text(path: Path, *, progress: bool | None = None) -> Iterator[io.TextIOBase]:
    """Text lines of a plain or gzip file, with a byte progress bar if asked for (or if
    `load_trace(progress=True)` is loading)."""
    with open(path, "rb") as fh:
        magic = fh.read(2)
    show = _PROGRESS.get() if progress is None else progress
    with contextlib.ExitStack() as stack:
        raw: Any = stack.enter_context(open(path, "rb"))
        if show:
            bar = stack.enter_context(
                progress_bar(True, total=path.stat().st_size, unit="B", unit_scale=True, desc=f"reading {path.name}")
            )
            raw = stack.enter_context(io.BufferedReader(_ProgressReader(raw, bar), 1 << 20))
        if magic == b"\x1f\x8b":
            raw = stack.enter_context(gzip.GzipFile(fileobj=raw, mode="rb"))
        yield stack.enter_context(io.TextIOWrapper(raw, encoding="utf-8"))


def _check_file(path: Path) -> None:
    if not path.exists():
        raise TraceError(f"{path}: trace file not found")
    if path.is_dir():
        raise TraceError(f"{path}: is a directory, not a trace file")
    if path.stat().st_size == 0:
        raise TraceError(f"{path}: file is empty (0 bytes)")


class _Rows:
    """Column accumulator for one parse. Python lists live only while parsing; `finish`
    turns them into numpy arrays and runs the vectorized cross-row checks."""

    def __init__(
        self, path: Path, skip: bool, block_size: int, *, hashes_required: bool,
        names: tuple[str, str] = ("input_length", "output_length"),
    ) -> None:
        self.names = names
        self.path = path
        self.skip = skip
        self.block_size = block_size
        self.hashes_required = hashes_required
        self.line: list[int] = []
        self.where: list[str] = []  # where in a line a row sits ("requests[3]"), or ""
        self.ts: list[float] = []
        self.inp: list[int] = []
        self.out: list[int] = []
        self.nhash: list[int] = []
        self.hashes: list[int] = []  # flushed into `chunks` to bound Python-int memory
        self.chunks: list[np.ndarray] = []
        self.skipped = 0

    def bad(self, line: int, what: str, where: str = "") -> None:
        if not self.skip:
            at = f"{where}: " if where else ""
            raise TraceError(f"{self.path}: line {line}: {at}{what}")
        self.skipped += 1

    def length(self, rec: dict[str, Any], key: str, line: int, where: str = "") -> int | None:
        v = rec.get(key)
        if v is None:
            self.bad(line, f"{key} is missing", where)
            return None
        if isinstance(v, bool) or not isinstance(v, int | float) or v != int(v):
            self.bad(line, f"{key} must be an integer, got {v!r}", where)
            return None
        if v < 0:
            self.bad(line, f"{key} must be >= 0, got {v}", where)
            return None
        return int(v)

    def number(self, rec: dict[str, Any], key: str, line: int, where: str = "") -> float | None:
        v = rec.get(key)
        if v is None:
            self.bad(line, f"{key} is missing", where)
            return None
        if isinstance(v, bool) or not isinstance(v, int | float) or not np.isfinite(v) or v < 0:
            self.bad(line, f"{key} must be a finite number >= 0, got {v!r}", where)
            return None
        return float(v)

    def hash_list(self, rec: dict[str, Any], key: str, line: int, where: str = "") -> list[int] | None:
        v = rec.get(key)
        if v is None:
            if self.hashes_required:
                self.bad(line, f"{key} is missing", where)
                return None
            return []
        if not isinstance(v, list) or not all(type(x) is int for x in v):
            self.bad(line, f"{key} must be a list of integers", where)
            return None
        return v

    def add(
        self, line: int, ts: float, inp: int, out: int, hashes: list[int] | np.ndarray,
        where: str = "",
    ) -> None:
        self.line.append(line)
        self.where.append(where)
        self.ts.append(ts)
        self.inp.append(inp)
        self.out.append(out)
        self.nhash.append(len(hashes))
        if isinstance(hashes, np.ndarray):
            self._flush()
            self.chunks.append(hashes.astype(np.int64, copy=False))
        else:
            self.hashes.extend(hashes)
            if len(self.hashes) > 1 << 20:
                self._flush()

    def _flush(self) -> None:
        if self.hashes:
            self.chunks.append(np.asarray(self.hashes, dtype=np.int64))
            self.hashes = []

    def finish(self, *, check_order: bool = True) -> tuple[np.ndarray, Trace]:
        """Vectorized checks (lengths >= 1, hash counts, order); returns (indices of the
        kept rows among those added, trace)."""
        line = np.asarray(self.line, dtype=np.int64)
        ts = np.asarray(self.ts, dtype=np.float64)
        inp = np.asarray(self.inp, dtype=np.int64)
        out = np.asarray(self.out, dtype=np.int64)
        nh = np.asarray(self.nhash, dtype=np.int64)
        self._flush()
        values = np.concatenate(self.chunks) if self.chunks else np.zeros(0, dtype=np.int64)
        self.chunks = []
        offsets = np.zeros(len(nh) + 1, dtype=np.int64)
        np.cumsum(nh, out=offsets[1:])
        bs = self.block_size
        lo = inp // bs
        hi = -(-inp // bs)
        bad_hash = (nh < lo) | (nh > hi)
        if not self.hashes_required:
            bad_hash &= nh != 0
        problems = [
            (inp < 1, lambda i: f"{self.names[0]} must be >= 1, got {inp[i]}"),
            (out < 1, lambda i: f"{self.names[1]} must be >= 1, got {out[i]}"),
            (
                bad_hash,
                lambda i: f"hash_ids has {nh[i]} ids but {self.names[0]} {inp[i]} with "
                f"{bs}-token blocks needs {lo[i]}"
                + ("" if lo[i] == hi[i] else f" to {hi[i]}"),
            ),
        ]
        bad = np.zeros(len(line), dtype=bool)
        for mask, message in problems:
            if mask.any():
                if not self.skip:
                    i = int(np.argmax(mask))
                    at = f"{self.where[i]}: " if self.where[i] else ""
                    raise TraceError(f"{self.path}: line {line[i]}: {at}{message(i)}")
                bad |= mask
        if check_order and len(ts) > 1:
            # A row goes backwards if it is earlier than the latest valid row before it;
            # judging against the running max keeps one outlier from condemning the rest.
            ok_ts = np.where(bad, -np.inf, ts)
            prev_max = np.maximum.accumulate(np.concatenate(([-np.inf], ok_ts[:-1])))
            back = ts < prev_max
            if back.any():
                i = int(np.argmax(back))
                if not self.skip:
                    raise TraceError(
                        f"{self.path}: line {line[i]}: timestamp goes backwards "
                        f"({ts[i]:g} after {prev_max[i]:g})"
                    )
                bad |= back
        self.skipped += int(bad.sum())
        trace = Trace(ts, inp, out, offsets, values, bs, source=str(self.path))
        keep = np.flatnonzero(~bad)
        if bad.any():
            trace = trace.take(keep)
        if len(trace) == 0:
            raise TraceError(f"{self.path}: no valid rows ({self.skipped} skipped)")
        trace.meta["skipped_rows"] = str(self.skipped)
        return keep, trace


def _json_lines(path: Path, rows: _Rows):
    """Yield (1-based line number, dict) for every non-blank line."""
    with _open_text(path) as fh:
        yield from _parse_lines(fh, rows)


def _parse_lines(lines, rows: _Rows):
    """(1-based line number, dict) per non-blank line; bad lines go to `rows.bad`."""
    for n, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            rec = json.loads(text)
        except json.JSONDecodeError as exc:
            rows.bad(n, f"record is not valid JSON ({exc.msg} at column {exc.colno})")
            continue
        if not isinstance(rec, dict):
            rows.bad(n, f"record must be a JSON object, got {type(rec).__name__}")
            continue
        yield n, rec


@FORMATS.register("canonical")
class CanonicalFormat:
    """lmsim's own Parquet format (see `lmsim.workload.trace`)."""

    def load(self, path: Path, skip_bad_rows: bool = False) -> Trace:
        trace = read_parquet(path)
        trace.meta.setdefault("skipped_rows", "0")
        return trace


@FORMATS.register("mooncake")
class MooncakeFormat:
    """Mooncake/Kimi JSONL: `timestamp` (ms), `input_length`, `output_length`, `hash_ids`
    (512-token blocks, global ids). Ties in timestamp keep file order."""

    block_size = 512

    def load(self, path: Path, skip_bad_rows: bool = False) -> Trace:
        _check_file(path)
        rows = _Rows(path, skip_bad_rows, self.block_size, hashes_required=True)
        for n, rec in _json_lines(path, rows):
            ts = rows.number(rec, "timestamp", n)
            inp = rows.length(rec, "input_length", n) if ts is not None else None
            out = rows.length(rec, "output_length", n) if inp is not None else None
            ids = rows.hash_list(rec, "hash_ids", n) if out is not None else None
            if ids is not None:
                rows.add(n, ts / 1000.0, inp, out, ids)
        _, trace = rows.finish()
        trace.source = str(path)
        return trace


@FORMATS.register("bailian")
class BailianFormat:
    """Qwen Bailian JSONL: `chat_id`, `parent_chat_id` (-1 for roots), `timestamp` (s),
    `input_length`, `output_length`, `type`, `turn`, `hash_ids` (16-token blocks).

    `parent_id` is the row of the parent chat (-1 if it is a root or not in the file) and
    `session_id` the row of the conversation's root. `type` and `turn` are not kept: the
    canonical format has no column for them and `turn` is implied by the parent chain."""

    block_size = 16

    def load(self, path: Path, skip_bad_rows: bool = False) -> Trace:
        _check_file(path)
        rows = _Rows(path, skip_bad_rows, self.block_size, hashes_required=True)
        chat: list[int] = []
        parent: list[int] = []
        for n, rec in _json_lines(path, rows):
            cid = rec.get("chat_id")
            if cid is None or isinstance(cid, bool) or not isinstance(cid, int):
                rows.bad(n, f"chat_id must be an integer, got {cid!r}")
                continue
            pid = rec.get("parent_chat_id", -1)
            if pid is None or isinstance(pid, bool) or not isinstance(pid, int):
                rows.bad(n, f"parent_chat_id must be an integer, got {pid!r}")
                continue
            ts = rows.number(rec, "timestamp", n)
            inp = rows.length(rec, "input_length", n) if ts is not None else None
            out = rows.length(rec, "output_length", n) if inp is not None else None
            ids = rows.hash_list(rec, "hash_ids", n) if out is not None else None
            if ids is not None:
                rows.add(n, ts, inp, out, ids)
                chat.append(cid)
                parent.append(pid)
        keep, trace = rows.finish()
        chat_a = np.asarray(chat, dtype=np.int64)[keep]
        parent_a = np.asarray(parent, dtype=np.int64)[keep]
        trace.parent_id = _rows_of(chat_a, parent_a)
        trace.session_id = chain_roots(trace.parent_id)
        trace.source = str(path)
        return trace


def _rows_of(ids: np.ndarray, refs: np.ndarray) -> np.ndarray:
    """Row index of the first row whose id equals each ref, -1 where absent or later."""
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    pos = np.searchsorted(sorted_ids, refs)
    pos_c = np.minimum(pos, max(len(ids) - 1, 0))
    found = (len(ids) > 0) & (sorted_ids[pos_c] == refs) & (refs >= 0)
    row = np.where(found, order[pos_c], -1)
    # a parent must precede its child; a forward reference would make replay impossible
    return np.where(row < np.arange(len(refs)), row, -1)


@FORMATS.register("claude_code")
class ClaudeCodeFormat:
    """WEKA Claude Code sessions: one session JSON object per line (optionally gzip), or a
    single upstream `trace_NNNN.json`. 64-token complete blocks, ids local to a session.

    - Ids: every session, and every sub-agent inside it, is shifted into a private range
      (offset = 1 + the largest id used so far), since equal local ids in two sessions do
      not mean equal content.
    - Clock: session k (0-based, file order) starts at k * `CLAUDE_CODE_SESSION_STAGGER_S`;
      a request arrives at session start + `t`; sub-agent requests at session start +
      the sub-agent's start + their own `t`. A sub-agent entry is logged when it returns,
      so its start is its `t` minus `duration_ms` (which lands right after the spawning
      step's response; the parent's next step waits for it).
    - Closed loop: each request after the first of its (sub-)session has `after_id` = the
      previous request's row and `delay_s` = its `think_time`, so a replay keeps the
      client's think time after the simulated response. `parent_id` is the same row.
    - `session_id` is the session's index in the file (sub-agents share their parent's).
    - `out` = 0 (present in the real data) becomes 1, counted in meta
      `zero_outputs_clamped`; the canonical format needs one output token.
    """

    block_size = 64

    def __init__(self, *, max_sessions: int | None = None) -> None:
        self.max_sessions = max_sessions

    def new_rows(self, path: Path, skip_bad_rows: bool) -> _Rows:
        return _Rows(path, skip_bad_rows, self.block_size, hashes_required=True, names=("in", "out"))

    def load(self, path: Path, skip_bad_rows: bool = False) -> Trace:
        """The whole file in memory: the reference for `lmsim.workload.convert`, which
        streams the same rows to Parquet."""
        _check_file(path)
        rows = self.new_rows(path, skip_bad_rows)
        sess: list[int] = []
        prev_in_chain: list[int] = []  # index into rows.* of the previous step, or -1
        think: list[float] = []
        stats = {"sessions": 0, "clamped": 0}
        for n, index, entries in self.sessions(path, rows, stats):
            first_row = len(rows.line)
            for arr_t, prev, inp, out, ids, tt, where in entries:
                rows.add(n, arr_t, inp, out, ids, where)
                sess.append(index)
                prev_in_chain.append(first_row + prev if prev >= 0 else -1)
                think.append(tt)
        keep, trace = rows.finish(check_order=False)
        # rows were added session by session; re-index the previous-step links to the
        # kept rows, then sort by arrival (stable, so ties keep file order) and let
        # `take` remap the links
        remap = np.full(len(prev_in_chain), -1, dtype=np.int64)
        remap[keep] = np.arange(len(keep))
        prev = np.asarray(prev_in_chain, dtype=np.int64)[keep]
        after = np.where(prev >= 0, remap[np.maximum(prev, 0)], -1)
        trace.after_id = after
        trace.parent_id = after.copy()
        trace.delay_s = np.where(after >= 0, np.asarray(think, dtype=np.float64)[keep], 0.0)
        trace.session_id = np.asarray(sess, dtype=np.int64)[keep]
        trace = trace.take(np.argsort(trace.arrival_s, kind="stable"))
        trace.source = str(path)
        trace.meta.update(self.meta(stats))
        return trace

    @staticmethod
    def meta(stats: dict[str, int]) -> dict[str, str]:
        return {
            "session_stagger_s": str(CLAUDE_CODE_SESSION_STAGGER_S),
            "sessions": str(stats["sessions"]),
            "zero_outputs_clamped": str(stats["clamped"]),
        }

    def sessions(
        self, path: Path, rows: _Rows, stats: dict[str, int]
    ) -> Iterator[tuple[int, int, list[tuple[float, int, int, int, np.ndarray, float, str]]]]:
        """One session at a time, in file order: (line, session index, requests), each
        request (arrival, previous request's index in this list or -1, in, out, ids moved
        into the session's private range, think time, where in the line it sits, e.g.
        `requests[4].requests[2]`). Field problems go to `rows.bad`;
        `stats` counts sessions and clamped zero outputs."""
        next_id = 0
        count = 0
        for n, rec in _session_records(path, rows):
            if self.max_sessions is not None and count >= self.max_sessions:
                break
            reqs = rec.get("requests")
            if not isinstance(reqs, list):
                rows.bad(n, "requests is missing or not a list")
                continue
            start = count * CLAUDE_CODE_SESSION_STAGGER_S
            # (request list, time offset, its path in the line) for the main loop and each
            # sub-agent loop; the path names the request in an error ("requests[4]
            # .requests[2]"), as the line holds a whole session
            chains: list[tuple[list[Any], float, str]] = [(reqs, start, "requests")]
            # per request: (arrival, chain, previous entry or -1, in, out, ids, think, path)
            entries: list[tuple[float, int, int, int, int, np.ndarray, float, str]] = []
            chain_max: list[int] = []
            for chain_no, (items, t0, path_) in enumerate(chains):
                local_max = -1
                prev = -1
                for k_item, item in enumerate(items):
                    where = f"{path_}[{k_item}]"
                    if not isinstance(item, dict):
                        rows.bad(n, "requests entry is not an object", where)
                        continue
                    if item.get("type") == "subagent":
                        t_sub = rows.number(item, "t", n, where)
                        # the entry is logged when the sub-agent returns: its `t` is the
                        # end, `duration_ms` before it the start (right after the
                        # spawning step's response in the real data)
                        dur = item.get("duration_ms")
                        if t_sub is not None and isinstance(dur, int | float) and not isinstance(dur, bool) and 0 <= dur <= t_sub * 1000:
                            t_sub -= dur / 1000.0
                        if t_sub is not None and isinstance(item.get("requests"), list):
                            chains.append((item["requests"], t0 + t_sub, f"{where}.requests"))
                        elif t_sub is not None:
                            rows.bad(n, "subagent requests is missing or not a list", where)
                        continue
                    t = rows.number(item, "t", n, where)
                    inp = rows.length(item, "in", n, where) if t is not None else None
                    out = rows.length(item, "out", n, where) if inp is not None else None
                    ids = rows.hash_list(item, "hash_ids", n, where) if out is not None else None
                    if ids is None:
                        continue
                    if out == 0:
                        # aborted or empty replies exist in the real data; a replay still
                        # needs one decode step, so they become 1-token outputs (counted)
                        out = 1
                        stats["clamped"] += 1
                    tt = item.get("think_time", 0.0)
                    tt = float(tt) if isinstance(tt, int | float) and tt >= 0 else 0.0
                    arr = np.asarray(ids, dtype=np.int64)
                    if len(arr):
                        local_max = max(local_max, int(arr.max()))
                    entries.append((t0 + t, chain_no, prev, inp, out, arr, tt, where))
                    prev = len(entries) - 1
                chain_max.append(local_max)
            # each (sub-)session's ids move into a private range
            bases = np.zeros(len(chain_max), dtype=np.int64)
            for c, m in enumerate(chain_max):
                bases[c] = next_id
                next_id += m + 1
            yield n, count, [
                (arr_t, prev, inp, out, ids + bases[chain_no], tt, where)
                for arr_t, chain_no, prev, inp, out, ids, tt, where in entries
            ]
            count += 1
            stats["sessions"] = count


def _session_records(path: Path, rows: _Rows):
    """A single upstream session object (possibly pretty-printed over many lines), or one
    session per line, read line by line so a large file is never held whole."""
    with _open_text(path) as fh:
        head: list[str] = []
        for line in fh:
            head.append(line)
            if line.strip():
                break
        try:
            first = json.loads(head[-1]) if head else None
        except json.JSONDecodeError:
            first = None
        if isinstance(first, dict) or not head:
            yield from _parse_lines(_chain(head, fh), rows)  # JSON lines
            return
        text = "".join(head) + fh.read()
    try:
        rec = json.loads(text)
    except json.JSONDecodeError:
        rec = None
    if isinstance(rec, dict):
        yield 1, rec
        return
    yield from _parse_lines(text.splitlines(), rows)


def _chain(head: list[str], rest: Any) -> Iterator[str]:
    yield from head
    yield from rest


def _csv_columns(path: Path, columns: tuple[str, ...]) -> tuple[list[int], int, list[str]]:
    """Positions of the required `columns` in a CSV header, the header width, and the body
    lines (line n of the file is body[n - 2])."""
    _check_file(path)
    with _open_text(path) as fh:
        header = fh.readline()
        body = fh.read().splitlines()
    names = [h.strip() for h in header.strip().split(",")]
    for c in columns:
        if c not in names:
            raise TraceError(f"{path}: line 1: column {c} is missing from the header")
    return [names.index(c) for c in columns], len(names), body


def _csv_records(body: list[str], width: int, rows: _Rows):
    """(line number, fields) of every non-blank body line with the header's width."""
    for k, text in enumerate(body):
        if not text.strip():
            continue
        parts = text.split(",")
        if len(parts) != width:
            rows.bad(k + 2, f"row has {len(parts)} fields, header has {width}")
            continue
        yield k + 2, parts


@FORMATS.register("azure")
class AzureFormat:
    """Azure LLM inference 2023 CSV: `TIMESTAMP` (datetime, 7 fractional digits),
    `ContextTokens`, `GeneratedTokens`. No hash ids; `block_size` is recorded as 16 (the
    engine block) only so the trace is valid. `arrival_s` is relative to the first row."""

    block_size = 16
    columns = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")

    def load(self, path: Path, skip_bad_rows: bool = False) -> Trace:
        (ti, ci, gi), width, body = _csv_columns(path, self.columns)
        rows = _Rows(path, skip_bad_rows, self.block_size, hashes_required=False)
        for n, parts in _csv_records(body, width, rows):
            ts = _parse_datetime(parts[ti].strip())
            if ts is None:
                rows.bad(n, f"TIMESTAMP is not a datetime: {parts[ti].strip()!r}")
                continue
            lengths = []
            for idx, name in ((ci, "ContextTokens"), (gi, "GeneratedTokens")):
                s = parts[idx].strip()
                if not s:
                    rows.bad(n, f"{name} is missing")
                    break
                try:
                    v = int(s)
                except ValueError:
                    rows.bad(n, f"{name} must be an integer, got {s!r}")
                    break
                if v < 0:
                    rows.bad(n, f"{name} must be >= 0, got {v}")
                    break
                lengths.append(v)
            if len(lengths) == 2:
                rows.add(n, ts, lengths[0], lengths[1], [])
        if not rows.line:
            raise TraceError(f"{path}: no data rows")
        _, trace = rows.finish()
        trace.arrival_s = trace.arrival_s - trace.arrival_s[0]
        trace.source = str(path)
        return trace


@FORMATS.register("vidur")
class VidurFormat:
    """Vidur's processed trace CSV (`data/processed_traces/*.csv` of microsoft/vidur):
    `arrived_at` (s from the trace start), `num_prefill_tokens`, `num_decode_tokens`. No hash
    ids. Read as Vidur's trace-replay generator reads it at scale factor 1: lengths are
    integers and a length of 0 counts as 1 (vidur/request_generator/
    trace_replay_request_generator.py clips both at 1); clipping prompt + output to a model
    length is `workload.max_tokens`. Arrival times are kept as they are."""

    block_size = 16
    columns = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")

    def load(self, path: Path, skip_bad_rows: bool = False) -> Trace:
        (ti, pi, di), width, body = _csv_columns(path, self.columns)
        rows = _Rows(path, skip_bad_rows, self.block_size, hashes_required=False,
                     names=("num_prefill_tokens", "num_decode_tokens"))
        for n, parts in _csv_records(body, width, rows):
            rec: dict[str, Any] = {}
            for idx, name in ((ti, "arrived_at"), (pi, "num_prefill_tokens"), (di, "num_decode_tokens")):
                s = parts[idx].strip()
                try:
                    rec[name] = float(s) if s else None
                except ValueError:
                    rec[name] = s
            ts = rows.number(rec, "arrived_at", n)
            if ts is None:
                continue
            prompt = rows.length(rec, "num_prefill_tokens", n)
            output = None if prompt is None else rows.length(rec, "num_decode_tokens", n)
            if output is not None:
                rows.add(n, ts, max(1, prompt), max(1, output), [])
        if not rows.line:
            raise TraceError(f"{path}: no data rows")
        _, trace = rows.finish()
        trace.source = str(path)
        return trace


def _json_values(fh: io.TextIOBase, path: Path) -> Iterator[tuple[int, int, Any]]:
    """(1-based line, 0-based index, value) of each value of a JSON array, or of JSON
    values one after another (JSON lines), read a megabyte at a time: the whole ShareGPT
    file (600+ MB) is never one string. Bad JSON syntax stops the read (no resynchronizing
    inside an array), whatever `skip_bad_rows` says."""
    decoder = json.JSONDecoder()
    buf, pos, line, index = "", 0, 1, 0
    eof, started, array = False, False, False

    def more() -> bool:
        nonlocal buf, pos, eof
        chunk = fh.read(max(1 << 20, len(buf) - pos))  # doubles while one value is cut off
        eof = not chunk
        buf, pos = buf[pos:] + chunk, 0
        return not eof

    while True:
        while True:  # skip separators
            while pos < len(buf) and buf[pos] in " \t\r\n,":
                line += buf[pos] == "\n"
                pos += 1
            if pos < len(buf) or not more():
                break
        if pos >= len(buf):
            if array:
                raise TraceError(f"{path}: line {line}: the JSON list is not closed (no ']')")
            return
        if not started:
            started = True
            if buf[pos] == "[":
                array = True
                pos += 1
                continue
        if array and buf[pos] == "]":
            return
        while True:
            try:
                value, end = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError as exc:
                if not eof and more():
                    continue
                at = line + buf.count("\n", pos, exc.pos)
                raise TraceError(f"{path}: line {at}: not valid JSON ({exc.msg} at column {exc.colno})") from None
            if end == len(buf) and not isinstance(value, dict | list) and not eof and more():
                continue  # a bare number may go on in the next chunk
            break
        yield line, index, value
        line += buf.count("\n", pos, end)
        pos = end
        index += 1


@FORMATS.register("sharegpt")
class ShareGPTFormat(ShareGPTOptions):
    """ShareGPT conversations (a JSON list, or JSON lines, of `{"conversations": [{"from",
    "value"}, ...]}`), sampled as vLLM's benchmarks do; see `lmsim.workload.sharegpt` for
    the mapping and `ShareGPTOptions` for the parameters. Errors name the entry's line and
    index (`line 12: entry 3: conversations[1] needs ...`)."""

    def load(self, path: Path, skip_bad_rows: bool = False) -> Trace:
        _check_file(path)
        rows = _Rows(path, skip_bad_rows, self.block_size, hashes_required=False)
        with _open_text(path) as fh:
            conversations, short = read_conversations(_json_values(fh, path), rows.bad, first_only=self.turns == "first")
        trace = conversations_to_trace(conversations, self, source=str(path), too_short=short)
        trace.meta["skipped_rows"] = str(rows.skipped)
        return trace


_EPOCH = np.datetime64("2020-01-01T00:00:00", "s")


def _parse_datetime(s: str) -> float | None:
    """Seconds since 2020-01-01 (a near epoch keeps sub-microsecond float precision) of 'YYYY-MM-DD HH:MM:SS[.fffffff]'. Parsed by hand because
    `%f` accepts at most 6 fractional digits and Azure writes 7."""
    main, _, frac = s.partition(".")
    try:
        whole = np.datetime64(main.replace(" ", "T"), "s")
    except ValueError:
        return None
    if frac and not frac.isdigit():
        return None
    return float((whole - _EPOCH).astype(np.int64)) + (int(frac) / 10 ** len(frac) if frac else 0.0)


def infer_format(path: Path) -> str:
    """The format of a file from its name or first record; TraceError if unclear."""
    if path.suffix == ".parquet":
        return "canonical"
    _check_file(path)
    with _open_text(path) as fh:
        try:
            head = fh.read(4096)
        except (UnicodeDecodeError, OSError):
            head = ""
    first = head.lstrip().split("\n", 1)[0]
    if first.replace(" ", "").startswith("TIMESTAMP,"):
        return "azure"
    if first.replace(" ", "").startswith("arrived_at,"):
        return "vidur"
    keys = set()
    if first.startswith("{"):
        for key in ("chat_id", "hash_id_scope", "requests", "timestamp", "hash_ids"):
            if f'"{key}"' in first or f'"{key}"' in head:
                keys.add(key)
    if '"conversations"' in head and head.lstrip()[:1] in ("[", "{"):
        return "sharegpt"
    if "chat_id" in keys:
        return "bailian"
    if "hash_id_scope" in keys or "requests" in keys:
        return "claude_code"
    if "timestamp" in keys and "hash_ids" in keys:
        return "mooncake"
    raise TraceError(
        f"{path}: cannot tell the trace format from its content; pass --format "
        f"({', '.join(FORMATS.names())})"
    )


def load_trace(
    path: str | os.PathLike[str], *, format: str | None = None, skip_bad_rows: bool = False,
    progress: bool = False, params: dict[str, Any] | None = None,
) -> Trace:
    """Load any supported trace into the canonical format (`progress`: a bar of the bytes
    read on stderr, when it is a terminal; `params`: the format's parameters, which only
    `sharegpt` has)."""
    path = Path(path)
    try:
        name = format or infer_format(path)
        loader = FORMATS.create(name, params, where=f"format {name}")
        token = _PROGRESS.set(progress)
        try:
            return loader.load(path, skip_bad_rows)
        finally:
            _PROGRESS.reset(token)
    except UnicodeDecodeError:
        # binary garbage (or another encoding) in a text format: one line, not a traceback
        raise TraceError(f"{path}: not UTF-8 text") from None
    except (EOFError, gzip.BadGzipFile, zlib.error):
        raise TraceError(f"{path}: corrupt or truncated gzip file") from None
