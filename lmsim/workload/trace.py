"""The canonical trace: one row per request, stored column-wise.

In memory a `Trace` is a set of numpy arrays (no per-request Python objects), so a
million-request trace costs tens of bytes per request plus its block ids. On disk it is a
Parquet file with one row per request:

| column          | type          | meaning                                                        |
|-----------------|---------------|----------------------------------------------------------------|
| `arrival_s`     | float64       | arrival time, seconds from trace start, non-decreasing         |
| `input_tokens`  | int64         | prompt length in tokens (>= 1)                                 |
| `output_tokens` | int64         | tokens to generate (>= 1)                                      |
| `hash_ids`      | list<int64>   | chained prefix-block ids, one per `block_size` tokens; equal   |
|                 |               | ids in two requests mean equal content up to that block       |
| `session_id`    | int64         | conversation or agent session, -1 if unknown                   |
| `parent_id`     | int64         | row index of the previous turn, -1 if none                     |
| `class_id`      | int64         | explicit request class (hotspot detector), -1 if none          |
| `slo_class`     | int64         | SLO class (multi-SLO routing), -1 if none                      |
| `after_id`      | int64         | closed loop: arrive `delay_s` after row `after_id` finishes    |
| `delay_s`       | float64       | think time used with `after_id`                                |
| `stage`         | int64         | load stage of a benchmark ladder (`lmsim.engine.stages`), -1   |
| `prompt_text`   | dict<string>  | the prompt as text, where the workload has one (else absent)   |

The Parquet schema metadata carries `block_size` (tokens per hash id) and `source`.
`stage` and `prompt_text` are written only when the trace has them. In memory the text is
`prompt_texts` (each distinct prompt once) indexed by the `text_id` column, so a benchmark
that sends a few hundred prompts thousands of times holds each string once; on disk it is
a dictionary-encoded string column.

Generated tokens are named by the continuation: a request's output occupies the positions
after its prompt, and the row that continues it (`continuation_rows`) names those
positions' blocks with its own ids. So a generator or converter that re-sends a turn's
answer in the next turn must give the next turn ids that begin with the turn's full-block
ids and then name the answer's blocks; a row that merely shares a prefix must not look
like a continuation (single-turn rows carry their own `session_id`). Blocks no row names
get a synthetic name of their own in the engine (`lmsim.engine.block_names`).
A row whose `after_id` is -1 arrives at `arrival_s`; otherwise `arrival_s` is only its
open-loop estimate, and the simulator releases it `delay_s` after `after_id` finishes.
Rows are in arrival order; ties keep file order.
"""

from __future__ import annotations

import os
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lmsim.errors import TraceError
from lmsim.outputs import atomic_path

OPTIONAL_INT_COLUMNS = ("session_id", "parent_id", "class_id", "slo_class", "after_id")
# Written to Parquet only when present, so traces without them keep their files and digests.
EXTRA_INT_COLUMNS = ("stage", "text_id")


