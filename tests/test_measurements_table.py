"""Integrity of the shipped public-measurement table, lmsim/data/profiles/measurements.csv.

The table (issue 23; schema in notes/measurements_schema.md, provenance in
lmsim/data/profiles/MEASUREMENTS.md) is what `lmsim profile check` compares predictions
against, so a malformed row would silently drop out of the check or be priced under the
wrong condition. These tests read the CSV with the standard library only (no lmsim code) and
pin: the column order, one known kind and unit per row, the columns each kind needs, unique
readable ids, a source and an https url on every row, a reason on every row marked out of
scope, positive numbers where numbers belong, a consistent parallel layout, and, for every row whose number was derived from a
published one, that the stated arithmetic ("measured = (6144+2048)/296.25 s") gives the
value in `measured`.
"""

from __future__ import annotations

import ast
import csv
import operator
import re
import statistics
from pathlib import Path

import pytest

TABLE = Path(__file__).resolve().parents[1] / "lmsim" / "data" / "profiles" / "measurements.csv"

COLUMNS = ["id", "source", "url", "gpu", "num_gpus", "tp", "model", "engine", "dtype", "kind",
           "batch", "input_tokens", "output_tokens", "context_tokens", "chunk_tokens",
           "q_heads", "kv_heads", "head_dim", "gemm_m", "gemm_n", "gemm_k",
           "measured", "unit", "condition", "scope"]
INT_COLUMNS = ["num_gpus", "tp", "batch", "input_tokens", "output_tokens", "context_tokens",
               "chunk_tokens", "q_heads", "kv_heads", "head_dim", "gemm_m", "gemm_n", "gemm_k"]
GPUS = {"h20", "h100", "h200", "h800", "a100", "l40s", "rtx5090", "a10g", "l4", "a40", "b200", "mi300x"}
DTYPES = {"bf16", "fp16", "fp8"}
ATTENTION = ("q_heads", "kv_heads", "head_dim")
# kind -> (allowed units, columns that must be filled)
KINDS = {
    "e2e_b1": ({"s"}, ("batch", "input_tokens", "output_tokens")),
    "tpot_b1": ({"ms"}, ("batch", "input_tokens")),
    "ttft_b1": ({"s", "ms"}, ("batch", "input_tokens")),
    "decode_step": ({"ms"}, ("batch", "context_tokens")),
    "prefill_throughput": ({"tok/s"}, ("batch", "input_tokens")),
    "kernel_decode_attention": ({"us", "ms"}, ("batch", "context_tokens", *ATTENTION)),
    "kernel_prefill_attention": ({"us", "ms"}, ("batch", "chunk_tokens", "context_tokens", *ATTENTION)),
    "kernel_gemm": ({"us", "ms"}, ("gemm_m", "gemm_n", "gemm_k")),
    "kernel_layer_gemms": ({"us", "ms"}, ("model", "batch")),
    "kernel_moe": ({"us", "ms"}, ("model", "batch")),
}
ONE_REQUEST_KINDS = {"e2e_b1", "tpot_b1", "ttft_b1"}
ID_PATTERN = re.compile(r"[a-z0-9][a-z0-9.\-]*")
MODEL_PATTERN = re.compile(r"[a-z0-9][a-z0-9.\-]*")


def read_table(path: Path = TABLE) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(newline="") as f:
        lines = [line for line in f if not line.startswith("#")]
    reader = csv.DictReader(lines)
    rows = list(reader)
    return list(reader.fieldnames or []), rows


@pytest.fixture(scope="module")
def table() -> tuple[list[str], list[dict[str, str]]]:
    return read_table()


@pytest.fixture(scope="module")
def rows(table) -> list[dict[str, str]]:
    return table[1]


def test_header_is_the_schema_in_order(table):
    header, rows = table
    assert header == COLUMNS
    assert all(None not in row for row in rows), "a row has more fields than the header"
    assert all(all(v is not None for v in row.values()) for row in rows), "a row has fewer fields than the header"


def test_out_of_scope_rows_say_why(rows):
    """`scope` is empty (in scope) or `out: <short label>: <why>`; the bar of `lmsim profile
    check` applies to the in-scope rows, the others are predicted and counted apart."""
    out = [r for r in rows if r["scope"]]
    assert all(re.fullmatch(r"out: [^:]{3,60}: .{40,}", r["scope"]) for r in out), \
        [r["id"] for r in out if not re.fullmatch(r"out: [^:]{3,60}: .{40,}", r["scope"])]
    assert len(out) == 38


def test_ids_are_unique_and_readable(rows):
    ids = [r["id"] for r in rows]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    assert not duplicates
    assert [i for i in ids if not ID_PATTERN.fullmatch(i)] == []


def test_every_row_cites_a_source_and_a_url(rows):
    assert [r["id"] for r in rows if not r["source"].strip()] == []
    assert [r["id"] for r in rows if not r["url"].startswith("https://")] == []
    assert [r["id"] for r in rows if not r["condition"].strip()] == []
    assert [r["id"] for r in rows if not r["engine"].strip()] == []


def test_repository_files_are_cited_at_a_fixed_commit(rows):
    # a file on a branch can change under the row; a blob (or tree) URL at a commit cannot
    blob = re.compile(r"https://github\.com/[^/]+/[^/]+/(?:blob|tree)/([^/]+)/")
    floating = [r["id"] for r in rows for m in [blob.match(r["url"])] if m and not re.fullmatch(r"[0-9a-f]{40}", m.group(1))]
    assert floating == []


def test_keys_kinds_units_and_dtypes_are_known(rows):
    assert {r["gpu"] for r in rows} <= GPUS
    assert {r["kind"] for r in rows} <= set(KINDS)
    assert {r["dtype"] for r in rows} <= DTYPES
    assert [r["id"] for r in rows if r["unit"] not in KINDS[r["kind"]][0]] == []
    assert [r["id"] for r in rows if r["model"] and not MODEL_PATTERN.fullmatch(r["model"])] == []


def test_numbers_are_numbers(rows):
    bad = []
    for r in rows:
        for col in INT_COLUMNS:
            value = r[col]
            if value and not (value.isdigit() and (int(value) > 0 or col == "context_tokens")):
                bad.append((r["id"], col, value))
        try:
            if not float(r["measured"]) > 0:
                bad.append((r["id"], "measured", r["measured"]))
        except ValueError:
            bad.append((r["id"], "measured", r["measured"]))
    assert bad == []


def test_each_kind_has_its_columns(rows):
    missing = [(r["id"], col) for r in rows for col in KINDS[r["kind"]][1] if not r[col]]
    assert missing == []


def test_one_request_rows_are_batch_one(rows):
    assert [r["id"] for r in rows if r["kind"] in ONE_REQUEST_KINDS and r["batch"] != "1"] == []


def test_parallel_layout_is_consistent(rows):
    bad = [r["id"] for r in rows
           if not (r["num_gpus"] and r["tp"]) or int(r["num_gpus"]) % int(r["tp"]) != 0]
    assert bad == []
    # grouped-query attention: every KV head serves a whole number of query heads
    gqa = [r["id"] for r in rows if r["q_heads"] and int(r["q_heads"]) % int(r["kv_heads"]) != 0]
    assert gqa == []


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _arith(expr: str) -> float:
    """Evaluate + - * / and median(...) over numbers only (the formulas conditions state)."""
    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "median"
                and node.args and not node.keywords):
            return statistics.median(ev(a) for a in node.args)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return float(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError(expr)
    return ev(ast.parse(expr, mode="eval"))


FORMULA = re.compile(r"measured = ((?:median)?[0-9.()+\-*/, ]+?) (s|ms|us|tok/s)\b")


def _derived(rows):
    return [(r, m) for r in rows for m in [FORMULA.search(r["condition"])] if m]


def test_derived_numbers_follow_their_stated_formula(rows):
    # e.g. Qwen3-8B on H20, 6144 in / 2048 out at a published 296.25 tok/s of (prompt+generated)/time:
    # (6144+2048)/296.25 = 27.6523 s, rounded to 4 decimals in the table.
    wrong = []
    for r, m in _derived(rows):
        value, unit = _arith(m.group(1)), m.group(2)
        assert unit == r["unit"], r["id"]
        if abs(value - float(r["measured"])) > 1e-4 * max(1.0, abs(value)):
            wrong.append((r["id"], value, r["measured"]))
    assert wrong == []


def test_formula_check_catches_a_wrong_number():
    good = {"id": "x", "unit": "s", "measured": "27.6523",
            "condition": "Speed 296.25 tok/s, so measured = (6144+2048)/296.25 s; more"}
    assert _arith(FORMULA.search(good["condition"]).group(1)) == pytest.approx(27.6523, abs=1e-4)
    bad = dict(good, measured="27.9")
    ((row, m),) = _derived([bad])
    assert abs(_arith(m.group(1)) - float(row["measured"])) > 1e-3
    # a median of repeated runs (aiconfigurator's collections): the middle of three by hand
    runs = {"id": "y", "unit": "ms", "measured": "2.08350",
            "condition": "three runs: measured = median(2.13629, 2.0835, 1.7611) ms"}
    assert _arith(FORMULA.search(runs["condition"]).group(1)) == pytest.approx(2.0835)


def test_reader_rejects_a_row_with_a_missing_field(tmp_path):
    broken = tmp_path / "m.csv"
    broken.write_text("# comment\n" + ",".join(COLUMNS) + "\n" + ",".join(["a"] * (len(COLUMNS) - 1)) + "\n")
    header, rows = read_table(broken)
    assert header == COLUMNS
    assert any(v is None for v in rows[0].values())