@dataclass
class Trace:
    arrival_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    hash_offsets: np.ndarray  # len n+1; ids of row i are hash_values[off[i]:off[i+1]]
    hash_values: np.ndarray
    block_size: int
    session_id: np.ndarray | None = None
    parent_id: np.ndarray | None = None
    class_id: np.ndarray | None = None
    slo_class: np.ndarray | None = None
    after_id: np.ndarray | None = None
    delay_s: np.ndarray | None = None
    stage: np.ndarray | None = None
    text_id: np.ndarray | None = None  # index into prompt_texts, -1: no text
    prompt_texts: tuple[str, ...] = ()
    source: str = ""
    meta: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        self.arrival_s = np.ascontiguousarray(self.arrival_s, dtype=np.float64)
        self.input_tokens = np.ascontiguousarray(self.input_tokens, dtype=np.int64)
        self.output_tokens = np.ascontiguousarray(self.output_tokens, dtype=np.int64)
        self.hash_offsets = np.ascontiguousarray(self.hash_offsets, dtype=np.int64)
        # int32 as `compact()` or a generator made it (memory); int64 otherwise
        ids_dtype = np.int32 if np.asarray(self.hash_values).dtype == np.int32 else np.int64
        self.hash_values = np.ascontiguousarray(self.hash_values, dtype=ids_dtype)
        self.prompt_texts = tuple(self.prompt_texts)
        for name in (*OPTIONAL_INT_COLUMNS, *EXTRA_INT_COLUMNS, "delay_s"):
            col = getattr(self, name)
            if col is not None:
                dtype = np.float64 if name == "delay_s" else np.int64
                setattr(self, name, np.ascontiguousarray(col, dtype=dtype))
                if len(getattr(self, name)) != n:
                    raise TraceError(f"{self.source or 'trace'}: column {name} has wrong length")
        if len(self.hash_offsets) != n + 1:
            raise TraceError(f"{self.source or 'trace'}: hash offsets have wrong length")

    def __len__(self) -> int:
        return len(self.arrival_s)

    def hash_ids(self, i: int) -> np.ndarray:
        """Row i's ids, a view: int32 in a `compact()` trace, so widen before arithmetic."""
        return self.hash_values[self.hash_offsets[i] : self.hash_offsets[i + 1]]

    def compact(self) -> Trace:
        """This trace with its block ids stored as int32 when every id fits, else itself.

        Ids are the largest part of a trace (57M ids for the 1M-request agent workload:
        460 MB as int64, 230 MB as int32). Generators write compact ids directly
        (`generators.base.chained_ids`); of loaded traces only the replay path compacts
        (`study.experiment.load_workload_trace`). Ids keep their values; widen them before
        arithmetic (the engine widens each request's ids to int64 at arrival)."""
        values = self.hash_values
        if values.dtype == np.int32 or not len(values):
            return self
        info = np.iinfo(np.int32)
        if values.min() < info.min or values.max() > info.max:
            return self
        return self.replace(hash_values=values.astype(np.int32))

    def column(self, name: str) -> np.ndarray:
        """An optional column, or its default (-1, or 0.0 for delay_s) when absent."""
        col = getattr(self, name)
        if col is not None:
            return col
        if name == "delay_s":
            return np.zeros(len(self), dtype=np.float64)
        return np.full(len(self), -1, dtype=np.int64)

    def prompt_text(self, i: int) -> str:
        """Row i's prompt text, or "" when the trace carries none for it."""
        if self.text_id is None:
            return ""
        k = int(self.text_id[i])
        return self.prompt_texts[k] if k >= 0 else ""

    @property
    def is_closed_loop(self) -> bool:
        return self.after_id is not None and bool((self.after_id >= 0).any())

    # -- selection -----------------------------------------------------------------------

    def take(self, rows: np.ndarray) -> Trace:
        """A new trace of the given rows (in the given order). Row references (`parent_id`,
        `after_id`) are remapped; references to rows left out become -1."""
        rows = np.asarray(rows, dtype=np.int64)
        starts = self.hash_offsets[rows]
        ends = self.hash_offsets[rows + 1]
        lengths = ends - starts
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        if len(rows):
            idx = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])
            values = self.hash_values[idx]
        else:
            values = np.zeros(0, dtype=np.int64)
        remap = np.full(len(self), -1, dtype=np.int64)
        remap[rows] = np.arange(len(rows))

        def sub(name: str) -> np.ndarray | None:
            col = getattr(self, name)
            if col is None:
                return None
            out = col[rows]
            if name in ("parent_id", "after_id"):
                out = np.where(out >= 0, remap[np.maximum(out, 0)], -1)
            return out

        return Trace(
            arrival_s=self.arrival_s[rows],
            input_tokens=self.input_tokens[rows],
            output_tokens=self.output_tokens[rows],
            hash_offsets=offsets,
            hash_values=values,
            block_size=self.block_size,
            session_id=sub("session_id"),
            parent_id=sub("parent_id"),
            class_id=sub("class_id"),
            slo_class=sub("slo_class"),
            after_id=sub("after_id"),
            delay_s=sub("delay_s"),
            stage=sub("stage"),
            text_id=sub("text_id"),
            prompt_texts=self.prompt_texts,
            source=self.source,
            meta=dict(self.meta),
        )

    def head(self, limit: int) -> Trace:
        if limit >= len(self):
            return self.replace()
        return self.take(np.arange(limit))

    def replace(self, **columns: np.ndarray | None) -> Trace:
        """A new trace with the given columns replaced and every other column shared, not
        copied (columns are never written in place): re-timing a million-request trace
        would otherwise copy its half-gigabyte of block ids."""
        fields = {name: getattr(self, name) for name in self.__dataclass_fields__}
        fields["meta"] = dict(self.meta)
        return Trace(**{**fields, **columns})

    # -- checks --------------------------------------------------------------------------

    def validate(self) -> None:
        """Raise TraceError naming the first bad row (0-based) and field."""
        where = self.source or "trace"
        if self.block_size <= 0:
            raise TraceError(f"{where}: block_size must be positive, got {self.block_size}")
        checks = (
            ("input_tokens", self.input_tokens < 1, "must be >= 1"),
            ("output_tokens", self.output_tokens < 1, "must be >= 1"),
            ("arrival_s", ~np.isfinite(self.arrival_s) | (self.arrival_s < 0), "must be finite and >= 0"),
        )
        for name, bad, what in checks:
            if bad.any():
                row = int(np.argmax(bad))
                value = getattr(self, name)[row]
                raise TraceError(f"{where}: row {row}: {name} {what}, got {value}")
        if len(self) > 1:
            back = np.diff(self.arrival_s) < 0
            if back.any():
                row = int(np.argmax(back)) + 1
                raise TraceError(
                    f"{where}: row {row}: arrival_s goes backwards "
                    f"({self.arrival_s[row]} < {self.arrival_s[row - 1]})"
                )
        counts = np.diff(self.hash_offsets)
        lo = self.input_tokens // self.block_size
        hi = -(-self.input_tokens // self.block_size)
        bad = (counts != 0) & ((counts < lo) | (counts > hi))
        if bad.any():
            row = int(np.argmax(bad))
            raise TraceError(
                f"{where}: row {row}: hash_ids has {counts[row]} ids but input_tokens "
                f"{self.input_tokens[row]} with block_size {self.block_size} needs "
                f"{lo[row]} to {hi[row]}"
            )
        if self.after_id is not None:
            bad = self.after_id >= np.arange(len(self))
            if bad.any():
                row = int(np.argmax(bad))
                raise TraceError(f"{where}: row {row}: after_id must refer to an earlier row")

    # -- Parquet -------------------------------------------------------------------------

    def to_arrow(self) -> pa.Table:
        hash_col = pa.ListArray.from_arrays(
            pa.array(self.hash_offsets, type=pa.int64()) if len(self) else pa.array([0], pa.int64()),
            pa.array(self.hash_values.astype(np.int64, copy=False), type=pa.int64()),
        )
        columns = {
            "arrival_s": pa.array(self.arrival_s, type=pa.float64()),
            "input_tokens": pa.array(self.input_tokens, type=pa.int64()),
            "output_tokens": pa.array(self.output_tokens, type=pa.int64()),
            "hash_ids": hash_col,
        }
        for name in OPTIONAL_INT_COLUMNS:
            columns[name] = pa.array(self.column(name), type=pa.int64())
        columns["delay_s"] = pa.array(self.column("delay_s"), type=pa.float64())
        if self.stage is not None:
            columns["stage"] = pa.array(self.stage, type=pa.int64())
        if self.text_id is not None:
            ids = pa.array(self.text_id.astype(np.int32), mask=self.text_id < 0, type=pa.int32())
            columns["prompt_text"] = pa.DictionaryArray.from_arrays(ids, pa.array(self.prompt_texts, type=pa.string()))
        meta = {**self.meta, "block_size": str(self.block_size), "source": self.source}
        table = pa.table(columns)
        return table.replace_schema_metadata({k.encode(): str(v).encode() for k, v in meta.items()})

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write atomically: a temporary file in the same folder, then a rename."""
        with atomic_path(path) as tmp:
            pq.write_table(self.to_arrow(), tmp, compression="zstd")


def is_canonical_trace(path: Path) -> bool:
    """A Parquet file `Trace.save` wrote: its schema metadata carries the trace's block size
    and source (a check of the footer only; the data is not read)."""
    meta = pq.read_schema(path).metadata or {}
    return b"block_size" in meta and b"source" in meta


def read_parquet(path: str | os.PathLike[str]) -> Trace:
    """Read a canonical trace; a missing, empty or malformed file raises TraceError."""
    path = Path(path)
    if not path.exists():
        raise TraceError(f"{path}: trace file not found")
    if path.is_dir():
        raise TraceError(f"{path}: is a directory, not a Parquet trace")
    size = path.stat().st_size
    if size == 0:
        raise TraceError(f"{path}: file is empty (0 bytes), not a Parquet trace")
    # Check the magic bytes ourselves: pyarrow's wording for a non-Parquet file changes
    # between versions, and the one-line error should not.
    with open(path, "rb") as fh:
        head = fh.read(4)
        fh.seek(max(size - 4, 0))
        tail = fh.read(4)
    if size < 12 or head != b"PAR1" or tail != b"PAR1":
        raise TraceError(f"{path}: not a Parquet file (no PAR1 magic bytes)")
    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several unrelated types for corrupt files
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TraceError(f"{path}: not a readable Parquet file ({first})") from None
    meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
    for name in ("arrival_s", "input_tokens", "output_tokens", "hash_ids"):
        if name not in table.column_names:
            raise TraceError(f"{path}: missing column {name!r}")
    if "block_size" not in meta:
        raise TraceError(f"{path}: schema metadata has no block_size")
    hash_col = table.column("hash_ids").combine_chunks()
    if hash_col.null_count:
        raise TraceError(f"{path}: hash_ids has null rows; use an empty list for no hashes")
    offsets = np.asarray(hash_col.offsets, dtype=np.int64)
    values = np.asarray(hash_col.values, dtype=np.int64)
    values = values[offsets[0] : offsets[-1]]
    offsets = offsets - offsets[0]

    def opt(name: str) -> np.ndarray | None:
        if name not in table.column_names:
            return None
        col = table.column(name)
        if col.null_count:
            raise TraceError(f"{path}: column {name!r} has nulls")
        return col.to_numpy()

    def required(name: str) -> np.ndarray:
        col = table.column(name)
        if col.null_count:
            row = next(i for i, v in enumerate(col.to_pylist()) if v is None)
            raise TraceError(f"{path}: row {row}: {name} is missing")
        return col.to_numpy()

    try:
        block_size = int(meta["block_size"])
    except ValueError:
        raise TraceError(f"{path}: schema metadata block_size is not an integer") from None
    trace = Trace(
        arrival_s=required("arrival_s"),
        input_tokens=required("input_tokens"),
        output_tokens=required("output_tokens"),
        hash_offsets=offsets,
        hash_values=values,
        block_size=block_size,
        session_id=opt("session_id"),
        parent_id=opt("parent_id"),
        class_id=opt("class_id"),
        slo_class=opt("slo_class"),
        after_id=opt("after_id"),
        delay_s=opt("delay_s"),
        stage=opt("stage"),
        **_read_texts(table),
        source=str(path),
        meta={k: v for k, v in meta.items() if k not in ("block_size", "source")},
    )
    trace.validate()
    return trace


def _read_texts(table: pa.Table) -> dict[str, object]:
    """`text_id` and `prompt_texts` from a `prompt_text` column (dictionary-encoded as
    `to_arrow` writes it, or plain strings), or nothing."""
    if "prompt_text" not in table.column_names:
        return {}
    col = table.column("prompt_text").combine_chunks()
    if not pa.types.is_dictionary(col.type):
        col = col.dictionary_encode()
    ids = np.asarray(col.indices.fill_null(-1), dtype=np.int64)
    return {"text_id": ids, "prompt_texts": tuple(col.dictionary.to_pylist())}


@dataclass(frozen=True)
class Continuations:
    """Which row continues each row (`rows[r]`, -1 for none), and how each was found:
    `linked` by `after_id`/`parent_id`, `inferred` by prefix extension (a guess), and
    `refused`: rows whose only candidate was ambiguous (see `find_continuations`)."""

    rows: np.ndarray
    linked: int
    inferred: int
    refused: int


def continuation_rows(trace: Trace) -> np.ndarray:
    """For each row r, the row whose prompt continues r's prompt and output, or -1
    (`find_continuations(trace).rows`)."""
    return find_continuations(trace).rows


def find_continuations(trace: Trace) -> Continuations:
    """For each row r, the row whose prompt continues r's prompt and output, or -1.

    In order of precedence: the first row naming r as `after_id` (a closed-loop step that
    follows r), the first naming r as `parent_id` (the next turn), else a guess: the first
    later row, in the same session when r has one, whose ids extend r's full-block ids and
    go on for at least one more full block (chained ids: sharing r's last full-block id at
    its position means sharing everything before it). A candidate whose ids do not begin
    with r's full-block ids is not a continuation (its trace says the contents differ).

    The guess is refused when it is ambiguous: when the rows that hold r's last full block
    and go on past it (in r's session, when r has one) do not all go on with the same next
    block, r's content is a prefix that several conversations share (a system prompt, a
    common document) and the first row extending it is as likely another conversation's
    request as r's next turn. On the Kimi conversation trace's first 40 minutes (no
    sessions, no links) 2,971 rows had a candidate: 872 of them end their full blocks in
    the system prompt every row starts with (866 have no other full block), which the rule
    refuses with 5 more whose extensions branch; 2,094 are kept. The alternative, refusing
    a row whose last full block an earlier row already holds, kept 1,817: it also refused
    282 rows whose earlier holder is the same conversation's previous turn (same full
    blocks, a longer partial tail) and whose extensions all agree.
    """
    n = len(trace)
    out = np.full(n, -1, dtype=np.int64)
    bs = trace.block_size
    offsets = trace.hash_offsets
    lengths = np.diff(offsets)
    full = np.minimum(trace.input_tokens // bs, lengths)  # identified full trace blocks
    linked = np.zeros(n, dtype=bool)
    for name in ("parent_id", "after_id"):  # after_id wins
        col = trace.column(name)
        rows = np.flatnonzero(col >= 0)
        if not len(rows):
            continue
        first = np.full(n, n, dtype=np.int64)
        np.minimum.at(first, col[rows], rows)
        has = first < n
        out[has] = first[has]
        linked |= has
    refused = _extend_by_prefix(trace, out, linked, full)
    # a continuation whose ids contradict r's full blocks is dropped
    rows = np.flatnonzero(out >= 0)
    k = full[rows]
    cont = out[rows]
    deep = k > 0
    ok = np.ones(len(rows), dtype=bool)
    ok[deep] = (full[cont[deep]] >= k[deep]) & (
        trace.hash_values[offsets[rows[deep]] + k[deep] - 1]
        == trace.hash_values[offsets[cont[deep]] + np.minimum(k[deep], full[cont[deep]]) - 1]
    )
    out[rows[~ok]] = -1
    found = out >= 0
    num_linked = int((found & linked).sum())
    return Continuations(out, num_linked, int(found.sum()) - num_linked, refused)


def _extend_by_prefix(trace: Trace, out: np.ndarray, linked: np.ndarray, full: np.ndarray) -> int:
    """Fill `out` for the unlinked rows by prefix extension; returns how many rows had only
    an ambiguous candidate (refused)."""
    n = len(trace)
    offsets = trace.hash_offsets
    values = trace.hash_values
    session = trace.column("session_id")
    queries = np.flatnonzero(~linked & (full > 0))
    # a row that is the last of its session has no candidate
    if (session >= 0).any():
        _, dense = np.unique(session, return_inverse=True)
        last = np.full(int(dense.max()) + 1, -1, dtype=np.int64)
        np.maximum.at(last, dense, np.arange(n, dtype=np.int64))
        queries = queries[(session[queries] < 0) | (last[dense[queries]] > queries)]
    if not len(queries):
        return 0
    qid = values[offsets[queries] + full[queries] - 1]
    lengths = np.diff(offsets)
    entries = np.flatnonzero(np.isin(values, qid))
    row_of = np.repeat(np.arange(n, dtype=np.int64), lengths)[entries]
    pos = entries - offsets[row_of]
    usable = pos + 1 < full[row_of]  # at least one more full block after it
    # Candidates keyed by (id, position) for queries without a session, and by (id,
    # position, session) for queries with one: a lookup is one bisect either way. A key
    # whose candidates go on with different next blocks is ambiguous.
    open_index: dict[tuple[int, int], list[int]] = {}
    session_index: dict[tuple[int, int, int], list[int]] = {}
    next_of: dict[tuple[int, ...], int] = {}
    ambiguous: set[tuple[int, ...]] = set()
    nxt = values[entries[usable] + 1].tolist()
    for v, p, r, x in zip(values[entries][usable].tolist(), pos[usable].tolist(), row_of[usable].tolist(), nxt):
        for key, index in (((v, p), open_index), ((v, p, int(session[r])), session_index)):
            index.setdefault(key, []).append(r)
            if next_of.setdefault(key, x) != x:
                ambiguous.add(key)
    refused = 0
    for r, v in zip(queries.tolist(), qid.tolist()):
        sess = int(session[r])
        p = int(full[r]) - 1
        key = (v, p) if sess < 0 else (v, p, sess)
        rows = (open_index if sess < 0 else session_index).get(key)
        if rows:
            at = bisect_right(rows, r)
            if at < len(rows):
                if key in ambiguous:
                    refused += 1
                else:
                    out[r] = rows[at]
    return refused


def continued_ids(trace: Trace, row: int, cont: int) -> np.ndarray:
    """Trace ids of row `row`'s prompt and output: its full-block ids, then the full-block
    ids its continuation `cont` has beyond them."""
    bs = trace.block_size
    own = trace.hash_ids(row)
    k = min(int(trace.input_tokens[row]) // bs, len(own))
    nxt = trace.hash_ids(cont)
    k_next = min(int(trace.input_tokens[cont]) // bs, len(nxt))
    return np.concatenate((own[:k], nxt[k:k_next])).astype(np.int64, copy=False)


def chain_roots(parent: np.ndarray) -> np.ndarray:
    """Root row of every row's `parent_id` chain, by pointer doubling (log depth passes)."""
    root = np.where(parent >= 0, parent, np.arange(len(parent)))
    while True:
        nxt = root[root]
        if np.array_equal(nxt, root):
            return root
        root = nxt
